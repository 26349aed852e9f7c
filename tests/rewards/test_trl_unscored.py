"""TRL 1.16's None and exceptions, as queryrl follows them (``trl/trainer/grpo_trainer.py``,
``_generate_and_score_completions``): a sample no function scored is *unscored* (NaN reward, out of its
group's mean and std, advantage 0, kept in the batch), not failed; an exception in a function stops the
run naming it; ``multi_objective_aggregation`` has TRL's two modes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from queryrl.algos import ADVANTAGE_ESTIMATORS
from queryrl.config import ConfigError, load_config
from queryrl.engine.batch import outcome_to_tokens
from queryrl.rewards import RewardInput, make_reward_manager
from queryrl.rewards.loading import load_weighted_functions
from queryrl.trainer.loop import Trainer
from queryrl.trainer.metrics import zero_std_group_fraction
from queryrl.trainer.scoring import estimate_advantages
from queryrl.trainer.skips import RewardFunctionRaised, has_signal
from tests.helpers import cfg_with_reward_file, make_cfg, metrics_of, params

NAN = float("nan")


def grpo_advantages(scores: list[float], groups: list[int], estimator: str = "grpo") -> torch.Tensor:
    """The per-sample advantage (first token) of `scores` (NaN: unscored) in `groups`, responses of 3 tokens."""
    s = torch.tensor(scores)
    mask = torch.ones(len(scores), 3)
    adv, _ = estimate_advantages(
        ADVANTAGE_ESTIMATORS.get(estimator),
        outcome_to_tokens(s.nan_to_num(0.0), mask),
        mask,
        unscored=torch.isnan(s),
        group_ids=torch.tensor(groups),
        values=None,
        reward_baselines=None,
        gamma=1.0,
        lam=1.0,
        norm_adv_by_std=True,
    )
    assert torch.equal(adv, adv[:, :1].expand_as(adv))  # broadcast over the response tokens
    return adv[:, 0]


def test_an_unscored_sample_is_out_of_its_group_and_gets_advantage_0() -> None:
    scores = [1.0, NAN, 0.0, 1.0, 0.5, 0.5, NAN, 0.25]
    adv = grpo_advantages(scores, [0, 0, 0, 0, 1, 1, 1, 1])
    # by hand, TRL's way: nanmean and Bessel-corrected nanstd over the scored samples of each group
    # (verl's GRPO epsilon, 1e-6, where TRL adds 1e-4)
    for rows in ([0, 1, 2, 3], [4, 5, 6, 7]):
        kept = torch.tensor([scores[i] for i in rows if not math.isnan(scores[i])], dtype=torch.float64)
        mean, std = kept.mean(), kept.std()
        for i in rows:
            want = 0.0 if math.isnan(scores[i]) else float((scores[i] - mean) / (std + 1e-6))
            assert adv[i].item() == pytest.approx(want, abs=1e-5), (i, adv.tolist())
    # a 0 in the unscored place would have pulled group 0's mean down: the advantages would differ
    assert not torch.allclose(adv[:4], grpo_advantages([1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0]))


def test_a_group_with_one_scored_sample_and_a_batch_with_none() -> None:
    # one scored sample left in a group of 4: its own score is its baseline (TRL's nanmean), so 0; not the
    # estimator's rule for a real group of one (baseline 0), which still holds where n is 1
    assert grpo_advantages([NAN, 2.0, NAN, NAN], [0, 0, 0, 0]).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert grpo_advantages([NAN, 2.0, 3.0], [0, 0, 1]).tolist() == [0.0, 0.0, pytest.approx(3.0)]
    assert grpo_advantages([NAN, NAN], [0, 0]).tolist() == [0.0, 0.0]  # nothing scored: no signal, no NaN
    assert not torch.isnan(grpo_advantages([NAN, 1.0, 0.0, 1.0], [0, 0, 0, 0], "rloo")).any()


def test_no_signal_and_zero_std_leave_unscored_samples_out() -> None:
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    # each group's scored samples agree: no signal, although NaN != NaN
    scores = torch.tensor([1.0, NAN, 1.0, 0.0, 0.0, NAN])
    assert zero_std_group_fraction(scores, groups) == 1.0
    assert not has_signal(scores, groups)
    assert not has_signal(torch.full((6,), NAN), groups)
    assert has_signal(torch.tensor([1.0, NAN, 0.0, 0.0, 0.0, NAN]), groups)


# -- multi_objective_aggregation ------------------------------------------------------------------

FUNCTIONS = """
def first(completions, **kwargs):
    return [float(len(c)) for c in completions]


def second(completions, ground_truth, **kwargs):
    return [None if g is None else float(c.count("a")) for c, g in zip(completions, ground_truth)]


def raises(completions, **kwargs):
    raise ValueError("no judge today")
