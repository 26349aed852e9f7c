"""The paired bootstrap of a difference between two systems on the same samples, hand-checked."""

from __future__ import annotations

import numpy as np
import pytest

from queryrl.apps.query_rewrite.metrics import bootstrap_ci, paired_bootstrap


def test_a_constant_difference_gives_a_zero_width_interval_at_that_value() -> None:
    b = [0.0, 0.2, 1.0, 0.5, 0.7, 0.3]
    a = [x + 0.25 for x in b]  # every sample 0.25 better: every replicate's mean difference is 0.25
    out = paired_bootstrap(a, b, n_boot=500, seed=3)
    assert out["diff"] == pytest.approx(0.25, abs=1e-12)
    assert out["low"] == pytest.approx(0.25, abs=1e-12)
    assert out["high"] == pytest.approx(0.25, abs=1e-12)
    assert (out["a_better"], out["b_better"], out["tie"]) == (1.0, 0.0, 0.0)
    assert out["n"] == 6
    assert out["a"] == pytest.approx(np.mean(a))
    assert out["b"] == pytest.approx(np.mean(b))


def test_identical_systems_differ_by_exactly_zero() -> None:
    a = [0.0, 1.0, 0.5, 1.0 / 3.0, 0.25]
    out = paired_bootstrap(a, list(a), n_boot=500, seed=0)
    assert (out["diff"], out["low"], out["high"]) == (0.0, 0.0, 0.0)
    assert (out["a_better"], out["b_better"], out["tie"]) == (0.0, 0.0, 1.0)


def test_shares_of_better_worse_and_equal_samples() -> None:
    # per-sample differences: +1, 0, -0.5, +0.5 -> A better on 2 of 4, B on 1, equal on 1; mean 0.25
    out = paired_bootstrap([1.0, 0.0, 0.5, 1.0], [0.0, 0.0, 1.0, 0.5], n_boot=100)
    assert out["diff"] == 0.25
    assert (out["a_better"], out["b_better"], out["tie"]) == (0.5, 0.25, 0.25)


def test_pairing_finds_a_difference_the_unpaired_intervals_cannot() -> None:
    # B spreads over [0, 1] (hard and easy turns); A gains 0.25 on 2 turns of every 5 and ties elsewhere.
    # Means: B 0.5, A 0.6. Unpaired, each mean has sd 0.354 / sqrt(40) = 0.056 (A: 0.048), so the two
    # 95 % intervals (about 0.39..0.61 and 0.51..0.69) overlap. Paired, the differences are 0.25 with
    # p = 0.4, else 0: sd 0.25 * sqrt(0.24) = 0.122, se 0.122 / sqrt(40) = 0.019, interval about
    # 0.1 +- 0.038 = [0.062, 0.138]: clear of zero. The shared turn difficulty cancels in the pair.
    b = [0.0, 0.25, 0.5, 0.75, 1.0] * 8
    a = [x + g for x, g in zip(b, [0.25, 0.0, 0.25, 0.0, 0.0] * 8, strict=True)]
    _, a_low, a_high = bootstrap_ci(a, 2000, seed=0)
    _, b_low, b_high = bootstrap_ci(b, 2000, seed=1)
    assert a_low < b_high
    assert b_low < a_high
    out = paired_bootstrap(a, b, n_boot=2000, seed=0)
    assert out["diff"] == pytest.approx(0.1)
    assert 0.04 < out["low"] < 0.085
    assert 0.115 < out["high"] < 0.16
    assert out["low"] > 0.0
    assert (out["a_better"], out["b_better"], out["tie"]) == (0.4, 0.0, 0.6)


def test_matches_a_slow_loop_that_resamples_both_systems_with_the_same_indices() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.random(23).tolist(), rng.random(23).tolist()
    out = paired_bootstrap(a, b, n_boot=300, alpha=0.1, seed=11)
    draws = np.random.default_rng(11).integers(0, 23, size=(300, 23))
    x, y = np.asarray(a), np.asarray(b)
    slow = [x[idx].mean() - y[idx].mean() for idx in draws]  # one draw, applied to both systems
    low, high = np.quantile(slow, [0.05, 0.95])
    assert out["low"] == pytest.approx(low, abs=1e-12)
    assert out["high"] == pytest.approx(high, abs=1e-12)
    assert out["diff"] == pytest.approx(x.mean() - y.mean(), abs=1e-12)


