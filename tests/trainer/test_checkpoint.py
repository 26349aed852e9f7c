"""Checkpoints: atomic folders, pruning, and the resume modes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from queryrl.trainer.checkpoint import checkpoint_dirs, latest_checkpoint, read_checkpoint
from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg


@pytest.mark.slow
def test_keep_last_prunes_and_a_half_written_folder_is_ignored(tmp_path: Path, model_cache: Path) -> None:
    root = tmp_path / "toy_grpo" / "checkpoints"
    root.mkdir(parents=True)
    (root / ".tmp-step_9").mkdir()  # what a crash mid-save leaves: never picked up
    Trainer(
        make_cfg(tmp_path, model_cache, "trainer.total_steps=3", "trainer.save_every=1", "trainer.keep_last=2")
    ).fit()
    assert [p.name for p in checkpoint_dirs(root)] == ["step_2", "step_3"]
    assert latest_checkpoint(root) == root / "step_3"
    state, optim, rng = read_checkpoint(root / "step_3")
    assert state["step"] == 3
    assert "loader" in state
    assert "actor" in optim
    assert "torch" in rng
    with pytest.raises(FileNotFoundError, match="not a queryrl checkpoint"):
        read_checkpoint(root / ".tmp-step_9")


def test_resume_modes(tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=2", "trainer.save_every=1")).fit()
    step1 = tmp_path / "toy_grpo" / "checkpoints" / "step_1"
    assert Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=4")).step == 2  # auto: the latest
    assert Trainer(make_cfg(tmp_path, model_cache, f"trainer.resume={step1}")).step == 1
    assert Trainer(make_cfg(tmp_path, model_cache, "trainer.resume=disable")).step == 0
    with pytest.raises(FileNotFoundError, match="not a queryrl checkpoint"):
        Trainer(make_cfg(tmp_path, model_cache, f"trainer.resume={tmp_path / 'nowhere'}"))


def test_bf16_and_gradient_checkpointing_step(tmp_path: Path, model_cache: Path) -> None:
    trainer = Trainer(
        make_cfg(
            tmp_path, model_cache, "model.dtype=bfloat16", "model.gradient_checkpointing=true", "trainer.total_steps=1"
        )
    )
    assert next(trainer.c.policy.model.parameters()).dtype == torch.bfloat16
    metrics = trainer.fit()
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
