"""Checkpoints: everything needed to continue a run exactly, written so that a crash loses none.

``checkpoints/step_N/`` holds ``actor/`` (a Hugging Face folder: full weights, or the LoRA
adapter), ``critic/`` when there is one, ``optim.pt`` (optimizers and schedulers),
``rng.pt`` (python, numpy, torch and CUDA generator states), ``state.json`` (step, data-loader
position, KL coefficient) and, written last, ``manifest.json`` (each file's size and sha256).

Crash safety, step by step:

- a checkpoint is written into ``.tmp-step_N``; every file and folder in it is fsynced, then the
  manifest, then it is renamed to ``step_N`` and the parent folder fsynced: a kill at any point
  leaves either no ``step_N`` or a complete one;
- the trainer writes the step's metrics row between writing and renaming (:class:`Pending`), so
  a kill right after the rename cannot lose that row;
- pruning beyond ``keep_last`` first renames ``step_N`` to ``.trash-step_N-<pid>``, then deletes
  it: a kill mid-delete leaves a trash folder, never a half ``step_N``. Trash and temporary folders
  are never counted as checkpoints and are removed when a run starts (:func:`clean_leftovers`);
- resume verifies the manifest (:func:`verify`, :mod:`queryrl.trainer.manifest`: its shape, every listed file,
  and no file it does not list) and falls back to the newest intact checkpoint; the weights loaded are exactly
  the files the model folder names (:func:`weight_files`), a stray ``*.safetensors`` beside them is refused;
- ``optim.pt`` and ``rng.pt`` are read with ``torch.load(weights_only=True)``: a checkpoint from
  elsewhere can hold tensors and plain data, never code that runs on load.

With LoRA, ``actor/`` holds the adapters only (peft's ``save_pretrained``) and ``optim.pt`` the
AdamW state of the adapters only (the optimizer is built over the trainable parameters): the
frozen base is the ``model.path`` the saved config names, which resume and ``queryrl export``
load again. Each checkpoint's size is reported (:func:`report_size`).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from queryrl.atomic import readable_as_umask
from queryrl.models.vocab import VOCAB_FILE, vocab_json
from queryrl.trainer.manifest import LEGACY_HINT as LEGACY_HINT  # re-exported: the manifest is part of the API
from queryrl.trainer.manifest import MANIFEST as MANIFEST
from queryrl.trainer.manifest import data_fingerprints as data_fingerprints
from queryrl.trainer.manifest import sha256_of as sha256_of
from queryrl.trainer.manifest import verify as verify
from queryrl.trainer.manifest import write_manifest as write_manifest


class CheckpointError(Exception):
    """A checkpoint that cannot be used: none intact to resume from, or one holding code (its message names it)."""


_STEP_DIR = re.compile(r"^step_(\d+)$")
TMP_PREFIX, TRASH_PREFIX = ".tmp-", ".trash-"


def crash_point(name: str, step: int) -> None:
    """A test hook: ``QUERYRL_CRASH_AT=<name>@<step>`` kills this process (SIGKILL) here.

    The crash tests use it to kill a real run at an exact point (between the checkpoint's rename
    and the next write, mid-prune, ...); in a normal run the variable is unset and this does nothing.
    """
    if os.environ.get("QUERYRL_CRASH_AT") == f"{name}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)


# --- durable writes ------------------------------------------------------------------------------


def fsync_path(path: Path) -> None:
    """Flush `path` (a file or a folder's entries) to disk: a rename is only as durable as what it names."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then every folder, deepest first."""
    dirs = [folder]
    for path in folder.rglob("*"):
        if path.is_dir():
            dirs.append(path)
        else:
            fsync_path(path)
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_path(d)


# --- RNG and weights -------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """The global generators' states as tensors and plain data (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002 - the global state user code draws from
    state: dict[str, Any] = {
        "python": random.getstate(),
        # numpy's key array as an int64 tensor: a numpy array would need numpy's unpickler on load
        "numpy": (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    keys = np.asarray(keys.numpy() if isinstance(keys, torch.Tensor) else keys, dtype=np.uint32)
    random.setstate(state["python"])
    np.random.set_state((kind, keys, pos, has_gauss, gauss))  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model(model: nn.Module, out: Path, tokenizer: Any = None) -> None:
    """A Hugging Face folder (``save_pretrained``) of `model` (a peft model saves its adapter)."""
    model.save_pretrained(out)  # type: ignore[operator]
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    readable_as_umask(out)  # safetensors writes 0600


WEIGHTS_INDEX = "model.safetensors.index.json"  # what a sharded save_pretrained writes beside its shards


def weight_files(folder: Path) -> list[Path]:
    """The weights files a Hugging Face folder written by :func:`save_model` names, and no others.

    A peft adapter's ``adapter_model.safetensors``; else the shards a ``model.safetensors.index.json`` maps
    tensors to; else ``model.safetensors``; else the folder's only ``*.safetensors``. Any other
    ``*.safetensors`` beside them (e.g. an older step's weights copied in) is refused, never merged.

    Raises:
        FileNotFoundError: no weights.
        CheckpointError: a weights file the folder's own files do not name, or an unreadable index.
    """
    present = sorted(folder.glob("*.safetensors"))
    index = folder / WEIGHTS_INDEX
    if (folder / "adapter_model.safetensors").is_file():
        chosen = [folder / "adapter_model.safetensors"]
    elif index.is_file():
        try:
            names = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
            chosen = sorted({folder / n for n in names if isinstance(n, str) and Path(n).name == n})
        except (ValueError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{index}: not a safetensors index (a weight_map of tensor -> file)") from None
        if not chosen:
            raise CheckpointError(f"{index}: its weight_map names no weights file in {folder}")
    elif (folder / "model.safetensors").is_file():
        chosen = [folder / "model.safetensors"]
    elif len(present) == 1:
        chosen = present
    elif present:
        shown = ", ".join(p.name for p in present[:4])
        raise CheckpointError(f"{folder}: several weights files ({shown}) and no {WEIGHTS_INDEX} naming them")
    else:
        raise FileNotFoundError(f"no weights (*.safetensors) in {folder}")
    stray = [p for p in present if p not in chosen]
    if stray:
        raise CheckpointError(
            f"{stray[0]}: a weights file that the model's own files ({', '.join(p.name for p in chosen[:3])}) do "
            "not name; refusing to merge it into the model (remove it)"
        )
    return chosen


def load_model_weights(model: nn.Module, folder: Path) -> None:
    """Load weights saved by :func:`save_model` into `model` in place: exactly :func:`weight_files`."""
    from safetensors.torch import load_file

    files = weight_files(folder)
    if files[0].name == "adapter_model.safetensors":
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(files[0]))
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"{files[0]}: unexpected adapter keys {unexpected[:5]}")
        return
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(getattr(model, "config", None), "tie_word_embeddings", False) else set()
    really_missing = [k for k in missing if k not in tied]
    if really_missing or unexpected:
        raise RuntimeError(f"{folder}: missing weights {really_missing[:5]}, unexpected {unexpected[:5]}")


def load_critic_weights(critic: Any, folder: Path) -> None:
    """Load a checkpoint's ``critic/`` (what :meth:`~.ValueModel.save_pretrained` wrote: the backbone's weights
    under its own names and ``value_head.pt``) into `critic` in place."""
    head = folder / "value_head.pt"
    if not head.is_file():
        raise FileNotFoundError(f"{folder}: no value_head.pt (the critic's value head)")
    load_model_weights(critic.backbone, folder)
    critic.value_head.load_state_dict(torch.load(head, map_location="cpu", weights_only=True))


def safe_load(path: Path) -> Any:
    """``torch.load`` that accepts tensors and plain data only (``weights_only=True``).

    Checkpoints written before rng.pt held plain data have numpy's MT19937 key array in it; the
    numpy globals that rebuild an array (data, never code) are allowed for that.
    """
    allowed: list[Any] = [np.ndarray, np.dtype, np.dtypes.UInt32DType]
    allowed.append(np._core.multiarray._reconstruct)  # type: ignore[attr-defined]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        what = str(err).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
        raise CheckpointError(
            f"{path}: refused to load: it holds Python objects, not only tensors and plain data ({what}); "
            "a checkpoint from an untrusted source could run code when loaded"
        ) from None


# --- folders -----------------------------------------------------------------------------------------


def step_of(folder: Path) -> int:
    m = _STEP_DIR.match(folder.name)
    if m is None:
        raise ValueError(f"{folder} is not a step_N folder")
    return int(m.group(1))


def checkpoint_dirs(root: Path) -> list[Path]:
    """``root/step_N`` folders, oldest first (temporary and trash folders never count)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def _trash(folder: Path) -> Path:
    """Rename `folder` to a trash name in the same place (atomic), fsync the parent, return the new name."""
    trash = folder.with_name(f"{TRASH_PREFIX}{folder.name}-{os.getpid()}")
    shutil.rmtree(trash, ignore_errors=True)
    folder.rename(trash)
    fsync_path(folder.parent)
    return trash


def clean_leftovers(root: Path) -> list[str]:
    """Delete what a killed run left in `root` (temporary and trash folders); returns their names."""
    if not root.is_dir():
        return []
    left = [p for p in root.iterdir() if p.name.startswith((TMP_PREFIX, TRASH_PREFIX))]
    for p in left:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return sorted(p.name for p in left)


def prune(root: Path, newest: int, keep_last: int) -> None:
    """Keep `keep_last` checkpoints up to step `newest` (0 = all); each pruned one goes to trash first.

    Only checkpoints older than `newest` are candidates, so the one just written is never pruned.
    """
    if keep_last <= 0:
        return
    older = [d for d in checkpoint_dirs(root) if step_of(d) < newest]
    for old in older[: max(len(older) - (keep_last - 1), 0)]:
        trash = _trash(old)
        crash_point("prune", newest)
        shutil.rmtree(trash)


# --- choosing one ------------------------------------------------------------------------------------


def select_checkpoint(root: Path, warn: Any, allow_unhashed: bool = False) -> tuple[Path | None, list[Path]]:
    """The newest intact checkpoint under `root` and the damaged ones newer than it.

    Each damaged checkpoint gets one `warn` line naming it and what is wrong. `allow_unhashed`: see :func:`verify`.

    Raises:
        CheckpointError: there are checkpoints and none is intact (the message names each).
    """
    dirs = checkpoint_dirs(root)
    damaged: list[tuple[Path, str]] = []
    for folder in reversed(dirs):
        problem = verify(folder, allow_unhashed)
        if problem is None:
            if not (folder / MANIFEST).is_file():
                warn(f"checkpoint {folder} has no {MANIFEST} (written by an older queryrl): not hashed, only checked")
            return folder, [d for d, _ in damaged]
        warn(f"checkpoint {folder} is damaged ({problem}); trying an older one")
        damaged.append((folder, problem))
    if damaged:
        listed = "; ".join(f"{d.name}: {p}" for d, p in damaged)
        raise CheckpointError(
            f"{root}: no intact checkpoint to resume from ({listed}); remove them, or start over with "
            "trainer.resume=disable"
        )
    return None, []


# --- writing and reading ---------------------------------------------------------------------------


@dataclass
class Pending:
    """A checkpoint written and fsynced under a temporary name; :meth:`commit` makes it ``step_N``."""

    tmp: Path
    final: Path
    keep_last: int

    def commit(self) -> Path:
        """Rename into place (replacing an older ``step_N`` via trash), fsync the folder, prune."""
        root, step = self.final.parent, step_of(self.final)
        crash_point("commit", step)
        old = _trash(self.final) if self.final.exists() else None
        self.tmp.rename(self.final)
        fsync_path(root)
        crash_point("after_rename", step)
        if old is not None:
            shutil.rmtree(old)
        prune(root, step, self.keep_last)
        return self.final


def write_checkpoint(
    root: Path,
    step: int,
    models: dict[str, tuple[nn.Module, Any]],
    optim_state: dict[str, Any],
    state: dict[str, Any],
    keep_last: int,
    files: dict[str, str] | None = None,
) -> Pending:
    """Write ``root/.tmp-step_<step>`` completely (files, manifest last, all fsynced); not yet visible.

    Args:
        root: the run's ``checkpoints`` folder.
        step: the number of training steps done.
        models: name -> (module, tokenizer or None); each saved as a Hugging Face folder.
        optim_state: optimizer and scheduler state dicts.
        state: JSON-serialisable trainer state (step, loader position, KL coefficient, ...).
        keep_last: how many checkpoints to keep once committed (0 = all).
        files: name -> text of further files (``vocab_ids.json``).
    """
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, (module, tokenizer) in models.items():
        save_model(module, tmp / name, tokenizer)
    torch.save(optim_state, tmp / "optim.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    for name, text in (files or {}).items():
        (tmp / name).write_text(text, encoding="utf-8")
    fsync_tree(tmp)
    write_manifest(tmp)  # last: a manifest vouches for files already on disk
    fsync_path(tmp)
    crash_point("before_rename", step)
    return Pending(tmp, root / f"step_{step}", keep_last)


def folder_sizes_mb(folder: Path) -> dict[str, float]:
    """Megabytes (10^6 bytes) of each top-level entry of `folder` (``actor``, ``optim.pt``, ...)."""
    sizes: dict[str, float] = {}
    for entry in sorted(folder.iterdir()):
        files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file()]
        sizes[entry.name] = sum(f.stat().st_size for f in files) / 1e6
    return sizes


def report_size(folder: Path, echo: bool = True, name: Path | None = None) -> float:
    """The size of checkpoint `folder` in MB; with `echo`, one line on stdout (naming `name` if given)."""
    sizes = folder_sizes_mb(folder)
    total = sum(sizes.values())
    if echo:
        parts = ", ".join(f"{part} {mb:.1f}" for part, mb in sizes.items() if mb >= 0.05)
        print(f"checkpoint {name or folder}: {total:.1f} MB ({parts})", flush=True)
    return total


def require_checkpoint(folder: Path) -> None:
    """Raise FileNotFoundError unless `folder` is a queryrl checkpoint (it has a ``state.json``)."""
    if not (folder / "state.json").is_file():
        raise FileNotFoundError(f"{folder} is not a queryrl checkpoint (no state.json)")


def read_checkpoint(folder: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(state, optim_state, rng_state)`` of a checkpoint folder."""
    require_checkpoint(folder)
    state = json.loads((folder / "state.json").read_text())
    return state, safe_load(folder / "optim.pt"), safe_load(folder / "rng.pt")


def components_state(c: Any, state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(models, optimizer states, trainer state) of the trainer's components, as a checkpoint holds them."""
    models: dict[str, tuple[nn.Module, Any]] = {"actor": (c.policy.model, c.policy.tokenizer)}
    optim_state: dict[str, Any] = {"actor": c.optimizer.state_dict(), "actor_scheduler": c.scheduler.state_dict()}
    if c.critic is not None:
        models["critic"] = (c.critic, None)
        optim_state |= {"critic": c.critic_optimizer.state_dict(), "critic_scheduler": c.critic_scheduler.state_dict()}
    return models, optim_state, {"loader": c.loader.state_dict(), **state}


def write_components(c: Any, root: Path, step: int, state: dict[str, Any], keep_last: int) -> Pending:
    """Write the trainer's components (policy, critic, optimizers, loader) at `step`; the caller commits."""
    files = {}
    if getattr(c, "vocab_ids", None) is not None:  # model.vocab.restrict: the kept ids, read back on resume
        files[VOCAB_FILE] = vocab_json(c.vocab_ids)
    return write_checkpoint(root, step, *components_state(c, state), keep_last, files)


def restore_components(c: Any, folder: Path) -> dict[str, Any]:
    """Load a checkpoint into the trainer's components; returns its ``state.json``.

    The RNG states are restored last, so the next step draws exactly what the interrupted run
    would have drawn.
    """
    state, optim_state, rng = read_checkpoint(folder)
    load_model_weights(c.policy.model, folder / "actor")
    c.optimizer.load_state_dict(optim_state["actor"])
    c.scheduler.load_state_dict(optim_state["actor_scheduler"])
    if c.critic is not None:
        load_critic_weights(c.critic, folder / "critic")
        c.critic_optimizer.load_state_dict(optim_state["critic"])
        c.critic_scheduler.load_state_dict(optim_state["critic_scheduler"])
    c.loader.load_state_dict(state["loader"])
    c.rollout.update_weights(c.policy.model)
    set_rng_state(rng)
    return state
