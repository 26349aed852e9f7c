"""Secret values never reach the console, a log line, a sample file or a metric name in clear.

The config names its secrets by the environment variables holding them (``judge.api_key_env``,
``rag.reference_api_key_env``, ``reward.kwargs.judge_api_key_env``, ...: any key ending in
``api_key_env``, ``apikey_env``, ``token_env``, ``secret_env`` or ``password_env``).
:func:`register_config_secrets` reads those variables and remembers their VALUES; from then on
:func:`redact` replaces each value, wherever it appears in a text (an error a server echoed back, a
judge's reply quoted in a warning, a prompt), with ``<redacted>``. Matching is by value, not by field
name, so a key echoed inside any message is caught.

Where it applies:

- every logging record of the process (a log-record factory: the formatted message is redacted);
- every warning (``warnings.formatwarning`` is wrapped);
- ``queryrl``'s own console: :func:`install_console` wraps ``sys.stdout`` / ``sys.stderr`` (the CLI
  calls it), so tracebacks (``--debug``), progress lines and error messages are redacted too;
- the run's files the trainer writes: ``samples/step_N.jsonl``, metric names (values are numbers).

Limits: values shorter than :data:`MIN_SECRET_CHARS` characters are not registered (redacting every
``"abc"`` would garble the output); output written by other processes (Ray workers, spawned reward
workers) or straight to file descriptor 2 by C code does not pass through this process's streams.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Mapping
from typing import Any, TextIO

PLACEHOLDER = "<redacted>"
MIN_SECRET_CHARS = 6
SECRET_ENV_KEY = re.compile(r"(api_?key|token|secret|password)_env$", re.IGNORECASE)

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()  # longest first, so a secret containing another is replaced whole
_hooks_installed = False


def add_secret(value: str | None) -> bool:
    """Remember `value` as a secret (True if it was added; too short or empty values are not)."""
    global _secrets
    if not value or len(value) < MIN_SECRET_CHARS:
        return False
    if value in _secrets:  # the judge registers its key at every request: the common case is cheap
        return True
    with _lock:
        if value not in _secrets:
            _secrets = tuple(sorted({*_secrets, value}, key=len, reverse=True))
    _install_hooks()
    return True


def clear_secrets() -> None:
    """Forget every secret (tests)."""
    global _secrets
    with _lock:
        _secrets = ()


def secret_env_names(config: Any) -> list[str]:
    """The environment variable names the config points to as secrets (keys matching :data:`SECRET_ENV_KEY`)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(config, DictConfig | ListConfig):
        config = OmegaConf.to_container(config, resolve=False)
    names: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if isinstance(value, str) and value and SECRET_ENV_KEY.search(str(key)):
                    names.append(value)
                else:
                    walk(value)
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item)

    walk(config)
    return list(dict.fromkeys(names))


def register_config_secrets(config: Any) -> list[str]:
    """Read the secret variables the config names and remember their values; returns the names that were set."""
    names = [name for name in secret_env_names(config) if os.environ.get(name)]
    for name in names:
        add_secret(os.environ[name])
    return names


def redact(text: str) -> str:
    """`text` with every registered secret value replaced by :data:`PLACEHOLDER`."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, PLACEHOLDER)
    return text


def redact_data(value: Any) -> Any:
    """A copy of `value` (dicts, lists, tuples, strings; other values as they are) with secrets redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact_data(k): redact_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_data(v) for v in value)
    return value


class RedactingStream:
    """A text stream that redacts what is written and passes everything else to the stream it wraps."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text) if _secrets else text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, flush, buffer, ...
        return getattr(self._stream, name)


def install_console() -> None:
    """Redact ``sys.stdout`` and ``sys.stderr`` of this process from now on (idempotent)."""
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)
    _install_hooks()


def _redact_arg(value: Any) -> Any:
    """A log argument with secrets redacted: a string in place, a container item by item, any other value kept
    unless its text holds a secret (then the redacted text)."""
    if isinstance(value, str | Mapping | list | tuple):
        return redact_data(value)
    try:
        text = str(value)
    except Exception:  # a value whose __str__ fails is logged as logging would log it
        return value
    clean = redact(text)
    return value if clean == text else clean


def redact_record(record: logging.LogRecord) -> None:
    """Redact a log record in place, keeping its shape: ``msg`` redacted, and each of ``args`` (a tuple stays a
    tuple of as many items, a mapping a mapping), so a formatter that unpacks ``args`` (uvicorn's access log
    unpacks five) still can. Setting ``args`` to None broke such a line into a 40-line "Logging error"."""
    try:
        message = record.getMessage()
    except Exception:  # a malformed record: logging reports it itself
        return
    if redact(message) == message:
        return
    if isinstance(record.msg, str):
        record.msg = redact(record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(_redact_arg(a) for a in record.args)
    elif isinstance(record.args, Mapping):
        record.args = {k: _redact_arg(v) for k, v in record.args.items()}
    try:
        leaked = redact(record.getMessage()) != record.getMessage()
    except Exception:  # a format that no longer fits its arguments
        leaked = True
    if leaked:  # a secret split between the format and its arguments: the text alone, redacted
        record.msg, record.args = redact(message), ()


def _install_hooks() -> None:
    """Log records and warnings are redacted where they are made, whatever handler prints them."""
    global _hooks_installed
    with _lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    make_record = logging.getLogRecordFactory()

    def redacting_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        if _secrets:
            redact_record(record)
        return record

    logging.setLogRecordFactory(redacting_record)
    format_warning = warnings.formatwarning

    def redacting_format(*args: Any, **kwargs: Any) -> str:
        return redact(format_warning(*args, **kwargs))

    warnings.formatwarning = redacting_format
