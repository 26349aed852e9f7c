"""``queryrl eval``'s outputs, next to the JSON summary ``out`` and each written atomically.

- ``out``: the report (:func:`write_outputs`): ``systems`` (each system's metrics), ``comparisons``,
  ``eval_file``, ``n_samples``, ``judge_calls`` (sent, failed, the first error and, with an LLM judge, its
  ``prompt_tokens``, ``completion_tokens``, ``reasoning_tokens``, ``cut_off`` and, with prices set, the
  estimated ``cost``), ``settings`` and ``notes`` (why a part is empty, e.g. no gold documents:
  :func:`eval_notes`); a non-finite number is written as null;
- ``eval.png``: a bar chart of recall@5 and MRR per system with 95 % intervals, and with ``--compare`` a
  third panel of the paired differences (:func:`plot_systems`); an empty panel says why in its place;
- ``eval_samples.jsonl``: per sample, each system's query, its top-5 doc ids and their titles, whether it
  parsed, the judge's verdict, the intent verdicts (``intent_kept``, ``intent_code``, ``intent_reason``;
  with an LLM judge ``intent_kept_judge``, ``intent_judge_reason``) and, on turns with gold, its recall@5 /
  MRR / NDCG@5 (:func:`sample_records`);
- the printed table (:func:`table_rows`, a subset of the metrics: :data:`TABLE_KEYS`) and, with
  ``--compare``, the paired differences.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from queryrl.apps.query_rewrite.eval.compare import draw_differences, format_comparisons
from queryrl.apps.query_rewrite.eval.intent import SystemIntents, intent_fields
from queryrl.apps.query_rewrite.eval.samples import Answer, Sample, SystemSpec
from queryrl.apps.query_rewrite.eval.scoring import doc_ids
from queryrl.apps.query_rewrite.metrics import HEADLINE_K, format_table
from queryrl.atomic import atomic_path, atomic_write_text
from queryrl.fonts import cjk_fonts

SAMPLES_TOP = 5  # doc ids per system in eval_samples.jsonl
# the printed table's columns (metric -> header), a few that fit a terminal; every metric is in eval.json. MRR
# leads: it rewards the gold document at the top, which a rewrite that only names the product does not get
# (on the demo's catalogue such a query finds 5 of the product's 8 documents: Recall@5 is lenient there)
TABLE_KEYS = {
    "n": "n",
    "mrr": "MRR",
    "mrr CI": "MRR 95% CI",
    f"recall@{HEADLINE_K}": f"R@{HEADLINE_K}",
    f"recall@{HEADLINE_K} CI": f"R@{HEADLINE_K} 95% CI",
    f"ndcg@{HEADLINE_K}": f"NDCG@{HEADLINE_K}",
    f"ctx_dep recall@{HEADLINE_K}": f"ctx R@{HEADLINE_K}",
    "format_ok": "format",
    "judge_score": "judge",
    "abstain_accuracy": "abstain acc",
    "intent_kept": "intent kept",
    "intent_kept_judge": "intent (judge)",
}


NO_GOLD = "no gold documents in this data: Recall, MRR and NDCG need gold ids (ground_truth.gold_doc_ids)"
NO_COMMON = "no turn with gold documents that both systems of a pair were scored on: no paired differences"


def eval_notes(golds: Sequence[Sequence[str]], comparisons: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Why a part of the report is empty, by part: ``retrieval`` (no sample has gold ids: no Recall, MRR or NDCG)
    and ``comparisons`` (``--compare`` asked for pairs, and no pair has a turn with gold both were scored on:
    no retrieval differences; the judge's and the intent check's may still be there)."""
    notes: dict[str, str] = {}
    if not any(golds):
        notes["retrieval"] = NO_GOLD
    if comparisons and not any(c.get("n") for c in comparisons.values()):
        notes["comparisons"] = notes.get("retrieval", NO_COMMON)
    return notes


def _count(key: str, value: Any) -> Any:
    """A whole-number float under a count's key (``n``, ``n_*``, ``*_n``) as an int: eval.json says ``6``, not
    ``6.0``."""
    return int(value) if _is_count(key) and isinstance(value, float) and value.is_integer() else value


