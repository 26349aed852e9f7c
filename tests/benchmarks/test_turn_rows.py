"""benchmarks/turn_rows.py: the per-turn scores a bench result keeps, and a grid read from them once the run folder is
gone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import seed_grid as grid  # benchmarks/ is on the tests' path (pyproject.toml)
import turn_rows

SYSTEMS = ("grpo", "warmup", "reference", "concat_last3")


def _eval_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """eval_samples.jsonl rows: conversation text, queries and scores (GRPO's differ by `seed`)."""
    rows = []
    for i in range(n):
        hit = {"grpo": float((i + seed) % 3 == 0), "warmup": float(i % 2), "reference": float(i % 3 == 1)}
        hit["concat_last3"] = float(i % 4 == 0)
        rows.append(
            {
                "index": i,
                "conversation_id": f"dev-{i // 3:04d}",
                "turn": i % 3,
                "kind": "",
                "last_turn": f"第{i}句：故宫的门票多少钱？",
                "gold": ["故宫::门票"] if i % 5 else [],
                "systems": {
                    s: {
                        "query": f"故宫门票{'多少' * (i % 2)}" if s == "grpo" else "故宫的门票多少钱",
                        "recall@5": hit[s],
                        "mrr": hit[s] / 2,
                        "intent_kept": i % 7 != 0,
                        "top5": ["故宫::门票"],
                    }
                    for s in SYSTEMS
                },
            }
        )
    return rows


def test_compact_keeps_numbers_and_ids_only_and_expands_to_the_rows_scores(tmp_path: Path) -> None:
    samples = tmp_path / "eval_samples.jsonl"
    rows = _eval_rows(10, 0)
    samples.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    table = turn_rows.compact(samples)
    text = json.dumps(table, ensure_ascii=False)
    assert "故宫" not in text  # no conversation, query or document text
    back = turn_rows.expand(json.loads(text))
    assert [(r["index"], r["conversation_id"], r["turn"], r["gold"]) for r in back] == [
        (r["index"], r["conversation_id"], r["turn"], bool(r["gold"])) for r in rows
    ]
    for got, row in zip(back, rows, strict=True):
        for s in SYSTEMS:
            assert got["systems"][s]["recall@5"] == row["systems"][s]["recall@5"]
            assert got["systems"][s]["intent_kept"] == row["systems"][s]["intent_kept"]
            assert turn_rows.query_chars(got["systems"][s]) == turn_rows.query_chars(row["systems"][s])
            assert turn_rows.query_chars(row["systems"][s]) == len(row["systems"][s]["query"])


def _bench_run(tmp_path: Path, name: str, seed: int) -> Path:
    """A result JSON as the bench writes it (with turn_rows) and its run folder."""
    work = tmp_path / name
    (work / "eval").mkdir(parents=True)
    (work / "grpo_run").mkdir()
    (work / "grpo_run" / "config.yaml").write_text(f"trainer:\n  seed: {seed}\n")
    samples = work / "eval" / "eval_samples.jsonl"
    rows = _eval_rows(30, seed)
    samples.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    dependent = sum(r["turn"] > 0 for r in rows if r["gold"])
    result = tmp_path / f"{name}.json"
    record = {
        "settings": {"args": {"work": str(work), "seed": 0, "overrides": [f"trainer.seed={seed}"]}},
        "final_eval": {"grpo": {"ctx_dep_n": dependent, "intent_kept": 0.9}},
        "phases": {"grpo": {"per_step": {"zero_std_group_frac_mean": 0.6}}},
        "turn_rows": {"test": turn_rows.compact(samples)},
        "grpo_identical_logged_groups": 0.4,
    }
    result.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return result


def test_a_grid_reads_the_same_numbers_from_the_results_once_the_run_folders_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grid, "_intent_kept_now", lambda data, records: 0.9)  # the recorded rate, as the eval's
    results = [_bench_run(tmp_path, f"run{seed}", seed) for seed in (7, 8)]
    with_folders = grid.grid_summary([grid._load(r) for r in results], [])
    for seed in (7, 8):
        shutil.rmtree(tmp_path / f"run{seed}")
    loaded = [grid._load(r) for r in results]
    assert [r["rows_source"] for r in loaded] == ["result", "result"]
    assert [r["grpo_seed"] for r in loaded] == [7, 8]  # from the overrides
    assert [r["identical_groups"] for r in loaded] == [0.4, 0.4]
    without = grid.grid_summary(loaded, [])
    assert without["pooled"] == with_folders["pooled"]

    def same(summary: dict[str, Any]) -> list[dict[str, Any]]:  # what does not depend on where the rows came from
        return [
            {k: v for k, v in run.items() if k not in ("rows_source", "identical_logged_groups")}
            for run in summary["runs"]
        ]

    assert same(without) == same(with_folders)
    data = json.loads(results[0].read_text(encoding="utf-8"))
    del data["turn_rows"]
    results[0].write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(grid.GridError, match=r"and the result no turn_rows\.test"):
        grid._load(results[0])


def test_backfill_adds_the_rows_to_an_older_result_while_its_run_folder_is_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _bench_run(tmp_path, "old", 7)
    data = json.loads(result.read_text(encoding="utf-8"))
    expected = data.pop("turn_rows")
    del data["grpo_identical_logged_groups"]
    result.write_text(json.dumps(data), encoding="utf-8")
    samples = tmp_path / "old" / "grpo_run" / "samples"
    samples.mkdir()
    (samples / "step_1.jsonl").write_text(
        "".join(json.dumps({"group": g, "response": r}) + "\n" for g, r in ((0, "a"), (0, "a"), (1, "a"), (1, "b")))
    )
    assert turn_rows.main([str(result)]) == 0
    assert capsys.readouterr().out == f"{result}: added test, grpo_identical_logged_groups\n"
    data = json.loads(result.read_text(encoding="utf-8"))
    assert data["turn_rows"] == expected
    assert data["grpo_identical_logged_groups"] == 0.5
    assert turn_rows.main([str(result)]) == 0
    assert capsys.readouterr().out == f"{result}: already kept\n"
    shutil.rmtree(tmp_path / "old")
    del data["turn_rows"]
    result.write_text(json.dumps(data), encoding="utf-8")
    assert turn_rows.main([str(result)]) == 2
    assert "its run folder has no" in capsys.readouterr().err
