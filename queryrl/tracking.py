"""Experiment tracking: one ``Tracker`` fans each step's metrics out to the chosen backends.

Backends by name: ``console`` (a rich progress bar on a terminal, a plain line every few steps
elsewhere), ``jsonl`` (``run_dir/metrics.jsonl``), ``tensorboard`` (``run_dir/tensorboard``),
``wandb`` and ``mlflow`` (optional packages, imported only when asked for).

On resume (``start_step=k``) the jsonl and TensorBoard records of steps after ``k`` are dropped:
they came from the run that crashed after its last checkpoint and will be logged again.
"""

from __future__ import annotations

import importlib
import json
import math
import numbers
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from queryrl.atomic import atomic_write_text
from queryrl.redaction import RedactingStream, redact, redact_data
from queryrl.registry import Registry

DEFAULT_CONSOLE_KEYS: tuple[str, ...] = (
    "critic/score/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "response_length/mean",
    "timing_s/step",
    # the judge's spend and failures this step (present only when an LLM judge is used; cost only with prices)
    "judge/prompt_tokens",
    "judge/completion_tokens",
    "judge/reasoning_tokens",
    "judge/cost",
    "judge/failed",
)
# Short labels for the console; any other key is shown as itself.
_SHORT_NAMES = {
    "critic/score/mean": "score",
    "actor/pg_loss": "pg_loss",
    "actor/kl_loss": "kl_loss",
    "actor/entropy": "entropy",
    "response_length/mean": "resp_len",
    "timing_s/step": "step_s",
    "judge/prompt_tokens": "judge_in",
    "judge/completion_tokens": "judge_out",
    "judge/reasoning_tokens": "judge_reasoning",
    "judge/cost": "judge_cost",
    "judge/failed": "judge_failed",
}


def _to_float(value: Any) -> float | None:
    """``value`` as a float (NaN/inf kept), or None if it is not a real number.

    Accepts Python and NumPy scalars and one-element tensors/arrays (anything with ``.item()``).
    """
    if hasattr(value, "item") and not isinstance(value, numbers.Number):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    return float(value) if isinstance(value, numbers.Real) else None


def as_finite(value: Any) -> float | None:
    """``value`` as a finite float, or None if it is not a number or is NaN/inf."""
    x = _to_float(value)
    return x if x is not None and math.isfinite(x) else None


