"""``queryrl eval --compare A:B``: parsing the pairs, the paired differences, the table, the chart panel,
and end to end through the CLI on the sales demo's baselines."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.eval.compare import (
    compare_systems,
    draw_differences,
    format_comparisons,
    judge_scores,
    parse_compare,
    per_sample_values,
)
from queryrl.apps.query_rewrite.metrics import paired_bootstrap
from queryrl.cli import app

DATA = "builtin://sales_demo/test"
NAMES = ["raw_turn", "concat_last3", "reference", "sft", "grpo"]
runner = CliRunner()


def test_parse_compare_accepts_repeats_and_commas_in_order() -> None:
    pairs = parse_compare(["grpo:sft,grpo:reference", " sft : reference ", "grpo:sft"], NAMES)
    assert pairs == [("grpo", "sft"), ("grpo", "reference"), ("sft", "reference")]
    assert parse_compare("concat_last3:raw_turn", NAMES) == [("concat_last3", "raw_turn")]
    assert parse_compare(None, NAMES) == []
    assert parse_compare([], NAMES) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("grpo:nope", "unknown system 'nope'; the systems evaluated are raw_turn, concat_last3"),
        ("ppo:sft,grpo:dpo", "unknown systems 'ppo', 'dpo'"),
        ("grpo", "--compare 'grpo': expected A:B"),
        ("grpo:", "expected A:B"),
        ("a:b:c", "expected A:B"),
        ("grpo:grpo", "compared with itself"),
    ],
)
def test_parse_compare_refuses_bad_pairs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_compare(spec, NAMES)


def test_pair_keys_that_coincide_are_refused() -> None:
    with pytest.raises(ValueError, match="share the key 'a-b-c'"):
        parse_compare("a-b:c,a:b-c", ["a-b", "c", "a", "b-c"])


def test_per_sample_values_and_judge_scores() -> None:
    values = per_sample_values([["d3", "d1"], ["x"], []], [["d1"], ["g"], []], 5)
    assert values[0] == {"recall@5": 1.0, "mrr": 0.5, "ndcg@5": pytest.approx(0.6309298)}  # 1 / log2(3)
    assert values[1] == {"recall@5": 0.0, "mrr": 0.0, "ndcg@5": 0.0}
    assert values[2] is None  # no gold: not scored on retrieval
    verdicts: list[dict[str, Any] | None] = [{"better": "8b"}, {"better": "same"}, {"better": "32b"}, None, {}]
    assert judge_scores(verdicts) == [1.0, 0.5, 0.0, None, None]


def _stats(diff: float, low: float, high: float, shares: tuple[float, float, float]) -> dict[str, float]:
    return {"diff": diff, "low": low, "high": high, "a_better": shares[0], "b_better": shares[1], "tie": shares[2]}


def test_compare_systems_pairs_the_turns_both_were_scored_on() -> None:
    values: dict[str, list[dict[str, float] | None]] = {
        "a": [{"m": 1.0}, {"m": 0.5}, None, {"m": 0.0}],
        "b": [{"m": 0.0}, {"m": 0.5}, None, {"m": 0.0}],
        "ref": [{"m": 1.0}, {"m": 1.0}, None, {"m": 1.0}],
    }
    verdicts: dict[str, list[dict[str, Any] | None]] = {
        "a": [{"better": "8b"}, None, {"better": "same"}, {"better": "32b"}],
        "b": [{"better": "32b"}] * 4,
    }
    out = compare_systems([("a", "b"), ("a", "ref")], values, verdicts, n_boot=50, seed=0)
    assert list(out) == ["a-b", "a-ref"]
    ab = out["a-b"]
    assert (ab["a"], ab["b"], ab["n"]) == ("a", "b", 3)  # the turn without gold is left out
    assert ab["m"] == paired_bootstrap([1.0, 0.5, 0.0], [0.0, 0.5, 0.0], 50, seed=0)
    # judge: turns where both verdicts are valid (3 of 4): a scores 1, 0.5, 0; b scores 0 on each
    assert ab["judge_score"] == paired_bootstrap([1.0, 0.5, 0.0], [0.0, 0.0, 0.0], 50, seed=0)
    assert "judge_score" not in out["a-ref"]  # the reference is not judged against itself
    assert out["a-ref"]["m"]["diff"] == pytest.approx(-0.5)
    none = compare_systems([("a", "b")], {"a": [None], "b": [None]}, {}, 50, 0)
    assert none == {"a-b": {"a": "a", "b": "b", "n": 0}}
    # with conversation ids: the retrieval metrics' interval over conversations, on the turns both were scored on
    grouped = compare_systems([("a", "b")], values, verdicts, n_boot=50, seed=0, groups=["x", "x", "y", "z"])
    assert grouped["a-b"]["m"] == paired_bootstrap([1.0, 0.5, 0.0], [0.0, 0.5, 0.0], 50, seed=0, groups=["x", "x", "z"])
    assert grouped["a-b"]["m"]["groups"] == 2
    assert "groups" not in grouped["a-b"]["judge_score"]


def test_format_comparisons_table() -> None:
    comparisons = {
        "grpo-sft": {
            "a": "grpo",
            "b": "sft",
            "n": 120,
            "recall@5": _stats(0.0625, 0.02, 0.105, (0.2, 0.05, 0.75)),
            "mrr": _stats(-0.01, -0.04, 0.02, (0.1, 0.15, 0.75)),
            "ndcg@5": _stats(0.03, 0.0, 0.06, (0.2, 0.1, 0.7)),
            "judge_score": {**_stats(0.1, 0.05, 0.15, (0.3, 0.1, 0.6)), "n": 118.0},
        },
        "grpo-reference": {"a": "grpo", "b": "reference", "n": 0},
    }
    lines = format_comparisons(comparisons, 5).splitlines()
    assert lines[0].startswith("paired differences")
    assert lines[1] == (
        "| A - B | n | Δ MRR [95% CI] | Δ recall@5 [95% CI] | Δ NDCG@5 [95% CI] | MRR A>B / A<B / A=B"
        " | Δ judge_score [95% CI] (n) |"
    )
    assert lines[3] == (
        "| grpo - sft | 120 | -0.010 [-0.040, +0.020] | +0.062 [+0.020, +0.105] | +0.030 [+0.000, +0.060]"
        " | 0.10 / 0.15 / 0.75 | +0.100 [+0.050, +0.150] (118) |"
    )
    assert lines[4] == "| grpo - reference | 0 | - | - | - | - | - |"
    # with conversations resampled too: one more column, for the headline metric
    comparisons["grpo-sft"]["mrr"] |= {"groups": 15.0, "group_low": -0.09, "group_high": 0.05}
    lines = format_comparisons(comparisons, 5).splitlines()
    assert "| MRR A>B / A<B / A=B | Δ MRR, conversations resampled [95% CI] (conv.) | Δ judge_score" in lines[1]
    assert " | 0.10 / 0.15 / 0.75 | -0.010 [-0.090, +0.050] (15) | +0.100 [+0.050, +0.150] (118) |" in lines[3]
    assert lines[4] == "| grpo - reference | 0 | - | - | - | - | - | - |"


def test_draw_differences_panel_has_the_zero_line_and_one_bar_per_pair_and_metric() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    comparisons = {
        "grpo-sft": {"a": "grpo", "b": "sft", "n": 9, "recall@5": _stats(0.1, 0.02, 0.2, (0.3, 0.1, 0.6))},
        "sft-reference": {
            "a": "sft",
            "b": "reference",
            "n": 9,
            "recall@5": _stats(-0.1, -0.3, 0.05, (0.1, 0.3, 0.6)),
            "mrr": _stats(-0.05, -0.2, 0.1, (0.1, 0.3, 0.6)),
        },
    }
    fig, ax = plt.subplots()
    try:
        draw_differences(ax, comparisons, 5)
        assert [t.get_text() for t in ax.get_yticklabels()] == ["grpo - sft", "sft - reference"]
        assert any(np.array_equal(line.get_xdata(), [0.0, 0.0]) for line in ax.get_lines())  # the zero line
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert len(bars) == 2  # recall@5 (two pairs) and MRR (one pair) error bars
        assert np.array_equal(bars[0].lines[0].get_xdata(), [0.1, -0.1])  # recall@5, pairs in order
        assert np.array_equal(bars[1].lines[0].get_xdata(), [-0.05])
    finally:
        plt.close(fig)


# --- end to end through `queryrl eval` ------------------------------------------------------------


def _png_area(path: Path) -> int:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    return int(width) * int(height)


def test_cli_compare_end_to_end(tmp_path: Path, model_cache: Path) -> None:
    env = {"QUERYRL_CACHE": str(model_cache), "OMP_NUM_THREADS": "1"}
    base = ["eval", "--data", DATA, "--systems", "raw_turn,concat_last3,reference", "--judge", "offline"]
    common = ["--max-samples", "30", "--bootstrap", "200", "--seed", "3"]
    out = tmp_path / "with" / "eval.json"
    args = [*base, *common, "--out", str(out), "--compare", "concat_last3:raw_turn", "--compare", "reference:raw_turn"]
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert "paired differences" in result.output
    assert "| concat_last3 - raw_turn | " in result.output
    assert "| reference - raw_turn | " in result.output

    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["settings"]["compare"] == ["concat_last3:raw_turn", "reference:raw_turn"]
    assert list(report["comparisons"]) == ["concat_last3-raw_turn", "reference-raw_turn"]
    systems, pair = report["systems"], report["comparisons"]["concat_last3-raw_turn"]
    assert pair["n"] == systems["raw_turn"]["n"] == systems["concat_last3"]["n"] > 10  # the turns with gold
    for metric in ("recall@5", "mrr", "ndcg@5"):
        stats = pair[metric]
        assert stats["a"] == pytest.approx(systems["concat_last3"][metric])
        assert stats["b"] == pytest.approx(systems["raw_turn"][metric])
        assert stats["diff"] == pytest.approx(stats["a"] - stats["b"])
        assert stats["low"] <= stats["diff"] <= stats["high"]
        assert stats["a_better"] + stats["b_better"] + stats["tie"] == pytest.approx(1.0)
    # concatenating the history resolves pronouns the raw turn cannot: the paired interval is clear of
    # zero here (measured on the 23 turns with gold among these 30: +0.217, interval [+0.087, +0.435])
    assert pair["recall@5"]["low"] > 0.0
    assert pair["judge_score"]["n"] == systems["raw_turn"]["judge_n"]  # both judged on every turn
    assert "judge_score" not in report["comparisons"]["reference-raw_turn"]

    # the per-sample records carry the values: the same paired bootstrap recomputed from them
    records = [json.loads(line) for line in (out.parent / "eval_samples.jsonl").read_text("utf-8").splitlines()]
    gold = [r for r in records if r["gold"]]
    assert len(gold) == pair["n"]
    assert all("recall@5" not in r["systems"]["raw_turn"] for r in records if not r["gold"])
    xs = [r["systems"]["concat_last3"]["recall@5"] for r in gold]
    ys = [r["systems"]["raw_turn"]["recall@5"] for r in gold]
    conversations = [r["conversation_id"] for r in gold]
    assert pair["recall@5"] == pytest.approx(paired_bootstrap(xs, ys, 200, seed=3, groups=conversations))
    assert pair["mrr"]["groups"] == len(set(conversations)) > 1  # whole conversations resampled too
    assert "conversations resampled" in result.output

    # without --compare: no comparisons, no second table, a two-panel chart
    plain = tmp_path / "without" / "eval.json"
    result = runner.invoke(app, [*base, *common, "--out", str(plain)], env=env)
    assert result.exit_code == 0, result.output
    assert "paired differences" not in result.output
    assert json.loads(plain.read_text(encoding="utf-8"))["comparisons"] == {}
    # recall, MRR and judge panels in a row without; a fourth (the differences) makes two rows of two
    assert _png_area(out.parent / "eval.png") > 1.2 * _png_area(plain.parent / "eval.png")


def test_cli_unknown_compare_name_fails_before_anything_runs(tmp_path: Path) -> None:
    # a folder that passes --systems but cannot load, and data that does not exist: reaching either
    # would give another message, so the --compare check came first
    model = tmp_path / "not_loadable"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = tmp_path / "run" / "eval.json"
    args = ["eval", "--data", str(tmp_path / "missing.jsonl"), "--systems", f"raw_turn,grpo={model}"]
    result = runner.invoke(app, [*args, "--out", str(out), "--compare", "grpo:raw_turn,grpo:sft"])
    assert result.exit_code == 2
    assert "--compare: unknown system 'sft'; the systems evaluated are raw_turn, grpo" in result.output
    assert not out.parent.exists()  # nothing written


def test_the_printed_table_fits_a_terminal() -> None:
    from queryrl.apps.query_rewrite.eval.outputs import table_rows
    from queryrl.apps.query_rewrite.metrics import format_table

    metrics = {"n": 250, "recall@5": 0.714, "recall@5_low": 0.662, "recall@5_high": 0.766, "mrr": 0.513}
    metrics |= {"mrr_low": 0.46, "mrr_high": 0.566}
    metrics |= {"ndcg@5": 0.559, "recall@1": 0.3, "recall@3": 0.5, "ndcg@1": 0.3, "ndcg@3": 0.4, "win": 12.0}
    metrics |= {"tie": 3.0, "loss": 1.0, "win_rate": 0.7, "judge_score": 0.576, "format_ok": 0.997}
    metrics |= {"context_dependent": {"recall@5": 0.676}}
    table = format_table(table_rows({"baseline_with_a_long_name": metrics, "grpo": metrics}))
    assert max(len(line) for line in table.splitlines()) <= 120
    # MRR leads (a rewrite that only names the product cannot saturate it), Recall@5 beside it
    row = "| grpo | 250 | 0.513 | [0.460, 0.566] | 0.714 | [0.662, 0.766] | 0.559 | 0.676 | 0.997 | 0.576 |"
    assert row in table
    assert "R@1" not in table  # in eval.json, not in the table
    assert "NDCG@1" not in table
