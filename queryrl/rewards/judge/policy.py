"""The judge client's policies: what is retried, how a failed call reads, which request settings are valid.

Retried: HTTP 408, 409, 429, 5xx, timeouts and connection errors. Never retried: every other 4xx (the
request itself is wrong: a parameter the model refuses, the key, the model name; a retry would be another
paid call with the same answer) and :class:`JudgeConfigError` (a missing key variable), even when the SDK
wraps it. A failed call reads as OpenAI's own ``error.message``, its ``param`` and ``code``, and a hint
naming the judge setting to change (:func:`server_message`).

How :class:`~.judge.JudgeClient` applies it: a retryable failure is re-sent up to ``max_retries`` times
(``timeout_s`` per attempt, the whole attempt) after :class:`Backoff`'s wait; a refused request is sent once
(each retry would be a paid call) and remembered for :data:`~.memory.REFUSAL_TTL_S`, so the same request
again (a reward manager retrying the sample) gets the same failure unpaid. A call that still fails, a reply
with no JSON object and a JSON object that fails the schema give ``verdict=None`` with ``error`` starting
``"call failed"``, ``"unparseable verdict"`` or ``"schema-invalid verdict"``; a failed call's error carries
the server's message, ``param`` and ``code`` (e.g. ``HTTP 400: Unsupported value: 'temperature' does not
support 0.0 with this model. ... [param=temperature, code=unsupported_value]``) and the hint. An
unparseable reply is not re-asked. A missing key raises :class:`JudgeConfigError`, never retried (it names
the variable, never a value). A failure is logged as a warning the first time its text appears, then at
debug level (a refused setting fails every sample alike).
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState

if TYPE_CHECKING:
    import openai

TOKEN_LIMIT_PARAMS = ("max_completion_tokens", "max_tokens")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
RETRYABLE_4XX = (408, 409, 429)  # request timeout, conflict (lock contention), rate limit: worth a retry


class JudgeConfigError(RuntimeError):
    """The judge cannot be called as configured (e.g. the API key variable is not set)."""


class JudgeUnavailable(RuntimeError):
    """:meth:`~.client.JudgeClient.check` failed: the service does not answer, refuses the key or the settings."""


def is_retryable(error: BaseException) -> bool:
    import openai

    if config_error(error) is not None:
        return False
    if isinstance(error, openai.APIStatusError):
        return error.status_code in RETRYABLE_4XX or error.status_code >= 500
    return isinstance(error, openai.APIConnectionError | TimeoutError)  # APITimeoutError is a connection error


def is_client_error(error: BaseException) -> bool:
    """A 4xx that is not retried: the request itself is wrong (a setting, the key, the model name)."""
    import openai

    return (
        isinstance(error, openai.APIStatusError)
        and 400 <= error.status_code < 500
        and error.status_code not in RETRYABLE_4XX
    )


def config_error(error: BaseException | None) -> JudgeConfigError | None:
    """The :class:`JudgeConfigError` behind `error` (the SDK may wrap what the key provider raised)."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, JudgeConfigError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


# OpenAI answers a wrong key with "Incorrect API key provided: sk-ab***...wxyz.": a piece of the secret
_ECHOED_KEY = re.compile(r"(Incorrect API key provided: )\S+")
# the setting a user changes when the server names a parameter it rejects
_PARAM_HINTS = {
    "temperature": "leave the judge's temperature unset (null): this model accepts only its default",
    "max_tokens": "set the judge's token_limit_param to max_completion_tokens",
    "max_completion_tokens": "set the judge's token_limit_param to max_tokens (an older server)",
    "reasoning_effort": "change or unset the judge's reasoning_effort",
}


def scrub_echoed_key(text: str) -> str:
    """`text` without the piece of a wrong key that OpenAI echoes ("Incorrect API key provided: sk-ab***wxyz")."""
    return _ECHOED_KEY.sub(r"\1<redacted>", text)


