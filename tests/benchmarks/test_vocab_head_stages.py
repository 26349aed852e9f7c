"""benchmarks/vocab_head_stages.py: the paired summary of the SFT and eval stages (the runs are the benchmark)."""

from __future__ import annotations

import vocab_head_stages as stages  # benchmarks/ is on the tests' path (pyproject.toml)


def test_summary_pairs_the_arms_and_counts_alike_replies() -> None:
    def sft(on: bool, mean: float) -> dict[str, object]:
        return {"stage": "sft", "dtype": "float32", "restrict": on, "mean_after_first_s": mean}

    def ev(on: bool, wall: float, raws: list[str], recall: float) -> dict[str, object]:
        return {"stage": "eval", "dtype": "float32", "restrict": on, "wall_s": wall, "raws": raws, "recall@5": recall}

    runs = [sft(False, 30.0), sft(True, 20.0), sft(True, 22.0), sft(False, 34.0)]
    runs += [ev(False, 90.0, ["a", "b", "c"], 0.5), ev(True, 60.0, ["a", "x", "c"], 0.4)]
    out = stages.summary(runs)
    assert out["sft_float32"] == {"measure": "mean_after_first_s", "off": 32.0, "on": 21.0, "speedup": 1.52}
    assert out["eval_float32"] == {
        "measure": "wall_s", "off": 90.0, "on": 60.0, "speedup": 1.5, "same_replies": "2/3", "recall@5": [0.5, 0.4],
    }  # fmt: skip
