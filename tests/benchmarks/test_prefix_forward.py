"""benchmarks/prefix_forward.py's summary: per arm the means of the runs' means, off / on, and the score gap."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import prefix_forward as bench  # noqa: E402


def run(share: bool, update: float, scores: list[float]) -> dict[str, Any]:
    means = {"gen": 5.0, "ref": update / 3, "update_actor": update, "step": 5.0 + update * 4 / 3}
    return {"share_prefix_forward": share, "mean_after_first_s": means, "score_mean": scores}


def test_the_summary_pairs_the_arms() -> None:
    runs = [run(False, 12.0, [1.0, 0.8]), run(True, 8.0, [1.0, 0.8]), run(True, 10.0, [1.0, 0.8001])]
    runs.append(run(False, 12.0, [1.0, 0.8]))
    out = bench.summary(runs)
    assert out["off"]["update_actor"] == 12.0
    assert out["on"]["update_actor"] == 9.0
    assert out["speedup"]["update_actor"] == pytest.approx(12 / 9, abs=1e-3)
    assert out["speedup"]["gen"] == 1.0
    assert out["max_score_diff"] == pytest.approx(1e-4)
