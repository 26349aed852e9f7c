"""Checkpoints: everything needed to continue a run exactly, written atomically.

``checkpoints/step_N/`` holds ``actor/`` (a Hugging Face folder: full weights, or the LoRA
adapter), ``critic/`` when there is one, ``optim.pt`` (optimizers and schedulers),
``rng.pt`` (python, numpy, torch and CUDA generator states) and ``state.json`` (step, data-loader
position, KL coefficient). It is written to a temporary folder and renamed, so a crash never
leaves a half checkpoint; the oldest are deleted beyond ``keep_last``.

With LoRA, ``actor/`` holds the adapters only (peft's ``save_pretrained``) and ``optim.pt`` the
AdamW state of the adapters only (the optimizer is built over the trainable parameters): the
frozen base is the ``model.path`` the saved config names, which resume and ``queryrl export``
load again. Each checkpoint's size is reported (:func:`report_size`).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

_STEP_DIR = re.compile(r"^step_(\d+)$")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - the global state user code may draw from
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model(model: nn.Module, out: Path, tokenizer: Any = None) -> None:
    """A Hugging Face folder (``save_pretrained``) of `model` (a peft model saves its adapter)."""
    model.save_pretrained(out)  # type: ignore[operator]
    if tokenizer is not None:
        tokenizer.save_pretrained(out)


def load_model_weights(model: nn.Module, folder: Path) -> None:
    """Load weights saved by :func:`save_model` into `model` in place."""
    from safetensors.torch import load_file

    adapter = folder / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(adapter))
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"{adapter}: unexpected adapter keys {unexpected[:5]}")
        return
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no weights (*.safetensors) in {folder}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(getattr(model, "config", None), "tie_word_embeddings", False) else set()
    really_missing = [k for k in missing if k not in tied and not k.endswith("value_head.weight")]
    if really_missing or unexpected:
        raise RuntimeError(f"{folder}: missing weights {really_missing[:5]}, unexpected {unexpected[:5]}")


def checkpoint_dirs(root: Path) -> list[Path]:
    """``root/step_N`` folders, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def save_checkpoint(
    root: Path,
    step: int,
    models: dict[str, tuple[nn.Module, Any]],
    optim_state: dict[str, Any],
    state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write ``root/step_<step>`` atomically and prune to the last `keep_last`.

    Args:
        root: the run's ``checkpoints`` folder.
        step: the number of training steps done.
        models: name -> (module, tokenizer or None); each saved as a Hugging Face folder.
        optim_state: optimizer and scheduler state dicts.
        state: JSON-serialisable trainer state (step, loader position, KL coefficient, ...).
        keep_last: how many checkpoints to keep (0 = all).
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp-step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, (module, tokenizer) in models.items():
        save_model(module, tmp / name, tokenizer)
    torch.save(optim_state, tmp / "optim.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    if keep_last > 0:
        for old in checkpoint_dirs(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def folder_sizes_mb(folder: Path) -> dict[str, float]:
    """Megabytes (10^6 bytes) of each top-level entry of `folder` (``actor``, ``optim.pt``, ...)."""
    sizes: dict[str, float] = {}
    for entry in sorted(folder.iterdir()):
        files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file()]
        sizes[entry.name] = sum(f.stat().st_size for f in files) / 1e6
    return sizes


def report_size(folder: Path, echo: bool = True) -> float:
    """The size of checkpoint `folder` in MB; with `echo`, one line on stdout with its parts."""
    sizes = folder_sizes_mb(folder)
    total = sum(sizes.values())
    if echo:
        parts = ", ".join(f"{name} {mb:.1f}" for name, mb in sizes.items() if mb >= 0.05)
        print(f"checkpoint {folder}: {total:.1f} MB ({parts})", flush=True)
    return total


def read_checkpoint(folder: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(state, optim_state, rng_state)`` of a checkpoint folder."""
    if not (folder / "state.json").is_file():
        raise FileNotFoundError(f"{folder} is not a queryrl checkpoint (no state.json)")
    state = json.loads((folder / "state.json").read_text())
    optim_state = torch.load(folder / "optim.pt", map_location="cpu", weights_only=False)
    rng = torch.load(folder / "rng.pt", map_location="cpu", weights_only=False)
    return state, optim_state, rng


def save_components(c: Any, root: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    """Checkpoint the trainer's components (policy, critic, optimizers, loader) at `step`."""
    models: dict[str, tuple[nn.Module, Any]] = {"actor": (c.policy.model, c.policy.tokenizer)}
    optim_state: dict[str, Any] = {"actor": c.optimizer.state_dict(), "actor_scheduler": c.scheduler.state_dict()}
    if c.critic is not None:
        models["critic"] = (c.critic, None)
        optim_state |= {"critic": c.critic_optimizer.state_dict(), "critic_scheduler": c.critic_scheduler.state_dict()}
    return save_checkpoint(root, step, models, optim_state, {"loader": c.loader.state_dict(), **state}, keep_last)


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
        load_model_weights(c.critic, folder / "critic")
        c.critic_optimizer.load_state_dict(optim_state["critic"])
        c.critic_scheduler.load_state_dict(optim_state["critic_scheduler"])
    c.loader.load_state_dict(state["loader"])
    c.rollout.update_weights(c.policy.model)
    set_rng_state(rng)
    return state
