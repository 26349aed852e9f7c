"""benchmarks/int8_rollout.py's summary: per arm, the means, none / int8 and the gaps of the runs it was given."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import int8_rollout as bench  # noqa: E402


def run(quantize: str, gen: float, gap: float, avx2: bool = False) -> dict[str, Any]:
    return {
        "dtype": "float32",
        "avx2": avx2,
        "quantize": quantize,
        "mean_s": {"gen": gen, "ref": 1.0, "update_actor": 2.0, "step": gen + 3.0},
        "gen_ms_per_token": gen * 10,
        "rollout_probs_diff_mean_per_step": [gap, gap * 3],
        "rollout_probs_diff_max_per_step": [gap * 10, gap * 20],
    }


def test_the_summary_pairs_each_arm() -> None:
    runs = [run("none", 8.0, 1e-7), run("int8", 4.0, 0.005), run("int8", 6.0, 0.005), run("none", 10.0, 1e-7)]
    runs += [run("none", 9.0, 1e-7, avx2=True), run("int8", 9.0, 0.01, avx2=True)]
    out = bench.summary(runs)
    assert set(out) == {"float32", "float32_avx2"}
    assert out["float32"]["none"]["gen"] == 9.0
    assert out["float32"]["int8"]["gen"] == 5.0
    assert out["float32"]["speedup"]["gen"] == 1.8
    assert out["float32"]["gen_ms_per_token"] == {"none": 90.0, "int8": 50.0}
    assert out["float32"]["rollout_probs_diff"]["int8"]["mean"] == pytest.approx(0.01)
    assert out["float32"]["rollout_probs_diff"]["int8"]["max"] == pytest.approx(0.1)
    assert out["float32_avx2"]["speedup"]["gen"] == 1.0
