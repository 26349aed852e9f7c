"""benchmarks/levers/seed_grid.py's ``--against``: a lever's grid minus the recipe's, seeds averaged per turn."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "seed_grid", Path(__file__).resolve().parents[2] / "benchmarks" / "levers" / "seed_grid.py"
)
assert _SPEC is not None
assert _SPEC.loader is not None
grid = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(grid)


def _run(split: int, seed: int, hits: list[float]) -> dict[str, Any]:
    rows = [
        {"last_turn": f"t{i}", "turn": i % 3, "conversation_id": f"c{i // 4}", "systems": {"grpo": {"recall@5": h}}}
        for i, h in enumerate(hits)
    ]
    return {"split": split, "grpo_seed": seed, "rows": rows}


def test_against_averages_each_grids_seeds_per_turn_and_pairs_same_seeds() -> None:
    lever = [_run(0, 7, [1, 1, 0, 1, 0, 1, 1, 0]), _run(0, 8, [1, 0, 0, 1, 0, 1, 1, 1])]
    baseline = [_run(0, 7, [0, 1, 0, 1, 0, 0, 1, 0]), _run(0, 9, [1, 0, 0, 0, 0, 1, 0, 0]), _run(1, 7, [1] * 8)]
    out = grid.against(lever, baseline)
    split0 = out["by_split"]["0"]
    assert split0["lever_seeds"] == [7, 8]
    assert split0["baseline_seeds"] == [7, 9]
    assert split0["lever_recall@5"] == pytest.approx(10 / 16)  # the mean over both seeds and the eight turns
    assert split0["baseline_recall@5"] == pytest.approx(5 / 16)
    assert split0["lever_minus_baseline"]["diff"] == pytest.approx(5 / 16, abs=1e-4)
    assert list(split0["same_seed"]) == ["7"]  # seed 8 has no baseline run, seed 9 no lever run
    assert split0["same_seed"]["7"]["diff"] == pytest.approx(2 / 8, abs=1e-4)
    assert out["pooled"]["splits"] == [0]  # split 1 is the baseline's only


def test_against_refuses_grids_without_a_shared_split_or_with_other_turns() -> None:
    with pytest.raises(SystemExit, match="share no split"):
        grid.against([_run(0, 7, [1, 0])], [_run(1, 7, [1, 0])])
    other = _run(0, 7, [1, 0])
    other["rows"][1]["last_turn"] = "another turn"
    with pytest.raises(SystemExit, match="same turns"):
        grid.against([_run(0, 7, [1, 0])], [other])
