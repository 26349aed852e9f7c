"""Checkpoint -> a plain Hugging Face model folder, LoRA merged into the weights; or its LoRA adapter alone
(:func:`export_adapter`: bf16, ``queryrl export RUN OUT --adapter-only``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from queryrl.atomic import atomic_dir, readable_as_umask
from queryrl.models import load_policy
from queryrl.models.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, base_name, write_adapter
from queryrl.trainer.checkpoint import CheckpointError, latest_checkpoint, load_model_weights, verify


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


def verified_checkpoint(path: Path) -> Path:
    """:func:`resolve_checkpoint`, verified against its manifest (one written before manifests: its files exist
    and are not empty): only what the manifest lists is exported.

    Raises:
        CheckpointError: the checkpoint is damaged (:func:`~queryrl.trainer.manifest.verify`'s one line).
    """
    found = resolve_checkpoint(path)
    problem = verify(found, allow_unhashed=True)
    if problem is not None:
        raise CheckpointError(f"checkpoint {found} is damaged ({problem})")
    return found


def export_checkpoint(checkpoint: Path, out: Path) -> Path:
    """Write the policy of `checkpoint` to `out`: a ``checkpoints/step_N`` folder, or a run folder (or its
    ``checkpoints/``), whose latest checkpoint is exported.

    The base model comes from the run's config (saved in the checkpoint), the trained weights
    from the checkpoint; LoRA adapters are merged. Written to a temporary folder and renamed.
    """
    checkpoint = verified_checkpoint(checkpoint)
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


def export_adapter(checkpoint: Path, out: Path) -> Path:
    """Write the LoRA adapter of `checkpoint` (as :func:`export_checkpoint` finds it) alone to `out`: the
    checkpoint's ``actor/`` adapter in bfloat16, its config's ``base_model_name_or_path`` the name of the
    run's ``model.path`` folder (the model the adapter goes on: for a run started from a merged warm-up,
    that warm-up model). Evaluate it with ``queryrl eval --systems NAME=BASE+OUT``.

    Raises:
        FileNotFoundError: not a checkpoint.
        ValueError: the run trained no LoRA (its checkpoint holds the whole model), or `out` exists.
    """
    checkpoint = verified_checkpoint(checkpoint)
    actor = checkpoint / "actor"
    if not (actor / ADAPTER_WEIGHTS).is_file():
        raise ValueError(
            f"{checkpoint} holds no LoRA adapter (the run trained the whole model, model.lora.rank=0): "
            "export the model without --adapter-only"
        )
    saved = json.loads((checkpoint / "state.json").read_text()).get("config") or {}
    path = (saved.get("model") or {}).get("path")  # null: the built-in tiny model, as peft recorded it
    recorded = json.loads((actor / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    base = path or recorded
    return write_adapter(actor, out, base_name(base) if base else None)
