"""grpo_reference: GRPO whose group statistics also count a reference response's reward, and the trainer's side of
it (the baselines read from the reward's results, the no-signal check)."""

from __future__ import annotations

import math

import pytest
import torch

from queryrl.algos import ADVANTAGE_ESTIMATORS, compute_advantages
from queryrl.algos.advantages import grpo, grpo_reference
from queryrl.rewards import REFERENCE_SCORE, RewardResult
from queryrl.trainer.scoring import reference_baselines
from queryrl.trainer.skips import has_signal

EPS = 1e-6


def _outcome(scores: list[float], length: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome rewards on the last token of `length`-token responses, and their mask."""
    rewards = torch.zeros(len(scores), length)
    rewards[:, -1] = torch.tensor(scores)
    return rewards, torch.ones(len(scores), length)


def test_each_group_s_statistics_count_its_reference_score_once() -> None:
    scores = [1.0, 0.0, 0.5, 2.0, 2.0, 2.0, 0.3, 0.3]
    ids = [0, 0, 0, 1, 1, 1, 2, 2]
    ref = [0.25, 0.25, 0.25, 1.0, 1.0, 1.0, 0.3, 0.3]
    rewards, mask = _outcome(scores)
    adv, returns = grpo_reference(rewards, mask, group_ids=ids, reward_baselines=torch.tensor(ref))
    for rows, r in (([0, 1, 2], 0.25), ([3, 4, 5], 1.0), ([6, 7], 0.3)):
        joined = torch.tensor([scores[i] for i in rows] + [r])
        mean, std = joined.mean(), joined.std()  # unbiased, over the n samples and the reference
        for i in rows:
            want = 0.0 if float(std) == 0.0 else float((scores[i] - mean) / (std + EPS))
            assert adv[i, -1].item() == pytest.approx(want, abs=1e-6)
            assert torch.equal(adv[i], adv[i, -1] * mask[i])  # broadcast over the response
    assert torch.equal(adv, returns)


def test_a_flat_group_learns_against_the_reference_and_a_tie_learns_nothing() -> None:
    rewards, mask = _outcome([0.0] * 4 + [1.0] * 4 + [0.7] * 4)
    ids = [0] * 4 + [1] * 4 + [2] * 4
    ref = torch.tensor([1.0] * 4 + [0.0] * 4 + [0.7] * 4)
    adv = grpo_reference(rewards, mask, group_ids=ids, reward_baselines=ref)[0][:, -1]
    plain = grpo(rewards, mask, group_ids=ids)[0][:, -1]
    assert torch.equal(plain, torch.zeros(12))  # GRPO: three flat groups, no gradient at all
    # four samples at 0 and the reference at 1: mean 0.2, std sqrt(0.2); the mirror image above it
    assert adv[:4].tolist() == pytest.approx([-0.2 / (math.sqrt(0.2) + EPS)] * 4, abs=1e-6)
    assert adv[4:8].tolist() == pytest.approx([0.2 / (math.sqrt(0.2) + EPS)] * 4, abs=1e-6)
    assert torch.equal(adv[8:], torch.zeros(4))  # exactly 0 where the samples tie the reference


def test_without_std_normalisation_it_is_the_score_minus_the_joined_mean() -> None:
    rewards, mask = _outcome([1.0, 0.0, 0.0])
    adv = grpo_reference(rewards, mask, group_ids=[0, 0, 0], reward_baselines=torch.full((3,), 3.0),
                         norm_adv_by_std=False)[0][:, -1]  # fmt: skip
    assert adv.tolist() == pytest.approx([0.0, -1.0, -1.0])  # mean of 1, 0, 0 and 3 is 1


def test_the_reference_score_must_be_given_and_counts_once_a_group() -> None:
    rewards, mask = _outcome([1.0, 0.0])
    assert ADVANTAGE_ESTIMATORS.needs("grpo_reference") == {"reference_baseline"}
    with pytest.raises(ValueError, match="'grpo_reference' needs reward_baselines"):
        compute_advantages("grpo_reference", rewards, mask, group_ids=[0, 0])
    # rows of one prompt whose reference a judge scored differently: the group counts their mean once
    adv = grpo_reference(rewards, mask, group_ids=[0, 0], reward_baselines=torch.tensor([0.0, 1.0]))[0][:, -1]
    joined = torch.tensor([1.0, 0.0, 0.5])
    assert adv.tolist() == pytest.approx(((joined[:2] - joined.mean()) / (joined.std() + EPS)).tolist(), abs=1e-6)


def test_the_trainer_reads_each_sample_s_reference_score_from_its_reward() -> None:
    results = [
        RewardResult(1.0, extra={REFERENCE_SCORE: 0.5, "format": 1.0}),
        RewardResult(None, error="the RAG service failed"),  # dropped from the batch: its baseline is NaN
        RewardResult(0.0, extra={REFERENCE_SCORE: 0.5}),
    ]
    got = reference_baselines(results, "grpo_reference")
    assert got[0].item() == got[2].item() == 0.5
    assert math.isnan(got[1].item())
    with pytest.raises(ValueError, match=r"algo.adv_estimator=grpo_reference needs the reward to return "
                                         r"'reference_score'.*sample 1's reward returned \['format'\]"):  # fmt: skip
        reference_baselines([results[0], RewardResult(0.0, extra={"format": 1.0})], "grpo_reference")


def test_a_step_of_flat_groups_has_a_signal_where_a_baseline_differs() -> None:
    scores, ids = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1])
    assert not has_signal(scores, ids)
    assert not has_signal(scores, ids, torch.tensor([1.0, 1.0, 0.0, 0.0]))  # every group ties its baseline
    assert has_signal(scores, ids, torch.tensor([1.0, 1.0, 0.5, 0.5]))
    assert not has_signal(torch.tensor([math.nan, 1.0, 1.0]), torch.tensor([0, 0, 0]), torch.tensor([0.0, 1.0, 1.0]))
