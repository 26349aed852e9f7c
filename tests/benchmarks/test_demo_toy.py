"""benchmarks/demo_toy.py: the score at both ends of a run's metrics, and a short run refused."""

from __future__ import annotations

import json
from pathlib import Path

import demo_toy as bench  # benchmarks/demo_toy.py (benchmarks/ is on the tests' path: pyproject.toml)
import pytest


def test_score_ends_averages_the_first_and_last_steps(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    lines = [{"step": i, bench.SCORE: i / 10} for i in range(1, 7)] + [{"step": 7, "val/score": 1.0}]
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert bench.score_ends(metrics, edge=2) == pytest.approx((0.15, 0.55))
    with pytest.raises(ValueError, match="6 steps"):
        bench.score_ends(metrics, edge=4)