def _is_count(key: str) -> bool:
    return key == "n" or key.startswith("n_") or key.endswith("_n")


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no NaN), every key a string and every
    count an int (:func:`_count`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(_count(str(k), v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def table_rows(systems: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float | str]]:
    """The rows of the printed table: the columns of :data:`TABLE_KEYS` a system has, under their headers."""
    rows: dict[str, dict[str, float | str]] = {}
    k = HEADLINE_K
    for name, metrics in systems.items():
        dependent = metrics.get("context_dependent") or {}
        flat: dict[str, Any] = {**metrics, f"ctx_dep recall@{k}": dependent.get(f"recall@{k}")}
        for metric in ("mrr", f"recall@{k}"):
            low, high = metrics.get(f"{metric}_low"), metrics.get(f"{metric}_high")
            if isinstance(low, int | float) and isinstance(high, int | float):
                flat[f"{metric} CI"] = f"[{low:.3f}, {high:.3f}]"
        row: dict[str, float | str] = {}
        for key, header in TABLE_KEYS.items():
            value = flat.get(key)
            if isinstance(value, str):
                row[header] = value
            elif isinstance(value, int | float) and not isinstance(value, bool):
                # a count is printed as an integer ("0", not "0.000"); a rate that happens to be 1 stays "1.000"
                row[header] = int(value) if _is_count(key) else float(value)
        rows[name] = row
    return rows


def plot_systems(
    systems: Mapping[str, Mapping[str, Any]],
    out: Path,
    comparisons: Mapping[str, Mapping[str, Any]] | None = None,
    trained: Sequence[str] = (),
    notes: Mapping[str, str] | None = None,
) -> Path:
    """Bars of recall@5 and MRR per system with their 95 % intervals, written to `out` (PNG).

    Baselines (grey) and the `trained` systems (blue) are told apart; with judge verdicts a panel of the
    judge score (wins + ties/2 against the reference, with its interval); with `comparisons`, a panel of
    the paired differences (:func:`~.eval.compare.draw_differences`). A panel with nothing to show says why
    in its place: `notes` (:func:`eval_notes`), else that no system has the metric.
    """
    notes = notes or {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with cjk_fonts():  # Chinese system names render
        names = list(systems)
        panels = [("mrr", "MRR"), (f"recall@{HEADLINE_K}", f"Recall@{HEADLINE_K}")]
        if any(systems[n].get("judge_score") is not None for n in names):
            panels.append(("judge_score", "judge score vs reference"))
        count = len(panels) + bool(comparisons)
        cols = count if count <= 3 else 2  # 4 panels: two rows, so the PNG stays readable at its size
        rows = -(-count // cols)
        width = max(5.0, 1.1 * len(names) + 1.5)
        fig, grid = plt.subplots(rows, cols, figsize=(width * cols, 4.2 * rows), squeeze=False)
        axes = list(grid.flat)
        for unused in axes[count:]:
            unused.set_visible(False)
        if comparisons:
            if "comparisons" in notes:
                _say_empty(axes[count - 1], "paired difference A - B", notes["comparisons"])
            else:
                draw_differences(axes[count - 1], comparisons, HEADLINE_K)
        colors = ["tab:blue" if n in trained else "tab:gray" for n in names]
        for ax, (key, title) in zip(axes, panels, strict=False):
            shown = [n for n in names if systems[n].get(key) is not None]
            if not shown:
                _say_empty(ax, title, notes.get("retrieval", f"no system has {title}"))
                continue
            means = [float(systems[n][key]) for n in shown]
            lows = [m - float(systems[n].get(f"{key}_low") or m) for n, m in zip(shown, means, strict=True)]
            highs = [float(systems[n].get(f"{key}_high") or m) - m for n, m in zip(shown, means, strict=True)]
            x = np.arange(len(shown))
            ax.bar(x, means, yerr=[lows, highs], capsize=4, color=[colors[names.index(n)] for n in shown])
            ax.set_xticks(x)
            ax.set_xticklabels(shown, rotation=20, ha="right")
            ax.set_ylim(0.0, 1.05)
            ax.set_title(f"{title} (95% CI)")
            for xi, m in zip(x, means, strict=True):
                inside = m >= 0.1  # a short bar (0 included) gets its label above it, where it can be read
                y, color = (m / 2, "white") if inside else (m + 0.02, "black")
                ax.text(xi, y, f"{m:.3f}", ha="center", va="center" if inside else "bottom", color=color, fontsize=9)
        if trained and len(trained) < len(names):
            legend = [Patch(color="tab:gray", label="baseline"), Patch(color="tab:blue", label="trained model")]
            axes[0].legend(handles=legend, fontsize="small", loc="upper left")
        fig.tight_layout()
        try:
            with atomic_path(out) as tmp:
                fig.savefig(tmp, format="png", dpi=100)
        finally:
            plt.close(fig)
    return out


def _say_empty(ax: Any, title: str, why: str) -> None:
    """An empty panel: its title and, in its middle, why it is empty (wrapped to the panel)."""
    import textwrap

    ax.set_title(title)
    ax.set_xticks([])
    ax.set_yticks([])
    text = "\n".join(textwrap.wrap(why, 36))
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="dimgray")


def sample_records(
    samples: Sequence[Sample],
    specs: Sequence[SystemSpec],
    answers: Mapping[str, Sequence[Answer] | None],
    results: Mapping[str, Sequence[Mapping[str, Any] | None]],
    verdicts: Mapping[str, Sequence[Mapping[str, Any] | None]],
    values: Mapping[str, Sequence[Mapping[str, float] | None]],
    intents: Mapping[str, SystemIntents] | None = None,
) -> list[dict[str, Any]]:
    """One record per sample for ``eval_samples.jsonl`` (see the module doc).

    Args:
        samples: the rows.
        specs: the systems, in the report's order.
        answers: a system's answers per sample (None: the ``reference`` system, whose query is its result's).
        results: a system's RAG result per sample (None: a format failure).
        verdicts: a judged system's verdict per sample.
        values: a system's recall@5 / MRR / NDCG@5 per sample (None without gold).
        intents: a system's intent verdicts (:mod:`~.eval.intent`).
    """
    records = []
    for i, s in enumerate(samples):
        per_system: dict[str, Any] = {}
        for spec in specs:
            result = results[spec.name][i]
            system_answers = answers[spec.name]
            answer = system_answers[i] if system_answers is not None else None
            entry: dict[str, Any] = {
                "query": (result or {}).get("rewritten_query") if answer is None else answer.query,
                "format_ok": answer is None or (answer.query is not None and not answer.trailing),
                "top5": doc_ids(result)[:SAMPLES_TOP],
                "top5_titles": [str(d.get("title", "")) for d in (result or {}).get("response") or []][:SAMPLES_TOP],
                **(values[spec.name][i] or {}),  # recall@5, mrr, ndcg@5 on a turn with gold: --compare's inputs
            }
            if answer is not None and answer.raw is not None:
                entry["raw"] = answer.raw
            if spec.name in verdicts:
                verdict = verdicts[spec.name][i]
                entry["verdict"] = verdict.get("better") if verdict else None
            if intents is not None and spec.name in intents:
                entry |= intent_fields(intents[spec.name], i)
            per_system[spec.name] = entry
        records.append(
            {
                "index": s.index,
                "conversation_id": s.conversation_id,
                "turn": s.turn,
                "kind": s.kind,
                "last_turn": s.contexts[-1]["content"],
                "gold": s.gold,
                "systems": per_system,
            }
        )
    return records


def write_outputs(
    report: Mapping[str, Any], records: Sequence[Mapping[str, Any]], out: Path, say: Callable[[str], None]
) -> None:
    """Write the report to `out`, `records` to ``eval_samples.jsonl`` and the chart to ``eval.png`` beside
    it, then print the table (and the paired differences) to `say`."""
    atomic_write_text(out, json.dumps(json_safe(dict(report)), ensure_ascii=False, indent=2) + "\n")
    lines = [json.dumps(json_safe(dict(r)), ensure_ascii=False, default=str) + "\n" for r in records]
    atomic_write_text(out.parent / "eval_samples.jsonl", "".join(lines))
    comparisons = report["comparisons"]
    trained = [spec["name"] for spec in report["settings"]["systems"] if spec.get("kind") == "model"]
    notes = report.get("notes") or {}
    plot_systems(report["systems"], out.parent / "eval.png", comparisons, trained, notes)
    say(format_table(table_rows(report["systems"])))
    if "retrieval" in notes:
        say(f"note: {notes['retrieval']}")
    if comparisons:
        say(format_comparisons(comparisons, HEADLINE_K))
        if notes.get("comparisons") and notes["comparisons"] != notes.get("retrieval"):
            say(f"note: {notes['comparisons']}")
    say(f"wrote {out}, {out.parent / 'eval.png'} and {out.parent / 'eval_samples.jsonl'}")
