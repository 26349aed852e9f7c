"""``rollout/identical_group_frac``: the share of groups whose responses are one token sequence (flat under any
reward), logged beside ``reward/zero_std_group_frac`` by a real training step."""

from __future__ import annotations

from pathlib import Path

import torch

from queryrl.trainer.loop import Trainer
from queryrl.trainer.metrics import identical_group_fraction
from tests.helpers import make_cfg, metrics_of


def test_a_group_is_identical_when_every_response_is_one_token_sequence() -> None:
    ids = torch.tensor([[5, 6, 0], [5, 6, 4], [5, 7, 0], [5, 6, 9], [3, 0, 0], [3, 1, 2], [8, 0, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 0, 0]])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3])  # padding differs inside groups 0 and 2; group 3 has one sample
    assert identical_group_fraction(ids, mask, groups) == 2 / 3  # groups 0 and 2 of the three with two samples
    assert identical_group_fraction(ids, mask, torch.arange(7)) == 0.0  # no group of two: nothing to count


def test_a_training_step_logs_it_beside_the_flat_groups(tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=2")).fit()
    rows = [r for r in metrics_of(tmp_path / "toy_grpo") if "reward/zero_std_group_frac" in r]
    assert len(rows) == 2
    for row in rows:  # an identical group is a flat one: never more of them than flat groups
        assert 0.0 <= row["rollout/identical_group_frac"] <= row["reward/zero_std_group_frac"]
