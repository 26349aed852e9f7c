"""benchmarks/flat_groups.py: the offline flat-groups proxy on a few demo rows (the run itself is the benchmark)."""

from __future__ import annotations

import flat_groups as bench  # benchmarks/flat_groups.py (benchmarks/ is on the tests' path: pyproject.toml)


def test_measure_counts_flat_groups_and_the_stuffing_means() -> None:
    rows, entity_of, flat = bench.datasets(6)["sales_demo"]
    out = bench.measure(rows, entity_of, groups=3, seed=0, **flat)
    assert out["turns"] == 6
    assert out["groups"] == 18
    shares = out["flat_share"]
    assert set(shares) == {"same_text", "all_miss_gold", "today", "graded_0.5", "graded_1.0"}
    assert shares["same_text"] <= shares["today"]  # a group of one text is flat under any reward
    assert shares["graded_1.0"] <= shares["today"]  # the same draws: the component adds spread here
    assert set(out["graded_mean"]) == {"reference", "entity_x1", "entity_x3", "copied_turns", "three_times"}
    assert out["graded_mean"]["three_times"] == 0.0  # 3x the reference's length: past its budget
    assert out["graded_mean_without_guard"]["three_times"] == out["graded_mean"]["reference"]  # what the guard stops
