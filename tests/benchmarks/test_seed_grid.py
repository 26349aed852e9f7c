"""benchmarks/seed_grid.py's ``--against``: a lever's grid minus the recipe's, seeds averaged per turn."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "seed_grid", Path(__file__).resolve().parents[2] / "benchmarks" / "seed_grid.py"
)
assert _SPEC is not None
assert _SPEC.loader is not None
grid = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(grid)


def _run(split: int, seed: int, hits: list[float], warm: list[float] | None = None) -> dict[str, Any]:
    warm = warm or [0.0] * len(hits)
    rows = [
        {
            "index": i,
            "turn": i % 3,
            "conversation_id": f"c{i // 4}",
            "systems": {"grpo": {"recall@5": h}, "warmup": {"recall@5": w}},
        }
        for i, (h, w) in enumerate(zip(hits, warm, strict=True))
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


def test_against_pairs_the_two_grids_warm_ups_per_split_and_pooled() -> None:
    hits, same_warm = [1, 0, 1, 0] * 2, [1, 0, 1, 1] * 2
    lever = [_run(0, 7, hits, warm=[1, 1, 1, 0] * 2), _run(1, 7, hits, warm=same_warm)]
    baseline = [_run(0, 7, hits, warm=[0, 1, 0, 0] * 2), _run(1, 7, hits, warm=same_warm)]
    out = grid.against(lever, baseline)
    assert out["by_split"]["0"]["lever_warmup_recall@5"] == pytest.approx(0.75)
    assert out["by_split"]["0"]["baseline_warmup_recall@5"] == pytest.approx(0.25)
    assert out["by_split"]["0"]["warmup_lever_minus_baseline"]["diff"] == pytest.approx(0.5)
    assert out["by_split"]["1"]["warmup_lever_minus_baseline"]["diff"] == pytest.approx(0.0)  # the same warm-up
    assert out["pooled"]["warmup_lever_minus_baseline"]["diff"] == pytest.approx(0.25)  # 4 of 16 turns better
    assert out["pooled"]["lever_minus_baseline"]["diff"] == pytest.approx(0.0)


def test_against_refuses_grids_without_a_shared_split_or_with_other_turns() -> None:
    with pytest.raises(grid.GridError, match="share no split"):
        grid.against([_run(0, 7, [1, 0])], [_run(1, 7, [1, 0])])
    other = _run(0, 7, [1, 0])
    other["rows"][1]["conversation_id"] = "another conversation"
    with pytest.raises(grid.GridError, match="same turns"):
        grid.against([_run(0, 7, [1, 0])], [other])


def _scored_run(flat: float | None, grpo_query: str) -> dict[str, Any]:
    systems = ("grpo", "warmup", "reference", "concat_last3")
    rows = []
    for i in range(8):
        hit = {"grpo": 1.0, "warmup": float(i % 2), "reference": float(i % 2), "concat_last3": 0.4}
        rows.append(
            {
                "index": i,
                "turn": i % 2,
                "conversation_id": f"c{i}",
                "systems": {
                    s: {"recall@5": hit[s], "mrr": hit[s] / 2, "query": grpo_query if s == "grpo" else "四字查询"}
                    for s in systems
                },
            }
        )
    return {
        "split": 0,
        "grpo_seed": 7,
        "path": "x.json",
        "rows": rows,
        "intent_kept": 0.98,
        "intent_kept_recorded": 0.97,
        "flat_groups": flat,
        "identical_groups": 0.5,
        "rows_source": "run folder",
    }


def test_run_goals_read_the_reference_mrr_the_query_length_and_the_flat_groups() -> None:
    goals = grid._run_goals(_scored_run(0.25, "八个字的改写查询"))
    assert goals["grpo_minus_reference_mrr"]["diff"] == pytest.approx(0.25, abs=1e-4)
    assert goals["median_query_x_reference"] == pytest.approx(2.0)
    assert goals["goals"]["median_query_within_1.5x_reference"] is False  # twice the reference's length: stuffing
    assert goals["goals"]["flat_groups_at_most_30"] is True
    assert goals["goals"]["ctx_dep_2.2x_concat_last3"] is True  # 1.0 / 0.4 = 2.5x on the turns with history
    assert goals["ctx_dep_grpo_minus_reference"] == pytest.approx(0.0)  # the reference finds those too
    short = grid._run_goals(_scored_run(None, "五个字查询"))
    assert short["goals"]["median_query_within_1.5x_reference"] is True
    assert short["goals"]["flat_groups_at_most_30"] is False  # a result without the per-step record meets nothing


def test_identical_logged_groups_counts_groups_of_one_response(tmp_path: Path) -> None:
    import json

    rows = [
        {"group": 0, "response": "故宫 门票"},
        {"group": 0, "response": "故宫 门票"},
        {"group": 1, "response": "故宫 地址"},
        {"group": 1, "response": "故宫在哪"},
        {"group": 2, "response": "一个人"},  # a group of one is not counted
    ]
    (tmp_path / "step_1.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    (tmp_path / "step_2.jsonl").write_text(
        json.dumps({"group": 0, "response": "a"}) + "\n" + json.dumps({"group": 0, "response": "a"}) + "\n"
    )
    assert grid.identical_logged_groups(tmp_path) == 2 / 3  # step 1 group 0 and step 2 group 0, of three
    assert grid.identical_logged_groups(tmp_path / "none") is None


def test_a_result_the_grid_cannot_read_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    missing_run = tmp_path / "gone.json"
    missing_run.write_text(
        json.dumps(
            {
                "settings": {"args": {"work": str(tmp_path / "no_run"), "seed": 0}},
                "final_eval": {"grpo": {"ctx_dep_n": 3}},
            }
        )
    )
    not_a_result = tmp_path / "other.json"
    not_a_result.write_text(json.dumps({"pairs": []}))
    for path, words in (
        (missing_run, "its run folder has no"),
        (not_a_result, "not a benchmarks/real_model.py result (no 'settings' in it)"),
        (tmp_path / "absent.json", "not readable as JSON"),
    ):
        assert grid.main([str(path), "--out", str(tmp_path / "grid.json")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"seed_grid: {path}: "), err
        assert words in err, err
    assert not (tmp_path / "grid.json").exists()


def _write_run(tmp_path: Path, test_dependent: int, val_dependent: int) -> Path:
    """A result JSON and its run folder: two test turns and three validation turns (one of them without gold)."""
    import json

    work = tmp_path / "run"
    (work / "grpo_run").mkdir(parents=True)
    (work / "grpo_run" / "config.yaml").write_text("trainer:\n  seed: 8\n")
    turns = {"eval": [("a", 0, True), ("b", 1, True)], "eval_val": [("c", 0, True), ("d", 2, True), ("e", 3, False)]}
    for folder, rows in turns.items():
        (work / folder).mkdir()
        lines = [
            {"last_turn": t, "turn": k, "conversation_id": folder, "gold": ["x::y"] if gold else []}
            for t, k, gold in rows
        ]
        (work / folder / "eval_samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = tmp_path / "result.json"
    summary = {"grpo": {"ctx_dep_n": test_dependent, "intent_kept": 1.0}}
    val_summary = {"grpo": {"ctx_dep_n": val_dependent, "intent_kept": 0.7}}
    settings = {"args": {"work": str(work), "seed": 2}}
    result.write_text(json.dumps({"settings": settings, "final_eval": summary, "val_eval": val_summary}))
    return result


def test_rows_from_test_and_val_pool_both_evals_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = {"test.parquet": 1.0, "val.parquet": 0.5}
    monkeypatch.setattr(grid, "_intent_kept_now", lambda data, records: kept[data.name])
    result = _write_run(tmp_path, test_dependent=1, val_dependent=1)
    run = grid._load(result, ("test", "val"))
    assert [r["last_turn"] for r in run["rows"]] == ["a", "b", "c", "d"]  # the turn without gold is not scored
    assert (run["split"], run["grpo_seed"]) == (2, 8)
    assert run["intent_kept"] == pytest.approx((2 * 1.0 + 3 * 0.5) / 5)  # weighted by each eval's turns
    assert run["intent_kept_recorded"] == pytest.approx((2 * 1.0 + 3 * 0.7) / 5)
    assert [r["last_turn"] for r in grid._load(result, ("val",))["rows"]] == ["c", "d"]
    with pytest.raises(grid.GridError, match="its val eval counted 2"):
        grid._load(_write_run(tmp_path / "other", test_dependent=1, val_dependent=2), ("test", "val"))


def test_rows_from_val_without_a_validation_eval_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    result = _write_run(tmp_path, test_dependent=1, val_dependent=1)
    data = json.loads(result.read_text())
    del data["val_eval"]
    result.write_text(json.dumps(data))
    assert grid.main([str(result), "--rows", "both"]) == 2
    assert "no 'val_eval' in it" in capsys.readouterr().err


def test_too_few_bootstrap_replicates_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _write_run(tmp_path, test_dependent=1, val_dependent=1)
    assert grid.main([str(result), "--boot", "10"]) == 2
    assert capsys.readouterr().err == "seed_grid: --boot must be at least 100 replicates, got 10\n"


def test_a_fold_split_is_labelled_by_its_fold_and_a_grid_does_not_mix_the_two_kinds() -> None:
    assert grid.split_label({"seed": 2}) == 2
    assert grid.split_label({"seed": 2, "fold": None}) == 2
    assert grid.split_label({"seed": 0, "fold": 3, "folds": 10}) == "fold 3/10"
    assert grid.split_label({"seed": 1, "fold": 3, "folds": 10}) == "fold 3/10, seed 1"
    seeded, folded = _scored_run(None, "五个字查询"), _scored_run(None, "五个字查询")
    folded["split"] = "fold 0/10"
    with pytest.raises(grid.GridError, match="mix seeded splits and fold splits"):
        grid.grid_summary([seeded], [folded])


def test_the_summary_says_what_its_runs_ran_on_and_flags_a_mix() -> None:
    amd, intel = _scored_run(0.7, "五个字查询"), _scored_run(0.7, "五个字查询")
    amd["ran_on"], intel["ran_on"] = "AMD EPYC, bfloat16", "Intel(R) Xeon(R) Processor, bfloat16"
    intel["split"] = 1
    one = grid.grid_summary([amd], [])
    assert one["ran_on"] == ["AMD EPYC, bfloat16"]
    assert "more than one CPU" not in grid.markdown(one)
    both = grid.grid_summary([amd, intel], [])
    assert both["ran_on"] == ["AMD EPYC, bfloat16", "Intel(R) Xeon(R) Processor, bfloat16"]
    assert grid.markdown(both).endswith(
        "The runs ran on more than one CPU or dtype: AMD EPYC, bfloat16; Intel(R) Xeon(R) Processor, bfloat16."
    )
