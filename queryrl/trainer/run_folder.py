"""What a run does with the folder of an earlier run of the same name: continue it, or set it aside.

``<output_dir>/<experiment_name>/`` holds one run. When a run starts there:

- ``trainer.resume=auto`` continues the folder's newest intact checkpoint (:func:`select_checkpoint`
  verifies each against its manifest) only when the folder's ``config.yaml`` matches the new config on every
  key that changes training (keys that may differ are :data:`MAY_DIFFER`) and the training files are the
  ones the checkpoint trained on (size and sha256, :func:`data_differences`). Otherwise it refuses with one
  message naming the differing keys or files and the ways out (:class:`ResumeConfigMismatch`). A folder
  with a config but no checkpoint (the earlier run stopped before its first save) has nothing to
  continue: its files are set aside and the run starts at step 0, whatever its config was.
- ``trainer.resume=disable`` starts over: the earlier run's files are set aside.
- ``trainer.resume=PATH`` continues from that checkpoint with the new config (no config check: it
  was asked for by name); the folder's earlier run files are set aside, so checkpoints of an
  abandoned future are never picked up later.

"Set aside" means moved, never deleted, into ``previous/<time>/`` inside the run folder; only the
run's own files move (:data:`RUN_FILES`), so e.g. ``queryrl sft``'s ``sft/`` folder stays.
The checks read only: they run before the model loads, and the moves happen once it has loaded.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from queryrl.application import load_apps
from queryrl.config import ConfigError, build_schema, redacted
from queryrl.redaction import redact
from queryrl.trainer import checkpoint as ckpt
from queryrl.trainer.checkpoint import CheckpointError

RUN_FILES = ("config.yaml", "metrics.jsonl", "tensorboard", "samples", "plots", "checkpoints", "vocab_ids.json")
PREVIOUS = "previous"
# Keys whose value may change between a run and its resume (a key, or a prefix ending in "."):
# they say how long to train, what to log, validate and keep, and where things run or live, never
# what a step computes from the data it is given.
MAY_DIFFER = (
    "trainer.total_steps",  # extend (or end sooner) a run; a decaying lr schedule follows the new length
    "trainer.total_epochs",  # the same, in epochs
    "trainer.resume",  # how this run starts
    "trainer.resume_legacy",  # whether checkpoints without a manifest are accepted
    "trainer.output_dir",  # the same folder may be spelled differently (relative, absolute)
    "trainer.experiment_name",
    "trainer.project_name",  # the wandb project / mlflow experiment the metrics go to
    "trainer.logger",
    "trainer.log_every",
    "trainer.plot",
    "trainer.save_samples",
    "trainer.eval_every",  # validation is read-only on the policy
    "trainer.eval_before_train",
    "trainer.save_every",
    "trainer.keep_last",
    "trainer.save_last",
    "trainer.num_threads",  # speed only
    "trainer.malloc_mmap_threshold_mb",  # speed only
    "trainer.preflight",  # a check before step 1
    "reward.max_skipped_steps",  # when to give up, not how to score
    # where the services live and how patiently they are called (a restarted server gets a new port);
    # which judge model, rubric and retriever answer is not in this list
    "reward.timeout_s",
    "reward.max_retries",
    "reward.max_concurrency",
    "reward.requests_per_minute",
    # and each application's resume_may_differ (e.g. where its services live)
    "data.val_files",
    "data.val_batch_size",
    "data.max_val_samples",
    "rollout.val.",
    "model.cache_dir",  # where the built-in tiny model is cached
    "ray.address",
    "ray.call_timeout_s",
    "ray.collective_timeout_s",
    "sft.",  # queryrl sft's settings; an RL run never reads them
)
_MAX_LISTED = 8


class ResumeConfigMismatch(ConfigError):
    """``trainer.resume=auto`` found a run folder saved with a config that differs on what training depends on."""


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out |= _flat(value, f"{prefix}{key}.")
        return out
    return {prefix[:-1]: node}


def _may_differ(key: str) -> bool:
    keys = MAY_DIFFER + tuple(k for app in load_apps() for k in app.resume_may_differ)
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in keys)


def config_differences(old: Mapping[str, Any], new: DictConfig) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for each key, outside :data:`MAY_DIFFER`, that differs.

    `old` is a saved ``config.yaml`` (secrets already redacted, as in the new one). A key the old
    file lacks (it was written by an older queryrl) matches when the new value is the schema's default;
    a key the new schema lacks is ignored (nothing reads it any more).
    """
    before, after = _flat(old), _flat(redacted(new))
    defaults = _flat(OmegaConf.to_container(build_schema(), resolve=True))
    missing = object()
    diffs = []
    for key, value in after.items():
        if _may_differ(key):
            continue
        was = before.get(key, defaults.get(key, missing))
        if was != value:
            diffs.append((key, "(absent)" if was is missing else was, value))
    return diffs


