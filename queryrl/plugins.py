"""Code named in a config: ``path/to/file.py:function``, ``package.module:function``, or a file to import.

Reward functions (``reward.function.path`` / ``name``), tool implementations (a tools file's
``implementation``), judge functions (``queryrl serve-judge --judge``) and agent plugins are all
found here, so they accept the same spellings and fail with the same messages:

- ``file.py:function``: the file is imported as a module of its own (:func:`import_file`); a
  relative path is looked up beside the file that named it first (`base`), then from the
  current folder;
- ``package.module:function``: imported normally (``importlib.import_module``); a target is a
  module when it does not end in ``.py``, is not an existing file, and every dotted part is an
  identifier;
- a built-in name, for the callers that have built-ins.

Every error is a :class:`PluginError` (a ``ValueError``) whose message starts with what was being
loaded and the spec as written, e.g. ``judge 'my_judge.py:judge': file '/abs/my_judge.py' not found``.

Only the standard library is imported here: every layer may use it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

SPELLINGS = "'path/to/file.py:function' or 'package.module:function'"


class PluginError(ValueError):
    """A file, module or function named in a config that cannot be found, imported or called."""


def file_module_name(file: Path) -> str:
    """The ``sys.modules`` name :func:`import_file` gives `file`: unique to its path, so two files called
    ``reward.py`` never clash (the ``queryrl_reward_`` prefix is the one reward files always had)."""
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in file.stem)
    return f"queryrl_reward_{stem}_{digest}"


def import_file(file: Path, what: str) -> ModuleType:
    """Import a .py file as a module of its own, registered in ``sys.modules`` under
    :func:`file_module_name` (so dataclasses and pickling by reference work inside it).

    Args:
        file: the resolved path of the file.
        what: what the file is, for error messages (e.g. ``"agent plugin file"``).

    Raises:
        PluginError: the file is missing, is not a .py file, or fails to import (the message carries
            the original error's type and text).
    """
    if not file.is_file():
        raise PluginError(f"{what} {str(file)!r} {not_a_file(file)}")
    module_name = file_module_name(file)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise PluginError(f"{what} {str(file)!r} cannot be imported: it must be a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # SyntaxError, ImportError, anything the file raises at import
        sys.modules.pop(module_name, None)
        raise PluginError(f"{what} {str(file)!r} failed to import: {type(e).__name__}: {e}") from e
    return module


def not_a_file(path: Path) -> str:
    """Why `path` cannot be read as a file, in words: ``is a folder, not a file``, ``is not a regular file``
    (a device, a socket, a pipe) or ``not found``."""
    if path.is_dir():
        return "is a folder, not a file"
    return "is not a regular file" if path.exists() else "not found"


def _file_of(target: str, base: Path | None) -> Path | None:
    """The file `target` names (looked up beside `base` first), or None when it names a module."""
    path = Path(target).expanduser()
    if not path.is_absolute() and base is not None and (base / path).is_file():
        return base / path
    if target.endswith(".py") or path.is_file() or not all(part.isidentifier() for part in target.split(".")):
        return path
    return None


def _import_module(target: str, prefix: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name is not None and (target == e.name or target.startswith(e.name + ".")):  # it, or a parent
            raise PluginError(
                f"{prefix}: cannot import module {target!r}: no such file, and no importable module {e.name!r}; "
                "give a .py file path or an importable dotted module name"
            ) from e
        raise PluginError(f"{prefix}: module {target!r} failed to import: {type(e).__name__}: {e}") from e
    except (Exception, SystemExit) as e:  # anything the module raises at import
        raise PluginError(f"{prefix}: module {target!r} failed to import: {type(e).__name__}: {e}") from e


def load_callable(
    spec: str,
    *,
    what: str,
    builtins: Mapping[str, Callable[..., Any]] | None = None,
    base: Path | None = None,
    hint: str = "",
) -> Callable[..., Any]:
    """The function `spec` names: a key of `builtins`, ``path/to/file.py:function`` or ``package.module:function``.

    Args:
        spec: what the config says.
        what: what the function is for, the start of every error message (e.g. ``"judge"``).
        builtins: name -> function, looked up first.
        base: the folder of the file that named `spec`: a relative ``.py`` path is looked up there first.
        hint: appended to the message when the function is missing (e.g. which setting names it).

    Raises:
        PluginError: `spec` is neither a built-in nor one of the two spellings; the file is missing or
            fails to import; the module is not found or fails to import; it has no attribute of that
            name (the message lists the callables it has), or the attribute is not callable.
    """
    if builtins is not None and spec in builtins:
        return builtins[spec]
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        known = f"a built-in ({', '.join(sorted(builtins))}), " if builtins else ""
        raise PluginError(f"unknown {what} {spec!r}: use {known}{SPELLINGS}")
    prefix = f"{what} {spec!r}"
    path = _file_of(target, base)
    if path is None:
        module, where = _import_module(target, prefix), f"module {target!r}"
    else:
        file = path.resolve()
        if not file.is_file():
            raise PluginError(f"{prefix}: file {target!r} {not_a_file(file)} (looked at {file})")
        module, where = import_file(file, f"{prefix}: file"), f"file {str(file)!r}"
    if not hasattr(module, attr):
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        more = f"; {hint}" if hint else ""
        raise PluginError(
            f"{prefix}: {where} has no {attr!r}; callables it defines: {', '.join(public) or '(none)'}{more}"
        )
    fn: Callable[..., Any] = getattr(module, attr)
    if not callable(fn):
        raise PluginError(f"{prefix}: {attr!r} in {where} is a {type(fn).__name__}, not a function")
    return fn
