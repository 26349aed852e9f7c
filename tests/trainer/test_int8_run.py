"""``rollout.quantize=int8`` in a run: LoRA GRPO with the restricted head trains, reports
``training/rollout_probs_diff_*`` on every step from the update's own log-probs (no ``old_log_prob`` phase),
makes its int8 copies once, checkpoints and resumes bit for bit; the update-side metric itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from queryrl.algos import LossNormalizer
from queryrl.engine.update import add_metrics, on_policy_probs_diff
from queryrl.rollout.int8 import Int8Linear
from queryrl.trainer.loop import Trainer
from tests.helpers import assert_same_params, make_cfg, metrics_of, params

INT8 = ("model.lora.rank=4", "actor.use_kl_loss=true", "model.vocab.restrict=true", "rollout.quantize=int8")
GAP = ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max")


def test_the_on_policy_gap_is_the_token_mean_and_max_over_micro_batches() -> None:
    """Two micro-batches' shares add up to the mini-batch's token mean; the max is the larger one's, not a sum."""
    rollout = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.1]]))
    trained = torch.log(torch.tensor([[0.4, 0.2, 0.5], [0.3, 0.6, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    norm = LossNormalizer.from_mask(mask)
    parts = [on_policy_probs_diff(rollout[i : i + 1], trained[i : i + 1], mask[i : i + 1], norm) for i in range(2)]
    total = add_metrics(add_metrics({}, parts[0]), parts[1])
    assert total[GAP[0]] == pytest.approx((0.1 + 0.0 + 0.0 + 0.3 + 0.0) / 5)
    assert total[GAP[1]] == pytest.approx(0.3)
    assert on_policy_probs_diff(rollout, trained, torch.zeros_like(mask), norm) == {}


@pytest.mark.slow
def test_an_int8_run_reports_the_gap_makes_copies_once_and_resumes_bitwise(tmp_path: Path, model_cache: Path) -> None:
    start = Int8Linear.built
    straight = Trainer(make_cfg(tmp_path / "a", model_cache, "trainer.total_steps=4", *INT8))
    before = params(straight.c.policy.model)
    straight.fit()
    made = Int8Linear.built - start
    layers = straight.c.policy.model.config.num_hidden_layers
    assert made == 4 * layers  # fused QKV, o_proj, fused gate/up, down_proj per layer: once for the 4 steps
    after = params(straight.c.policy.model)
    assert any(not torch.equal(before[k], after[k]) for k in after if "lora_" in k)
    rows = metrics_of(tmp_path / "a" / "toy_grpo")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row in rows:
        assert "timing_s/old_log_prob" not in row  # a single on-policy pass: the gap costs no forward
        assert 0 < row[GAP[0]] <= row[GAP[1]] < 0.05

    first = Trainer(make_cfg(tmp_path / "b", model_cache, "trainer.total_steps=4", *INT8))
    first.fit(max_steps=2)
    del first
    resumed = Trainer(make_cfg(tmp_path / "b", model_cache, "trainer.total_steps=4", *INT8))
    assert resumed.step == 2
    resumed.fit()
    assert_same_params(straight.c.policy.model, resumed.c.policy.model)
    resumed_rows = metrics_of(tmp_path / "b" / "toy_grpo")
    assert [r["step"] for r in resumed_rows] == [1, 2, 3, 4]
    assert [r[GAP[1]] for r in resumed_rows] == [r[GAP[1]] for r in rows]


@pytest.mark.slow
def test_full_precision_reports_a_gap_of_rounding_only(tmp_path: Path, model_cache: Path) -> None:
    """The control: the same run without int8 reports the metric too, at float rounding, below the int8 run's."""
    Trainer(make_cfg(tmp_path / "a", model_cache, *INT8[:-1])).fit()
    Trainer(make_cfg(tmp_path / "b", model_cache, *INT8)).fit()
    full, int8 = metrics_of(tmp_path / "a" / "toy_grpo"), metrics_of(tmp_path / "b" / "toy_grpo")
    assert all(r[GAP[1]] < 1e-5 for r in full)
    assert int8[0][GAP[1]] > 10 * full[0][GAP[1]]