def test_against_zeros_it_is_bootstrap_ci_and_swapping_mirrors_it() -> None:
    a = [0.0, 1.0, 1.0, 0.5, 0.0, 1.0, 0.2]
    mean, low, high = bootstrap_ci(a, 400, seed=5)
    out = paired_bootstrap(a, [0.0] * len(a), n_boot=400, seed=5)
    assert (out["diff"], out["low"], out["high"]) == (mean, low, high)  # the same replicates
    b = [1.0, 0.0, 0.5, 0.5, 0.25, 1.0, 0.0]
    ab, ba = paired_bootstrap(a, b, 400, seed=2), paired_bootstrap(b, a, 400, seed=2)
    assert ba["diff"] == pytest.approx(-ab["diff"])
    assert (ba["low"], ba["high"]) == pytest.approx((-ab["high"], -ab["low"]))
    assert (ba["a_better"], ba["b_better"]) == (ab["b_better"], ab["a_better"])


def test_deterministic_for_a_seed() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.random(30).tolist(), rng.random(30).tolist()
    assert paired_bootstrap(a, b, 200, seed=4) == paired_bootstrap(a, b, 200, seed=4)
    assert paired_bootstrap(a, b, 200, seed=4)["low"] != paired_bootstrap(a, b, 200, seed=5)["low"]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="equally long"):
        paired_bootstrap([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="no samples"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="alpha"):
        paired_bootstrap([0.1], [0.2], alpha=1.5)
    with pytest.raises(ValueError, match="n_boot"):
        paired_bootstrap([0.1], [0.2], n_boot=0)


def test_with_one_sample_per_group_the_group_interval_is_the_turn_interval() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.random(40).tolist(), rng.random(40).tolist()
    out = paired_bootstrap(a, b, n_boot=300, seed=2, groups=[f"c{i}" for i in range(40)])
    assert out["groups"] == 40
    # the same draws: each group is one sample
    assert out["group_low"] == pytest.approx(out["low"], abs=1e-12)
    assert out["group_high"] == pytest.approx(out["high"], abs=1e-12)


def test_resampling_whole_conversations_widens_the_interval_when_they_differ() -> None:
    # 6 conversations of 10 turns; within each the difference is the same on every turn, between them it
    # varies: resampling turns sees 60 independent values, resampling conversations sees 6
    per_conversation = [0.3, 0.0, -0.1, 0.2, 0.0, 0.1]
    d = [x for x in per_conversation for _ in range(10)]
    groups = [f"conv{c}" for c in range(6) for _ in range(10)]
    out = paired_bootstrap(d, [0.0] * 60, n_boot=2000, seed=0, groups=groups)
    assert out["diff"] == pytest.approx(np.mean(per_conversation))
    assert out["groups"] == 6
    assert out["group_high"] - out["group_low"] > 2 * (out["high"] - out["low"])
    assert out["group_low"] <= out["diff"] <= out["group_high"]


def test_group_ids_empty_or_single_and_mismatched() -> None:
    from queryrl.apps.query_rewrite.metrics import group_interval

    assert group_interval([0.1, 0.2, 0.3], ["same", "same", "same"]) == {}  # one group: nothing to resample
    assert group_interval([0.1, 0.2, 0.3], ["", "", "x"])["groups"] == 3  # "" is a group of its own
    no_groups = paired_bootstrap([1.0, 0.0], [0.0, 0.0], n_boot=10)
    assert "groups" not in no_groups
    assert "group_low" not in no_groups
    with pytest.raises(ValueError, match="3 samples but 2 group ids"):
        group_interval([0.1, 0.2, 0.3], ["a", "b"])
