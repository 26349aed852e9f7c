"""Which exceptions are the user's to fix, and the one line the command line prints for each.

``queryrl train | sft | eval | export`` print ``error: <one line>`` and exit 2 for a known error
(exit 3 for a run stopped because its rewards kept failing); ``--debug`` or ``QUERYRL_DEBUG=1``
shows the traceback instead. Anything else is a bug: its traceback is printed as Python prints it.

Known errors, by class:

- config: :class:`~queryrl.config.ConfigError`, a registry name that does not exist, a tool's
  configuration; a ``ValueError`` raised while the trainer builds its parts from the config;
- data: :class:`~queryrl.data.DataError` (the message names file, row, line and field);
- reward: :class:`~queryrl.rewards.RewardError` (a reward file that is missing or fails to import),
  a judge key variable that is not set, a preflight check that failed;
- plugin: :class:`~queryrl.plugins.PluginError` (a ``file.py:function``, module or plugin file named in
  the config that is missing or fails to import);
- model and checkpoint: an error (safetensors' and transformers' included; not one of the types
  that mean a bug, :data:`BUG_TYPES`) raised while ``queryrl.models`` loads a model, or while
  ``queryrl.trainer.checkpoint`` / ``queryrl.trainer.export`` reads a checkpoint: prefixed with
  ``model:`` / ``checkpoint:`` and the exception's type, followed by the file or folder it was
  reading when the message does not name it;
- checkpoint: :class:`CheckpointError` (no intact checkpoint to resume from, naming each damaged one;
  a checkpoint file that holds Python objects other than tensors and plain data); a run folder saved with
  another config is a :class:`ResumeConfigMismatch`, a config error;
- a missing file anywhere (``FileNotFoundError`` names it).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

from queryrl.config import ConfigError
from queryrl.trainer.checkpoint import CheckpointError
from queryrl.trainer.run_folder import ResumeConfigMismatch

__all__ = ["CheckpointError", "ResumeConfigMismatch", "debug_requested", "user_error"]

# the part of the package a model or checkpoint error comes from -> the word that names it
_AREAS = (
    ("queryrl.models", "model"),
    ("queryrl.trainer.checkpoint", "checkpoint"),
    ("queryrl.trainer.export", "checkpoint"),
    ("queryrl.trainer.components", "config"),
)
# a model or checkpoint error of these types is a bug in the code, not a bad file: its traceback is shown
BUG_TYPES = (AttributeError, NameError, TypeError, AssertionError, IndexError, KeyError, ZeroDivisionError)
_PATH_NAMES = ("path", "folder", "checkpoint", "src", "f")  # the locals that hold what was being read
STOPPED_EXIT_CODE = 3  # the run stopped because its rewards failed reward.max_skipped_steps steps in a row


def debug_requested() -> bool:
    """``QUERYRL_DEBUG`` is set to something other than ``''``, ``0``, ``false`` or ``no``."""
    return os.environ.get("QUERYRL_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _known_classes() -> tuple[type[BaseException], ...]:
    from queryrl.agent.tools import ToolConfigError
    from queryrl.data import DataError
    from queryrl.plugins import PluginError
    from queryrl.registry import RegistryError
    from queryrl.rewards import JudgeConfigError, RewardError
    from queryrl.trainer.preflight import PreflightError

    return (
        ConfigError,
        DataError,
        PluginError,
        RewardError,
        RegistryError,
        ToolConfigError,
        JudgeConfigError,
        PreflightError,
        CheckpointError,
    )


def _area(tb: TracebackType | None) -> tuple[str | None, str | None]:
    """The area (model, checkpoint, config) of the innermost ``queryrl`` frame of a traceback, and the
    file or folder that frame was reading (a local named as in :data:`_PATH_NAMES`), if any."""
    area, where = None, None
    while tb is not None:
        frame = tb.tb_frame
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith("queryrl."):
            area = next((name for prefix, name in _AREAS if module.startswith(prefix)), None)
            paths = (frame.f_locals.get(n) for n in _PATH_NAMES)
            where = next((str(v) for v in paths if isinstance(v, str | Path) and str(v)), None)
        tb = tb.tb_next
    return area, where


def user_error(exc: BaseException) -> tuple[str, int] | None:
    """(the one-line message, the exit code) of a known error; None for anything else (a bug)."""
    from queryrl.trainer.skips import RewardsFailing

    text = str(exc) or type(exc).__name__
    if isinstance(exc, RewardsFailing):
        return text, STOPPED_EXIT_CODE
    if isinstance(exc, _known_classes()):
        return text, 2
    area, where = (None, None) if isinstance(exc, BUG_TYPES) else _area(exc.__traceback__)
    if area == "config" and isinstance(exc, ValueError):
        return text, 2
    if area in ("model", "checkpoint"):
        at = f" (reading {where})" if where and where not in text else ""
        return f"{area}: {type(exc).__name__}: {text}{at}", 2
    if isinstance(exc, FileNotFoundError):
        return text, 2
    return None