"""


def inputs(texts: list[str], truths: list[Any], groups: list[int]) -> list[RewardInput]:
    return [
        RewardInput("toy", t, g, row={"prompt": "p", "ground_truth": g}, group=k)
        for t, g, k in zip(texts, truths, groups, strict=True)
    ]


def test_normalize_then_sum_normalises_each_function_within_its_group(tmp_path: Path) -> None:
    path = tmp_path / "fns.py"
    path.write_text(FUNCTIONS)
    entries = [
        {"path": str(path), "name": "first", "weight": 1.0},
        {"path": str(path), "name": "second", "weight": 2.0},
    ]
    texts = ["a", "aaa", "bb", "abab", "aaaa", "b"]
    truths: list[Any] = ["x", "x", None, "x", "x", "x"]
    groups = [0, 0, 0, 1, 1, 1]
    fn = load_weighted_functions(entries, "normalize_then_sum")
    with make_reward_manager("naive", fn) as manager:
        got = [r.score for r in manager.score(inputs(texts, truths, groups))]
    # by hand, TRL 1.16's normalize_then_sum before its batch step: per function and group,
    # (v - nanmean) / (nanstd + 1e-4), then the weighted nansum
    raw = {
        "first": [float(len(t)) for t in texts],
        "second": [NAN if g is None else float(t.count("a")) for t, g in zip(texts, truths, strict=True)],
    }
    want = [0.0] * len(texts)
    for name, weight in (("first", 1.0), ("second", 2.0)):
        values = torch.tensor(raw[name], dtype=torch.float64).view(2, 3)
        mean = values.nanmean(dim=1, keepdim=True)
        present = ~values.isnan()
        var = ((values - mean) ** 2).nan_to_num(0.0).sum(dim=1, keepdim=True) / (present.sum(dim=1, keepdim=True) - 1)
        normed = ((values - mean) / (var.sqrt() + 1e-4)).view(-1)
        for i, v in enumerate(normed.tolist()):
            if not math.isnan(v):
                want[i] += weight * v
    assert got == pytest.approx(want, abs=1e-9)
    # the default sums first: the raw weighted sum
    with make_reward_manager("naive", load_weighted_functions(entries)) as manager:
        plain = [r.score for r in manager.score(inputs(texts, truths, groups))]
    assert plain == [3.0, 9.0, 2.0, 8.0, 12.0, 1.0]


def test_an_unknown_aggregation_is_one_line_naming_the_key(tmp_path: Path, model_cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"reward\.multi_objective_aggregation"):
        make_cfg(tmp_path, model_cache, "reward.multi_objective_aggregation=mean_then_sum")
    ok = load_config(
        Path(__file__).resolve().parents[2] / "configs" / "toy_grpo.yaml",
        ["reward.multi_objective_aggregation=normalize_then_sum"],
    )
    assert ok.reward.multi_objective_aggregation == "normalize_then_sum"


# -- real runs ------------------------------------------------------------------------------------

SOMETIMES = """
def sometimes(completions, **kwargs):
    # scores three of each four completions (one per group of 4 unscored, as a judge that abstains)
    return [None if i % 4 == 1 else len(set(c[0]["content"])) / 10 for i, c in enumerate(completions)]
"""


@pytest.mark.slow
def test_a_run_where_a_quarter_is_unscored_trains_on_the_rest(tmp_path: Path, model_cache: Path) -> None:
    cfg = cfg_with_reward_file(tmp_path, model_cache, SOMETIMES, "sometimes", "trainer.save_samples=16")
    with Trainer(cfg) as trainer:
        before = params(trainer.c.policy.model)
        trainer.fit()  # before: 4 of 16 failed a step: under max_failed_frac, but dropped, not kept
        after = params(trainer.c.policy.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = metrics_of(tmp_path / "toy_grpo")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/unscored"] == 4.0 and r["reward/failed"] == 0.0 for r in rows)
    assert all(r["reward/failed_frac"] == 0.0 for r in rows)  # kept in the batch
    samples = [json.loads(line) for line in (tmp_path / "toy_grpo" / "samples" / "step_1.jsonl").open()]
    unscored = [s for s in samples if s.get("unscored")]
    assert len(unscored) == 4
    assert all(s["score"] is None and "failed" not in s for s in unscored)
    # the logged score is over the scored samples (TRL's nanmean), not with 0 for the unscored
    scored = [s["score"] for s in samples if not s.get("unscored")]
    assert len(scored) == 12
    assert rows[0]["critic/score/mean"] == pytest.approx(sum(scored) / 12, abs=1e-6)


RAISES = """
def judge(completions, **kwargs):
    raise ConnectionError("judge unreachable")
"""


@pytest.mark.slow
def test_an_exception_in_a_trl_function_stops_the_run_naming_it(tmp_path: Path, model_cache: Path) -> None:
    cfg = cfg_with_reward_file(tmp_path, model_cache, RAISES, "judge")
    with Trainer(cfg) as trainer, pytest.raises(RewardFunctionRaised) as caught:
        trainer.fit()  # before: the step was skipped and the run went on to a second one
    message = str(caught.value)
    assert message.startswith("stopped at step 1: ")
    assert f"{tmp_path / 'reward.py'}:judge raised ConnectionError: judge unreachable" in message
    assert "\n" not in message


VALIDATION_ONLY = """
def judge(completions, **kwargs):
    if len(completions) < 16:  # the 4 validation prompts, one greedy answer each
        raise ConnectionError("judge unreachable")
    return [0.5] * len(completions)
"""


@pytest.mark.slow
def test_an_exception_in_validation_stops_the_run_too(tmp_path: Path, model_cache: Path) -> None:
    val = ["data.val_files=[builtin://toy_target_string/val]", "data.max_val_samples=4", "trainer.total_steps=1"]
    cfg = cfg_with_reward_file(tmp_path, model_cache, VALIDATION_ONLY, "judge", *val)
    with Trainer(cfg) as trainer, pytest.raises(RewardFunctionRaised, match="stopped in validation at step 1: "):
        trainer.fit()  # before: counted in val/reward/failed, and the run ended "done"