def _short(value: Any) -> str:
    text = redact(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def mismatch_message(run: Path, config_yaml: Path, diffs: list[tuple[str, Any, Any]], what: str = "config") -> str:
    """The one line that refuses to mix two runs: what differs (at most 8 keys, or data files, listed), and the
    ways out."""
    listed = ", ".join(f"{k} {_short(a)} -> {_short(b)}" for k, a, b in diffs[:_MAX_LISTED])
    more = f" and {len(diffs) - _MAX_LISTED} more" if len(diffs) > _MAX_LISTED else ""
    things = ("key", "keys") if what == "config" else ("training file", "training files")
    return (
        f"{config_yaml}: trainer.resume=auto would continue the run in {run}, which was trained with "
        f"{'a different config' if what == 'config' else 'other data'} ({len(diffs)} "
        f"{things[len(diffs) != 1]} {'differ' if len(diffs) != 1 else 'differs'}: {listed}{more}); "
        "to keep the two runs apart, use a new trainer.experiment_name, or trainer.resume=disable to start "
        f"over (the earlier run's files are moved to {run / PREVIOUS}/), or trainer.resume=PATH to continue "
        "from that checkpoint with the new config"
    )


def read_config_yaml(path: Path) -> dict[str, Any]:
    """A run's saved ``config.yaml`` as plain data ({} when it holds no mapping).

    Raises:
        ConfigError: the file is not UTF-8 YAML (one line naming it, where, and the ways out).
    """
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        if isinstance(err, UnicodeDecodeError):
            why = f"byte {err.object[err.start]:#04x} at offset {err.start} is not UTF-8"
        else:
            why = str(getattr(err, "problem", None) or type(err).__name__)
        raise ConfigError(
            f"{path}: the saved config of the run in this folder is not readable YAML{where} ({why}); restore "
            "it, or start over with trainer.resume=disable (the earlier run's files are moved aside), or use "
            "a new trainer.experiment_name"
        ) from None
    return loaded if isinstance(loaded, dict) else {}


def _saved_config(run_dir: Path, newest: Path | None) -> tuple[Path, dict[str, Any]] | None:
    """The earlier run's config: ``config.yaml``, else the one its newest checkpoint carries."""
    path = run_dir / "config.yaml"
    if path.is_file():
        return path, read_config_yaml(path)
    if newest is not None and (newest / "state.json").is_file():
        saved = json.loads((newest / "state.json").read_text(encoding="utf-8")).get("config")
        if isinstance(saved, dict):
            return newest / "state.json", saved
    return None


@dataclass
class ResumePlan:
    """What :func:`plan_resume` decided; :meth:`apply` carries it out once the run may write files."""

    run_dir: Path
    checkpoint: Path | None = None  # the checkpoint to continue from
    set_aside: bool = False  # move the earlier run's files to previous/<time>/
    damaged: list[Path] = field(default_factory=list)  # damaged checkpoints newer than `checkpoint`

    def apply(self) -> Path | None:
        """Clean what killed runs left, set files aside as planned; returns the checkpoint to load."""
        root = self.run_dir / "checkpoints"
        ckpt.clean_leftovers(root)
        for folder in self.damaged:  # kept for a look, never picked again as the newest
            kept = folder.with_name(f"{folder.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
            folder.rename(kept)
            warn(f"the damaged checkpoint {folder} was renamed {kept.name} (kept for a look; delete it when done)")
        if not self.set_aside:
            return self.checkpoint
        moved_to = set_aside(self.run_dir)
        if moved_to is None or self.checkpoint is None:
            return self.checkpoint
        folder, run = self.checkpoint.absolute(), self.run_dir.absolute()
        if folder.is_relative_to(run / "checkpoints"):  # it moved with the rest
            return moved_to / folder.relative_to(run)
        return self.checkpoint


def set_aside(run_dir: Path) -> Path | None:
    """Move the run files (:data:`RUN_FILES`) of `run_dir` into ``previous/<time>/``; None if there are none."""
    present = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    if not present:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = run_dir / PREVIOUS / stamp, 1
    while target.exists():
        target, n = run_dir / PREVIOUS / f"{stamp}-{n}", n + 1
    target.mkdir(parents=True)
    for path in present:
        path.rename(target / path.name)
    ckpt.fsync_path(run_dir)
    warn(f"{run_dir} held an earlier run that this one does not continue: its files were moved to {target}")
    return target


def warn(message: str) -> None:
    """One line on stderr (not Python's two-line warning format), secrets redacted."""
    print(f"warning: {redact(message)}", file=sys.stderr, flush=True)


def _has_run_files(run_dir: Path) -> bool:
    """Whether `run_dir` holds files of an earlier run (leftover temporary folders alone do not count)."""
    names = [n for n in RUN_FILES if n != "checkpoints" and (run_dir / n).exists()]
    return bool(names or ckpt.checkpoint_dirs(run_dir / "checkpoints"))


def plan_resume(run_dir: Path, cfg: DictConfig) -> ResumePlan:
    """Decide how a run with `cfg` starts in `run_dir` (reads only; see the module docstring).

    Raises:
        ResumeConfigMismatch: ``resume=auto``, a checkpoint exists and the configs differ.
        CheckpointError: checkpoints exist and none is intact, or ``resume=PATH`` names a damaged one.
        FileNotFoundError: ``resume=PATH`` is not a checkpoint.
    """
    mode = str(cfg.trainer.resume)
    has_files = _has_run_files(run_dir)
    if mode == "disable":
        return ResumePlan(run_dir, set_aside=has_files)
    if mode != "auto":
        folder = Path(mode)
        ckpt.require_checkpoint(folder)
        problem = ckpt.verify(folder, bool(cfg.trainer.resume_legacy))
        if problem is not None:
            raise CheckpointError(f"checkpoint {folder} is damaged ({problem})")
        return ResumePlan(run_dir, checkpoint=folder, set_aside=has_files)
    newest, damaged = ckpt.select_checkpoint(run_dir / "checkpoints", warn, bool(cfg.trainer.resume_legacy))
    if newest is None:  # nothing trained to continue: start over, the earlier files kept aside
        return ResumePlan(run_dir, set_aside=has_files)
    saved = _saved_config(run_dir, newest)
    if saved is not None and (diffs := config_differences(saved[1], cfg)):
        raise ResumeConfigMismatch(mismatch_message(run_dir, saved[0], diffs))
    if diffs := data_differences(newest, train_data_paths(cfg)):
        raise ResumeConfigMismatch(mismatch_message(run_dir, newest / "state.json", diffs, what="data"))
    return ResumePlan(run_dir, checkpoint=newest, damaged=damaged)


def train_data_paths(cfg: DictConfig) -> list[str]:
    """The training files as the trainer reads them (a ``builtin://`` dataset: its generated file)."""
    from queryrl.data.builtin import resolve_data_path

    return [resolve_data_path(str(f), cfg.model.cache_dir) for f in cfg.data.train_files]


def data_differences(checkpoint: Path, paths: list[str]) -> list[tuple[str, Any, Any]]:
    """(file, then, now) for each training file whose size or sha256 differs from what `checkpoint` trained on
    (its ``state.json``'s ``data``; a checkpoint without it, from before fingerprints, is not checked)."""
    state = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))
    then = state.get("data")
    if not isinstance(then, dict):
        return []
    now = ckpt.data_fingerprints(paths)

    def short(entry: Any) -> str:
        return "(absent)" if not entry else f"{entry['size']} bytes, sha256 {entry['sha256'][:12]}"

    return [
        (p, short(then.get(p)), short(now.get(p))) for p in sorted(set(then) | set(now)) if then.get(p) != now.get(p)
    ]
