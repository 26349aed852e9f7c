"""``queryrl eval`` on data without gold documents: counts print as integers, and every empty part (eval.png's
panels, the paired differences, the run page's tables) says why in its place."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from matplotlib.axes import Axes
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.eval.outputs import NO_GOLD, table_rows
from queryrl.apps.query_rewrite.metrics import format_table
from queryrl.cli import app
from queryrl.data.builtin import resolve_data_path
from queryrl.data.records import load_records
from queryrl.report_page import JS

runner = CliRunner()


def test_counts_print_as_integers() -> None:
    table = format_table(table_rows({"raw_turn": {"n": 0, "format_ok": 1.0}, "grpo": {"n": 12, "mrr": 0.0}}))
    assert "| raw_turn | 0 | 1.000 | - |" in table  # columns in first-seen order: n, format, MRR (a rate: 1.000)
    assert "| grpo | 12 | - | 0.000 |" in table


def _no_gold_data(path: Path, n: int = 6) -> Path:
    rows = load_records(resolve_data_path("builtin://sales_demo/test"))[:n]
    for row in rows:
        row["reward_model"]["ground_truth"] = {"gold_doc_ids": []}
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_eval_without_gold_says_why_its_parts_are_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[str] = []
    text = Axes.text

    def record(self: Axes, x: float, y: float, s: str, *args: Any, **kwargs: Any) -> Any:
        drawn.append(str(s))
        return text(self, x, y, s, *args, **kwargs)

    monkeypatch.setattr(Axes, "text", record)
    data = _no_gold_data(tmp_path / "no_gold.jsonl")
    out = tmp_path / "eval.json"
    args = ["eval", "--data", str(data), "--systems", "raw_turn,concat_last3", "--out", str(out)]
    result = runner.invoke(app, [*args, "--bootstrap", "50", "--compare", "concat_last3:raw_turn"])
    assert result.exit_code == 0, result.output
    assert re.search(r"\| raw_turn \| 0 \| ", result.output), result.output  # n, not 0.000
    assert f"note: {NO_GOLD}" in result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["notes"] == {"retrieval": NO_GOLD, "comparisons": NO_GOLD}
    raw = report["systems"]["raw_turn"]
    assert (raw["n"], raw["n_no_retrieval"], raw["intent_n"]) == (0, 3, 6)  # counts: integers in JSON too
    assert all(isinstance(raw[k], int) for k in ("n", "n_skipped", "n_no_retrieval", "intent_n"))
    assert '"n_no_retrieval": 3,' in out.read_text(encoding="utf-8")
    said = [t.replace("\n", " ") for t in drawn]
    assert said.count(NO_GOLD) == 3  # the MRR, Recall and paired-differences panels
    assert (tmp_path / "eval.png").stat().st_size > 0


def _function(name: str) -> str:
    """The source of the run page's top-level JS function `name`."""
    start = JS.index(f"function {name}(")
    return JS[start : JS.index("\n}\n", start) + 2]


DOM = """
function el(tag, text, cls) {
  return {tag, text: text === undefined || text === null ? null : String(text), cls: cls || null, children: [],
          appendChild(c) { this.children.push(c); return c; }};
}
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="no node to run the page's script")
@pytest.mark.parametrize("notes", [{"retrieval": NO_GOLD, "comparisons": NO_GOLD}, None])
def test_the_run_page_says_why_its_eval_tables_are_empty(notes: dict[str, str] | None) -> None:
    systems = {"raw_turn": {"n": 0, "format_ok": 1.0}, "concat_last3": {"n": 0, "format_ok": 1.0}}
    report: dict[str, Any] = {
        "systems": systems,
        "comparisons": {"concat_last3-raw_turn": {"a": "concat_last3", "b": "raw_turn", "n": 0}},
    }
    if notes:
        report["notes"] = notes
    parts = _shown(report)
    if notes:
        assert parts == [("p", NO_GOLD), ("h3", "Paired differences (a - b)"), ("p", NO_GOLD)]
    else:  # an eval.json of an older queryrl: still no table of headers only
        assert [tag for tag, _ in parts] == ["p", "h3", "p"]
    # the intent check's differences exist without gold: their table, and the note on what is missing
    intent = {"n": 6, "a": 0.5, "b": 1.0, "diff": -0.5, "low": -0.9, "high": -0.2, "a_better": 0, "b_better": 0.5}
    report["comparisons"]["concat_last3-raw_turn"]["intent_kept"] = intent
    for s in systems.values():
        s |= {"intent_kept": 1.0, "intent_kept_low": 1.0, "intent_kept_high": 1.0}
    parts = _shown(report)
    assert [tag for tag, _ in parts] == (["p", "table", "h3", "p", "table"] if notes else ["table", "h3", "table"])


def _shown(report: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(tag, text) of what the run page's eval section shows for `report` (its script run in node)."""
    script = DOM + _function("fmt") + _function("oneEval")
    script += f"const host = el('div'); oneEval(host, {json.dumps(report)}, 'none'); console.log(JSON.stringify(host));"
    shown = json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout)
    return [(c["tag"], c["text"]) for c in shown["children"]]
