"""Checkpoint -> a plain Hugging Face model folder, LoRA merged into the weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from queryrl.atomic import atomic_dir, readable_as_umask
from queryrl.models import load_policy
from queryrl.trainer.checkpoint import latest_checkpoint, load_model_weights


def resolve_checkpoint(path: Path) -> Path:
    """A ``checkpoints/step_N`` folder as given, or the latest one of a run folder or its ``checkpoints/``."""
    if (path / "state.json").is_file():
        return path
    for root in (path / "checkpoints", path):
        latest = latest_checkpoint(root) if root.is_dir() else None
        if latest is not None:
            return latest
    raise FileNotFoundError(
        f"{path} is not a queryrl checkpoint (no state.json) nor a run folder with checkpoints/step_N inside"
    )


def export_checkpoint(checkpoint: Path, out: Path) -> Path:
    """Write the policy of `checkpoint` to `out`: a ``checkpoints/step_N`` folder, or a run folder (or its
    ``checkpoints/``), whose latest checkpoint is exported.

    The base model comes from the run's config (saved in the checkpoint), the trained weights
    from the checkpoint; LoRA adapters are merged. Written to a temporary folder and renamed.
    """
    checkpoint = resolve_checkpoint(checkpoint)
    state_file = checkpoint / "state.json"
    from queryrl.config import QueryRLConfig

    saved = json.loads(state_file.read_text()).get("config") or {}
    cfg = OmegaConf.merge(OmegaConf.structured(QueryRLConfig), {"model": saved.get("model", {})})
    bundle = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False)
    load_model_weights(bundle.model, checkpoint / "actor")
    model = bundle.model.merge_and_unload() if bundle.lora else bundle.model  # type: ignore[operator]
    if out.exists():
        raise ValueError(f"{out} already exists; choose a new folder")
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)  # type: ignore[operator]
        bundle.tokenizer.save_pretrained(tmp)
        readable_as_umask(tmp)  # safetensors writes 0600
    return out
