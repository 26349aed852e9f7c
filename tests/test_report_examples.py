"""The run page's eval examples (queryrl.report_examples): built from a small eval output made here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from queryrl.report import write_report
from queryrl.report_examples import MAX_EXAMPLES, eval_examples


def _embedded(page: str, tag: str) -> Any:
    match = re.search(rf'<script type="application/json" id="data-{tag}">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def _entry(query: str | None, recall: float | None, ids: list[str], kept: bool, reason: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "query": query,
        "format_ok": query is not None,
        "top5": ids,
        "top5_titles": [f"title of {i}" for i in ids],
        "intent_kept": kept,
        "intent_code": "kept" if kept else "question_changed",
        "intent_reason": reason,
    }
    if recall is not None:
        entry["recall@5"] = recall
    return entry


def _eval_output(run: Path, compare: list[str], rows: list[dict[str, Any]]) -> Path:
    """What queryrl eval writes beside a run: eval.json (with the pairs of --compare) and eval_samples.jsonl."""
    run.mkdir(parents=True, exist_ok=True)
    report = {"systems": {"grpo": {"recall@5": 0.5}, "sft": {"recall@5": 0.4}}, "comparisons": {}}
    report["settings"] = {"compare": compare}
    (run / "eval.json").write_text(json.dumps(report), encoding="utf-8")
    lines = [json.dumps(r, ensure_ascii=False) for r in rows] + ['{"torn line']
    (run / "eval_samples.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return run


def _row(index: int, grpo: dict[str, Any], sft: dict[str, Any], last: str = "这个多少钱?") -> dict[str, Any]:
    return {
        "index": index,
        "conversation_id": f"c{index}",
        "turn": 2,
        "kind": "pronoun",
        "last_turn": last,
        "gold": ["g"],
        "systems": {"grpo": grpo, "sft": sft, "raw_turn": _entry(last, 0.0, [], True, "kept")},
    }


def _rows() -> list[dict[str, Any]]:
    swapped = "asks stock/shipping instead of price"
    return [
        # grpo better by 1.0, but it changed the question (issue 25: "这个多少钱?" -> "这个能马上发货吗? pro2")
        _row(
            0,
            _entry("这个能马上发货吗? pro2", 1.0, ["g", "x"], False, swapped),
            _entry("这个多少钱?", 0.0, ["x"], True, "kept"),
        ),
        _row(1, _entry("云帆 Pro2 价格", 0.5, ["y", "g"], True, "kept"), _entry("这个多少钱?", 0.0, [], True, "kept")),
        _row(2, _entry("云帆 Pro2 配置", 0.0, ["z"], True, "kept"), _entry("pro2 多少钱", 1.0, ["g"], True, "kept")),
        _row(3, _entry("a", 1.0, ["g"], True, "kept"), _entry("a", 1.0, ["g"], True, "kept")),  # equal: not shown
        _row(
            4, _entry(None, 0.0, [], False, "no query: the reply did not parse"), _entry("b", 1.0, ["g"], True, "kept")
        ),
        {
            "index": 5,
            "last_turn": "在吗",
            "gold": [],
            "systems": {"grpo": _entry("", None, [], True, "k"), "sft": _entry("", None, [], True, "k")},
        },
    ]


def test_examples_from_an_eval_output(tmp_path: Path) -> None:
    run = _eval_output(tmp_path / "run", ["grpo:sft", "grpo:raw_turn"], _rows())
    examples = eval_examples(run)
    assert examples is not None
    assert (examples["a"], examples["b"], examples["metric"]) == ("grpo", "sft", "recall@5")  # the first pair
    assert (examples["n_better"], examples["n_worse"], examples["n_same"]) == (2, 2, 1)  # turns with gold only
    assert [e["diff"] for e in examples["better"]] == [1.0, 0.5]  # best first
    assert [e["diff"] for e in examples["worse"]] == [-1.0, -1.0]
    first = examples["better"][0]
    assert first["last_turn"] == "这个多少钱?"
    grpo, sft = first["sides"]["grpo"], first["sides"]["sft"]
    assert grpo["query"] == "这个能马上发货吗? pro2"
    assert grpo["docs"] == [{"title": "title of g", "gold": True}, {"title": "title of x", "gold": False}]
    assert (grpo["intent_kept"], grpo["intent_reason"]) == (False, "asks stock/shipping instead of price")
    assert (sft["query"], sft["intent_kept"], sft["recall"]) == ("这个多少钱?", True, 0.0)
    unparsed = next(e for e in examples["worse"] if e["sides"]["grpo"]["query"] is None)
    assert unparsed["sides"]["grpo"]["docs"] == []
    assert (examples["intent_changed_a"], examples["intent_changed_b"]) == (2, 0)

    page = write_report(run).read_text(encoding="utf-8")
    assert _embedded(page, "examples") == examples
    assert '<section id="examples"><h2>Eval examples</h2>' in page
    assert '<a href="#examples">Eval examples</a>' in page
    assert "function examplesSection()" in page


def test_the_cap_the_other_order_and_escaping(tmp_path: Path) -> None:
    rows = [
        _row(i, _entry(f"<script>alert({i})</script>", 1.0, ["g"], True, "kept"), _entry("q", 0.0, [], True, "kept"))
        for i in range(MAX_EXAMPLES + 5)
    ]
    run = _eval_output(tmp_path / "run", ["sft:grpo"], rows)
    examples = eval_examples(run)
    assert examples is not None
    assert (examples["a"], examples["b"]) == ("sft", "grpo")
    assert (examples["n_worse"], len(examples["worse"]), examples["better"]) == (MAX_EXAMPLES + 5, MAX_EXAMPLES, [])
    page = write_report(run).read_text(encoding="utf-8")
    assert "<script>alert(" not in page  # the data tag escapes "<": no text becomes markup
    assert _embedded(page, "examples")["worse"][0]["sides"]["grpo"]["query"] == "<script>alert(0)</script>"


def test_no_section_without_a_compared_pair(tmp_path: Path) -> None:
    assert eval_examples(tmp_path) is None  # no eval.json
    run = _eval_output(tmp_path / "run", [], _rows())
    assert eval_examples(run) is None  # eval without --compare
    page = write_report(run).read_text(encoding="utf-8")
    assert _embedded(page, "examples") is None
    assert "No eval examples" in page  # what the section says then
    (run / "eval.json").write_text("{not json", encoding="utf-8")
    assert eval_examples(run) is None