def server_message(error: openai.APIStatusError) -> str:
    """OpenAI's ``error.message`` (without the SDK's "Error code: N - " prefix), its param and code, and a hint."""
    body: Any = error.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]  # a server that nests it where the SDK did not look
    message = body.get("message") if isinstance(body, dict) else None
    text = message if isinstance(message, str) else error.message
    param = body.get("param") if isinstance(body, dict) else None
    code = body.get("code") if isinstance(body, dict) else None
    details = ", ".join(f"{k}={v}" for k, v in (("param", param), ("code", code)) if isinstance(v, str) and v)
    if details:
        text += f" [{details}]"
    hint = _PARAM_HINTS.get(param) if isinstance(param, str) else None
    if hint is None and isinstance(code, str) and code in ("unsupported_parameter", "unsupported_value"):
        hint = f"remove {param!r} from the judge's extra_body" if param else None
    if hint is None and isinstance(message, str) and message.startswith("Unrecognized request argument"):
        hint = "remove it from the judge's extra_body"
    return f"{text} (hint: {hint})" if hint else text


def check_settings(
    temperature: float | None,
    max_tokens: int | None,
    token_limit_param: str,
    reasoning_effort: str | None,
    extra_body: dict[str, Any] | None,
) -> None:
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise ValueError(f"judge temperature must be in [0, 2] or None (not sent), got {temperature}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"judge max_tokens must be >= 1 or None (not sent), got {max_tokens}")
    if token_limit_param not in TOKEN_LIMIT_PARAMS:
        raise ValueError(f"judge token_limit_param must be one of {TOKEN_LIMIT_PARAMS}, got {token_limit_param!r}")
    if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
        raise ValueError(
            f"judge reasoning_effort must be one of {', '.join(REASONING_EFFORTS)} or None, got {reasoning_effort!r}"
        )
    if extra_body is not None and not isinstance(extra_body, dict):
        raise ValueError(f"judge extra_body must be a JSON object (dict), got {type(extra_body).__name__}")


def retry_after_s(error: BaseException | None) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), if the error has them."""
    import openai

    if not isinstance(error, openai.APIStatusError):
        return None
    headers = error.response.headers
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            return max(0.0, float(ms) / 1000)
        if (value := headers.get("retry-after")) is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (ValueError, TypeError, OverflowError):
        return None


@dataclass(frozen=True)
class Backoff:
    """The wait before a retry: the n-th waits uniform(b/2, b) with ``b = min(max_s, base_s * 2**(n-1))``; a
    server's ``Retry-After`` / ``retry-after-ms`` (capped at `retry_after_max_s`) replaces it."""

    base_s: float = 0.5
    max_s: float = 8.0
    retry_after_max_s: float = 30.0

    def wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        after = retry_after_s(error)
        if after is not None:
            return min(after, self.retry_after_max_s)
        cap = min(self.max_s, self.base_s * 2 ** (state.attempt_number - 1))
        return random.uniform(cap / 2, cap)


def describe_error(error: BaseException | None, timeout_s: float) -> str:
    """One line for a failed call: the HTTP status and the server's message, a timeout, a connection error."""
    import openai

    if isinstance(error, openai.APIStatusError):
        return f"HTTP {error.status_code}: {server_message(error)}"
    if isinstance(error, openai.APITimeoutError | TimeoutError):
        return f"timed out after {timeout_s:g} s"
    if isinstance(error, openai.APIConnectionError):
        return f"connection error: {error.__cause__ or error}"
    return f"{type(error).__name__}: {error}"


def closest_names(name: str, known: list[str]) -> str:
    """``"; did you mean 'a' or 'b'? (judge.model=a)"``: the names in `known` closest to `name`, or ``""``."""
    import difflib

    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    if not close:
        return ""
    names = " or ".join(repr(by_lower[c]) for c in close)
    return f"; did you mean {names}? (judge.model={by_lower[close[0]]})"
