"""The run page's "eval examples" section: turns where two evaluated systems differ, better and worse.

``queryrl eval --compare A:B`` writes ``eval.json`` (its ``settings.compare`` lists the pairs) and
``eval_samples.jsonl`` beside it: per turn, each system's query, its top documents (``top5`` ids and
``top5_titles``), ``recall@5`` on a turn with gold, and the intent verdicts (``intent_kept``,
``intent_reason``; with an LLM judge ``intent_kept_judge``). :func:`eval_examples` takes the first pair eval
compared (GRPO against SFT, or against the zero-shot model: whichever came first) and picks the turns where
A's Recall@5 is above B's (best first) and below it (worst first), at most :data:`MAX_EXAMPLES` of each, with
both sides' query, document titles (gold marked) and intent verdicts. A's intent changes on turns where
the two do not differ in Recall@5 are counted (``intent_changed_a`` / ``intent_changed_b``) but not shown.

:data:`EXAMPLES_JS` draws the section from that data (text through ``textContent`` only, like the rest of the
page); ``queryrl.report`` embeds both. Nothing here reads anything but the run folder's own two files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_EXAMPLES = 12  # turns shown per side (A better, A worse)
METRIC = "recall@5"
MAX_CHARS = 300  # of a shown text (a turn, a query, a title)


def _short(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "…"


def _read_samples(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue  # a torn line: the others still show
        if isinstance(record, dict) and isinstance(record.get("systems"), dict):
            records.append(record)
    return records


def _pair(report: dict[str, Any]) -> tuple[str, str] | None:
    """The first pair eval compared: ``settings.compare`` ("A:B"), else the first ``comparisons`` entry."""
    for spec in (report.get("settings") or {}).get("compare") or []:
        a, sep, b = str(spec).partition(":")
        if sep and a and b:
            return a, b
    for entry in (report.get("comparisons") or {}).values():
        if isinstance(entry, dict) and entry.get("a") and entry.get("b"):
            return str(entry["a"]), str(entry["b"])
    return None


def _side(entry: dict[str, Any], gold: set[str]) -> dict[str, Any]:
    ids = [str(i) for i in entry.get("top5") or []]
    titles = [str(t) for t in entry.get("top5_titles") or []]
    docs = [{"title": _short(titles[k] if k < len(titles) else doc), "gold": doc in gold} for k, doc in enumerate(ids)]
    side: dict[str, Any] = {
        "query": _short(entry.get("query")) if entry.get("query") is not None else None,
        "recall": entry.get(METRIC),
        "docs": docs,
        "intent_kept": entry.get("intent_kept"),
        "intent_reason": _short(entry.get("intent_reason")),
    }
    if "intent_kept_judge" in entry:
        side["intent_kept_judge"] = entry.get("intent_kept_judge")
        side["intent_judge_reason"] = _short(entry.get("intent_judge_reason"))
    return side


def eval_examples(run_dir: Path, limit: int = MAX_EXAMPLES) -> dict[str, Any] | None:
    """The section's data, or None without ``eval.json`` / ``eval_samples.jsonl`` or a compared pair.

    Returns:
        ``a``, ``b`` (the systems), ``metric``, ``better`` and ``worse`` (examples: ``last_turn``, ``kind``,
        ``conversation_id``, ``turn``, ``diff`` and ``sides`` ``{a: side, b: side}``, each side its
        ``query``, ``recall``, ``docs`` [{title, gold}], ``intent_kept``, ``intent_reason`` and the LLM's
        verdict where there is one), ``n_better``, ``n_worse``, ``n_same`` (turns with gold), ``shown``
        (the cap), ``intent_changed_a`` / ``intent_changed_b`` (turns, all of them, whose rewrite changed
        the intent).
    """
    report_path, samples_path = run_dir / "eval.json", run_dir / "eval_samples.jsonl"
    if not report_path.is_file() or not samples_path.is_file():
        return None
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    pair = _pair(report) if isinstance(report, dict) else None
    if pair is None:
        return None
    a, b = pair
    records = [r for r in _read_samples(samples_path) if a in r["systems"] and b in r["systems"]]
    scored: list[tuple[float, dict[str, Any]]] = []
    for record in records:
        ra, rb = record["systems"][a].get(METRIC), record["systems"][b].get(METRIC)
        if isinstance(ra, int | float) and isinstance(rb, int | float):
            scored.append((float(ra) - float(rb), record))

    def example(diff: float, record: dict[str, Any]) -> dict[str, Any]:
        gold = {str(g) for g in record.get("gold") or []}
        return {
            "last_turn": _short(record.get("last_turn")),
            "kind": record.get("kind"),
            "conversation_id": record.get("conversation_id"),
            "turn": record.get("turn"),
            "diff": diff,
            "sides": {a: _side(record["systems"][a], gold), b: _side(record["systems"][b], gold)},
        }

    better = sorted((x for x in scored if x[0] > 0), key=lambda x: -x[0])
    worse = sorted((x for x in scored if x[0] < 0), key=lambda x: x[0])
    changed = {s: sum(r["systems"][s].get("intent_kept") is False for r in records) for s in (a, b)}
    return {
        "a": a,
        "b": b,
        "metric": METRIC,
        "better": [example(d, r) for d, r in better[:limit]],
        "worse": [example(d, r) for d, r in worse[:limit]],
        "n_better": len(better),
        "n_worse": len(worse),
        "n_same": len(scored) - len(better) - len(worse),
        "shown": limit,
        "intent_changed_a": changed[a],
        "intent_changed_b": changed[b],
    }


SECTION_HTML = '<section id="examples"><h2>Eval examples</h2><div id="examplelist"></div></section>'
NAV_HTML = ' · <a href="#examples">Eval examples</a>'
EXAMPLES_CSS = """
.example{border:1px solid #bbb;margin:.6em 0;padding:.4em}.example .turn b{margin-right:.5em}
.kept{color:#070}.changed{color:#a00;font-weight:bold}.example td ol{margin:0;padding-left:1.4em}
"""
# uses the page's el() and data(); the data tag is "examples"
EXAMPLES_JS = r"""
function intentText(side) {
  const parts = [];
  if (side.intent_kept === true || side.intent_kept === false)
    parts.push((side.intent_kept ? "kept" : "CHANGED") + (side.intent_reason ? ": " + side.intent_reason : ""));
  if (side.intent_kept_judge === true || side.intent_kept_judge === false)
    parts.push("judge: " + (side.intent_kept_judge ? "kept" : "CHANGED")
      + (side.intent_judge_reason ? " (" + side.intent_judge_reason + ")" : ""));
  else if ("intent_kept_judge" in side) parts.push("judge: no answer");
  return parts.join("; ") || "-";
}
function exampleView(ex, a, b, metric) {
  const box = el("div", null, "example");
  const turn = el("div", null, "turn");
  turn.appendChild(el("b", `${metric} ${ex.diff > 0 ? "+" : ""}${fmt(ex.diff)}`));
  turn.appendChild(el("span", ex.last_turn)); if (ex.kind) turn.appendChild(el("span", `  (${ex.kind})`, "hint"));
  box.appendChild(turn);
  const t = el("table"), head = el("tr");
  for (const h of ["system", "query", metric, "intent", "top documents"]) head.appendChild(el("th", h));
  t.appendChild(head);
  for (const name of [a, b]) {
    const side = ex.sides[name], tr = el("tr");
    tr.appendChild(el("td", name));
    tr.appendChild(el("td", side.query === null ? "(no query: the reply did not parse)" : side.query));
    tr.appendChild(el("td", side.recall === null || side.recall === undefined ? "" : fmt(side.recall)));
    const changed = side.intent_kept === false || side.intent_kept_judge === false;
    tr.appendChild(el("td", intentText(side), changed ? "changed" : "kept"));
    const docs = el("td"), list = el("ol");
    for (const d of side.docs)
      list.appendChild(el("li", d.title + (d.gold ? "  \u2605 gold" : ""), d.gold ? "gold" : ""));
    if (!side.docs.length) docs.appendChild(el("span", "no documents", "hint")); else docs.appendChild(list);
    tr.appendChild(docs); t.appendChild(tr);
  }
  box.appendChild(t); return box;
}
function examplesSection() {
  const host = document.getElementById("examplelist"), X = data("examples");
  if (!X) { host.appendChild(el("p", "No eval examples: this run folder has no eval.json with --compare "
    + "and eval_samples.jsonl beside it.")); return; }
  host.appendChild(el("p", `${X.a} against ${X.b}, turn by turn (${X.metric}): ${X.a} better on ${X.n_better}, `
    + `worse on ${X.n_worse}, equal on ${X.n_same} turns; at most ${X.shown} of each shown. Rewrites that `
    + `change the customer's intent, all turns: ${X.a} ${X.intent_changed_a}, ${X.b} ${X.intent_changed_b}.`));
  for (const [title, list] of [[`${X.a} better`, X.better], [`${X.a} worse`, X.worse]]) {
    host.appendChild(el("h3", `${title} (${list.length} shown)`));
    for (const ex of list) host.appendChild(exampleView(ex, X.a, X.b, X.metric));
  }
}
examplesSection();
"""