class _Backend(Protocol):
    """A logger backend; one may also have ``mark_failed()``, called before ``close()`` when the run raised."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class _ConsoleBackend:
    """A live rich progress bar on a terminal; plain progress lines, every few steps, when stdout is not one.

    Without a terminal (CI, ``nohup``, output sent to a file) a line is printed for the first step logged,
    then once at least ``max(1, total_steps // 20)`` steps have passed since the last line, and for the last
    step: about 20 lines for a whole run, whatever its length (and whatever ``trainer.log_every`` is).
    """

    LINES_PER_RUN = 20

    def __init__(self, total_steps: int, start_step: int, keys: tuple[str, ...]) -> None:
        self.total, self.start_step, self.keys = total_steps, start_step, keys
        self.t0 = time.monotonic()
        self.every = max(1, total_steps // self.LINES_PER_RUN)
        self.last_printed: int | None = None  # the step of the last plain line
        isatty = getattr(sys.stdout, "isatty", None)
        self.progress: Any = None
        if callable(isatty) and isatty():
            from rich import progress as rp

            columns: list[rp.ProgressColumn] = [rp.TextColumn("[bold]step"), rp.MofNCompleteColumn()]
            columns += [rp.BarColumn(bar_width=20), rp.TimeElapsedColumn(), rp.TextColumn("eta")]
            columns += [rp.TimeRemainingColumn(), rp.TextColumn("{task.fields[numbers]}")]
            self.progress = rp.Progress(*columns)
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step, numbers="")
            self.progress.start()

    def _numbers(self, metrics: Mapping[str, Any]) -> str:
        parts = []
        for key in self.keys:
            if (value := _to_float(metrics.get(key))) is not None:  # NaN shown: it must be seen
                whole = key.endswith("_tokens") and value.is_integer()  # 123456, not 1.235e+05
                parts.append(f"{_SHORT_NAMES.get(key, key)}={int(value) if whole else format(value, '.4g')}")
        return " ".join(parts)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        numbers_ = self._numbers(metrics)
        if self.progress is not None:
            self.progress.update(self.task, completed=step, numbers=numbers_)
            return
        due = self.last_printed is None or step - self.last_printed >= self.every or step >= self.total
        if not due:
            return
        self.last_printed = step
        elapsed = time.monotonic() - self.t0
        done = step - self.start_step
        eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
        eta_s = _fmt_duration(eta) if math.isfinite(eta) else "?"
        print(f"step {step}/{self.total} | {_fmt_duration(elapsed)} eta {eta_s} | {numbers_}".rstrip(" |"), flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def decoded_lines(path: Path) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of each non-blank line of `path`; the text is None for a line that is not UTF-8 (a
    torn write, a stray byte): a reader drops that line, not the file."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if raw.strip():
                try:
                    yield lineno, raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError:
                    yield lineno, None


class _JsonlBackend:
    """``run_dir/metrics.jsonl``: one ``{"step": s, ...}`` object per step, flushed and fsynced each write."""

    def __init__(self, run_dir: Path, start_step: int) -> None:
        self.path = run_dir / "metrics.jsonl"
        if self.path.exists():
            self._truncate_after(start_step)
        self.file = self.path.open("a", encoding="utf-8")

    def _truncate_after(self, start_step: int) -> None:
        """Drop records with step > ``start_step`` (and a torn last line), atomically."""
        kept = []
        for lineno, line in decoded_lines(self.path):
            try:
                step = json.loads(line)["step"] if line is not None else None
            except (json.JSONDecodeError, KeyError, TypeError):
                step = None
            if not isinstance(step, int):
                what = "not UTF-8" if line is None else "not a JSON object with an integer step"
                warnings.warn(f"{self.path}: line {lineno} is unreadable ({what}); dropped", stacklevel=3)
            elif step <= start_step:
                kept.append(f"{line}\n")
        atomic_write_text(self.path, "".join(kept))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        # Non-numeric values are dropped; NaN/inf become null (strict JSON has no NaN).
        record: dict[str, Any] = {"step": step}
        record.update({k: as_finite(v) for k, v in metrics.items() if _to_float(v) is not None})
        self.file.write(json.dumps(record, allow_nan=False) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())  # on disk before the step's checkpoint is renamed into place

    def close(self) -> None:
        self.file.close()


class _TensorBoardBackend:
    """Scalars in ``run_dir/tensorboard``; on resume, events after ``start_step`` are purged."""

    def __init__(self, run_dir: Path, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # TensorBoard hides the events of earlier files in this folder from ``purge_step`` on.
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in metrics.items():
            if (x := as_finite(value)) is not None:
                self.writer.add_scalar(key, x, global_step=step)
        self.writer.flush()  # steps are slow; a crash should not lose the last ones

    def close(self) -> None:
        self.writer.close()


def _import_optional(package: str) -> ModuleType:
    try:
        return importlib.import_module(package)
    except ImportError as err:
        raise ImportError(f"the '{package}' logger needs {package}: pip install {package}") from err


class _WandbBackend:
    """A wandb run in ``run_dir/wandb`` (``WANDB_MODE=offline`` keeps it there; ``wandb sync`` uploads it later).

    wandb copies what the process prints into the run (``output.log``) by patching the ``write`` of the
    ``sys.stdout``/``sys.stderr`` it found at import, and its copy sees the text before any redaction there;
    while the run is open a :class:`~queryrl.redaction.RedactingStream` sits on top, so the copy sees it redacted.
    """

    def __init__(self, run_dir: Path, project: str, experiment: str, config: dict[str, Any]) -> None:
        wandb = _import_optional("wandb")
        self.run = wandb.init(project=project, name=experiment, config=config, dir=str(run_dir))
        self.failed = False
        self.streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
        self.wrappers = (sys.stdout, sys.stderr)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def mark_failed(self) -> None:
        self.failed = True

    def close(self) -> None:
        # streams put back only if nobody replaced them since (then the extra redacting layer stays: harmless)
        if sys.stdout is self.wrappers[0]:
            sys.stdout = self.streams[0]
        if sys.stderr is self.wrappers[1]:
            sys.stderr = self.streams[1]
        self.run.finish(exit_code=1 if self.failed else 0)


_MLFLOW_BAD_CHARS = re.compile(r"[^\w\-. :/]")  # mlflow names allow alnum, _ - . space : /


def mlflow_name(key: str) -> str:
    """``key`` with the characters mlflow rejects in metric/param names replaced by ``_``."""
    return _MLFLOW_BAD_CHARS.sub("_", key)


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level with dotted keys: ``{"a": {"b": 1}} -> {"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, name + "."))
        else:
            flat[name] = value
    return flat


class _MlflowBackend:
    """An mlflow run in the experiment ``project`` of the tracking URI (``MLFLOW_TRACKING_URI``); config as params."""

    _PARAM_BATCH, _PARAM_MAX_LEN = 100, 6000  # mlflow limits per log_params call / per value

    def __init__(self, project: str, experiment: str, config: dict[str, Any]) -> None:
        self.mlflow = _import_optional("mlflow")
        self.mlflow.set_experiment(project)
        self.mlflow.start_run(run_name=experiment)
        self.failed = False
        params = {mlflow_name(k): str(v)[: self._PARAM_MAX_LEN] for k, v in flatten_config(config).items()}
        items = list(params.items())
        for i in range(0, len(items), self._PARAM_BATCH):
            self.mlflow.log_params(dict(items[i : i + self._PARAM_BATCH]))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        clean = {mlflow_name(k): x for k, v in metrics.items() if (x := as_finite(v)) is not None}
        if clean:
            self.mlflow.log_metrics(clean, step=step)

    def mark_failed(self) -> None:
        self.failed = True

    def close(self) -> None:
        self.mlflow.end_run(status="FAILED" if self.failed else "FINISHED")


@dataclass(frozen=True)
class TrackerContext:
    """What a logger backend may need: where the run lives, its names, its (redacted) config, its steps."""

    run_dir: Path
    project: str
    experiment: str
    config: dict[str, Any]
    total_steps: int
    start_step: int
    console_keys: tuple[str, ...]


# ``trainer.logger`` names -> backends; a plugin may register more (``TRACKERS.register("name")(factory)``)
TRACKERS: Registry[Callable[[TrackerContext], _Backend]] = Registry("logger")
TRACKERS.register("console")(lambda c: _ConsoleBackend(c.total_steps, c.start_step, c.console_keys))
TRACKERS.register("jsonl")(lambda c: _JsonlBackend(c.run_dir, c.start_step))
TRACKERS.register("tensorboard")(lambda c: _TensorBoardBackend(c.run_dir, c.start_step))
TRACKERS.register("wandb")(lambda c: _WandbBackend(c.run_dir, c.project, c.experiment, c.config))
TRACKERS.register("mlflow")(lambda c: _MlflowBackend(c.project, c.experiment, c.config))
VALID_LOGGERS: tuple[str, ...] = tuple(TRACKERS.names())


class Tracker:
    """Sends each step's metrics to every chosen backend.

    Args:
        run_dir: the run's folder (created if missing); files are written inside it.
        loggers: backend names, a subset of :data:`VALID_LOGGERS`.
        project: the wandb project / mlflow experiment.
        experiment: the run's name.
        config: the resolved, secret-redacted config (sent to wandb/mlflow as-is).
        total_steps: the number of training steps, for the console progress and ETA.
        start_step: the last step already done (resume); records after it are dropped.
        console_keys: the metrics the console shows, in order, when present.

    Raises:
        ValueError: an unknown logger name.
        ImportError: ``wandb``/``mlflow`` asked for but not installed.

    Example:
        >>> with Tracker(run_dir, ["console", "jsonl"], "p", "e", {}, total_steps=10) as tracker:
        ...     tracker.log({"critic/score/mean": 0.5}, step=1)
    """

    def __init__(
        self,
        run_dir: Path,
        loggers: list[str],
        project: str,
        experiment: str,
        config: dict[str, Any],
        total_steps: int,
        start_step: int = 0,
        console_keys: tuple[str, ...] = DEFAULT_CONSOLE_KEYS,
    ) -> None:
        config = redact_data(config)  # sent to wandb / mlflow: no secret value, whatever its field
        unknown = [name for name in loggers if name not in TRACKERS]
        if unknown:
            raise ValueError(f"unknown logger(s) {unknown}; valid: {', '.join(TRACKERS.names())}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.backends: list[_Backend] = []
        try:
            context = TrackerContext(self.run_dir, project, experiment, config, total_steps, start_step, console_keys)
            for name in dict.fromkeys(loggers):  # de-duplicated, in order
                self.backends.append(TRACKERS.get(name)(context))
        except BaseException:
            self.close()  # do not leave the backends already opened dangling
            raise

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record one step's metrics in every backend (a secret in a metric's name is redacted)."""
        metrics = {redact(k): v for k, v in metrics.items()}
        for backend in self.backends:
            backend.log(metrics, step)

    def close(self, failed: bool = False) -> None:
        """Flush and close every backend (safe to call twice).

        Args:
            failed: the run ended with an exception; wandb and mlflow record it as failed, not finished.
        """
        backends, self.backends = self.backends, []
        for backend in backends:
            if failed and (mark_failed := getattr(backend, "mark_failed", None)) is not None:
                mark_failed()
            try:
                backend.close()
            except Exception as err:  # one failing backend must not keep the others open
                warnings.warn(f"closing {type(backend).__name__} failed: {err!r}", stacklevel=2)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self.close(failed=exc_type is not None)
