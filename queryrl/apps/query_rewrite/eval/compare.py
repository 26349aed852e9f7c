"""``queryrl eval --compare A:B``: the paired difference between two evaluated systems on the same turns.

Two systems are scored on the same test turns, so the question "is A better than B" is about the
per-turn differences, not about two separate means: turns that are hard for one are mostly hard for the
other, and that shared variance cancels in the difference. For each pair ``A:B``
(:func:`parse_compare`), over the turns both were scored on (retrieval metrics: the turns with gold),
:func:`compare_systems` reports the mean difference ``A - B`` of recall@k, MRR and NDCG@k (k the
headline cutoff, 5) with its paired percentile-bootstrap interval
(:func:`~queryrl.apps.query_rewrite.metrics.paired_bootstrap`: one draw of turn indices per replicate,
applied to both systems), ``n``, and the shares of turns where A > B, A < B and A = B. Where both
systems have judge verdicts against the reference (not ``reference`` itself), the difference of their
judge scores (1 win, 0.5 tie, 0 loss) over the turns where both verdicts are valid. The intent columns
(``intent_kept``, ``intent_kept_judge``, over every turn) come from :func:`~.eval.intent.compare_intents`.

The eval writes them to the JSON (``comparisons: {"A-B": {...}}``), prints them as a second table
(:func:`format_comparisons`) and draws them as a panel of the chart (:func:`draw_differences`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from queryrl.apps.query_rewrite.metrics import mrr, ndcg_at_k, paired_bootstrap, recall_at_k

JUDGE_SCORES = {"8b": 1.0, "same": 0.5, "32b": 0.0}  # as win_tie_loss's score: the candidate is "8b"


def parse_compare(spec: str | Sequence[str] | None, names: Sequence[str]) -> list[tuple[str, str]]:
    """The pairs of ``--compare``: ``A:B`` entries, comma-separated and/or repeated, in order, without repeats.

    Raises:
        ValueError: an entry that is not ``A:B``, a system not in `names` (all such named in one message),
            a system compared with itself, or two pairs whose keys ``A-B`` coincide.
    """
    raw = [spec] if isinstance(spec, str) else list(spec or [])
    entries = [e.strip() for item in raw for e in item.split(",") if e.strip()]
    pairs: list[tuple[str, str]] = []
    unknown: list[str] = []
    for entry in entries:
        a, sep, b = (part.strip() for part in entry.partition(":"))
        if not sep or not a or not b or ":" in b:
            raise ValueError(f"--compare {entry!r}: expected A:B with two system names, e.g. grpo:sft")
        if a == b:
            raise ValueError(f"--compare {entry!r}: a system compared with itself")
        unknown += [n for n in (a, b) if n not in names and n not in unknown]
        if (a, b) not in pairs:
            pairs.append((a, b))
    if unknown:
        listed = ", ".join(repr(n) for n in unknown)
        what = "system" if len(unknown) == 1 else "systems"
        raise ValueError(f"--compare: unknown {what} {listed}; the systems evaluated are {', '.join(names)}")
    keys = [pair_key(a, b) for a, b in pairs]
    clash = sorted({k for k in keys if keys.count(k) > 1})
    if clash:
        raise ValueError(f"--compare: two pairs share the key {clash[0]!r}; rename a system with NAME=PATH")
    return pairs


def pair_key(a: str, b: str) -> str:
    """The pair's key in the JSON's ``comparisons``: ``"A-B"``."""
    return f"{a}-{b}"


def per_sample_values(
    ranked: Sequence[Sequence[str]], golds: Sequence[Sequence[str]], k: int
) -> list[dict[str, float] | None]:
    """Per sample, recall@k, MRR and NDCG@k of the ranked doc ids; None for a sample without gold."""
    if len(ranked) != len(golds):
        raise ValueError(f"{len(ranked)} result lists but {len(golds)} gold lists")
    return [
        {f"recall@{k}": recall_at_k(r, g, k), "mrr": mrr(r, g), f"ndcg@{k}": ndcg_at_k(r, g, k)} if g else None
        for r, g in zip(ranked, golds, strict=True)
    ]


def judge_scores(verdicts: Sequence[Mapping[str, Any] | None]) -> list[float | None]:
    """Per sample, the judge score of the candidate (1 win, 0.5 tie, 0 loss); None without a valid verdict."""
    return [JUDGE_SCORES.get(str(v.get("better"))) if isinstance(v, Mapping) else None for v in verdicts]


def compare_systems(
    pairs: Sequence[tuple[str, str]],
    values: Mapping[str, Sequence[Mapping[str, float] | None]],
    verdicts: Mapping[str, Sequence[Mapping[str, Any] | None]],
    n_boot: int,
    seed: int,
    groups: Sequence[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{"A-B": {"a", "b", "n", <metric>: paired_bootstrap's dict, ...}}`` for each pair.

    Args:
        pairs: (A, B) system names (:func:`parse_compare`).
        values: per system, :func:`per_sample_values` (the same samples, in the same order, for all).
        verdicts: per judged system, its verdicts against the reference (systems without: not judged).
        n_boot, seed: the bootstrap; every metric of a pair uses the same replicates.
        groups: each sample's conversation id (same order), for the retrieval metrics' interval with whole
            conversations resampled (``group_low`` / ``group_high``); None: turns only.

    Returns:
        Per pair: ``n`` (turns both were scored on) and, when n > 0, one entry per metric (``n``, ``a``,
        ``b``, ``diff``, ``low``, ``high``, ``a_better``, ``b_better``, ``tie``); ``judge_score`` too when
        both systems were judged and some turn has a valid verdict from both.
    """
    out: dict[str, dict[str, Any]] = {}
    for a, b in pairs:
        kept: list[int] = []  # the samples both were scored on
        both: list[tuple[Mapping[str, float], Mapping[str, float]]] = []
        for i, (x, y) in enumerate(zip(values[a], values[b], strict=True)):
            if x is not None and y is not None:
                kept.append(i)
                both.append((x, y))
        entry: dict[str, Any] = {"a": a, "b": b, "n": len(both)}
        by = [groups[i] for i in kept] if groups is not None else None
        for metric in list(both[0][0]) if both else []:
            xs, ys = [x[metric] for x, _ in both], [y[metric] for _, y in both]
            entry[metric] = paired_bootstrap(xs, ys, n_boot, seed=seed, groups=by)
        if a in verdicts and b in verdicts:
            paired = paired_where_both(judge_scores(verdicts[a]), judge_scores(verdicts[b]), n_boot, seed)
            if paired is not None:
                entry["judge_score"] = paired
        out[pair_key(a, b)] = entry
    return out


def paired_where_both(
    xs: Iterable[float | None], ys: Iterable[float | None], n_boot: int, seed: int
) -> dict[str, float] | None:
    """:func:`paired_bootstrap` over the samples where both systems have a value (None: no such sample)."""
    both = [(x, y) for x, y in zip(xs, ys, strict=True) if x is not None and y is not None]
    if not both:
        return None
    return paired_bootstrap([x for x, _ in both], [y for _, y in both], n_boot, seed=seed)


def _interval(stats: Mapping[str, float] | None, low: str = "low", high: str = "high") -> str:
    if not stats or low not in stats:
        return "-"
    return f"{stats['diff']:+.3f} [{stats[low]:+.3f}, {stats[high]:+.3f}]"


def format_comparisons(comparisons: Mapping[str, Mapping[str, Any]], k: int) -> str:
    """The "paired differences" markdown table: one row per pair, each difference as ``+d [low, high]``."""
    metrics = [("mrr", "Δ MRR"), (f"recall@{k}", f"Δ recall@{k}"), (f"ndcg@{k}", f"Δ NDCG@{k}")]
    judged = any("judge_score" in c for c in comparisons.values())
    header = ["A - B", "n", *(f"{label} [95% CI]" for _, label in metrics), "MRR A>B / A<B / A=B"]
    grouped = any("group_low" in (c.get("mrr") or {}) for c in comparisons.values())
    if grouped:  # the headline's interval with whole conversations resampled
        header.append("Δ MRR, conversations resampled [95% CI] (conv.)")
    if judged:
        header.append("Δ judge_score [95% CI] (n)")
    extra = [m for m in ("intent_kept", "intent_kept_judge") if any(m in c for c in comparisons.values())]
    header += [f"Δ {m} [95% CI] (n)" for m in extra]
    lines = [
        "paired differences (A - B on the same turns; paired bootstrap 95% CI):",
        "| " + " | ".join(header) + " |",
        "| --- |" + " ---: |" * (len(header) - 1),
    ]
    for c in comparisons.values():
        cells = [f"{c['a']} - {c['b']}", str(c["n"]), *(_interval(c.get(m)) for m, _ in metrics)]
        head = c.get("mrr")
        cells.append(f"{head['a_better']:.2f} / {head['b_better']:.2f} / {head['tie']:.2f}" if head else "-")
        if grouped:
            by = _interval(head, "group_low", "group_high")
            cells.append(f"{by} ({int(head['groups'])})" if head and "groups" in head else by)
        for metric in (["judge_score"] if judged else []) + extra:
            stats = c.get(metric)
            cells.append(f"{_interval(stats)} ({int(stats['n'])})" if stats else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw_differences(ax: Any, comparisons: Mapping[str, Mapping[str, Any]], k: int) -> None:
    """One panel on the matplotlib axes `ax`: per pair, the recall@k and MRR differences with their paired
    95 % intervals as horizontal error bars, and the zero line (an interval clear of it is a difference)."""
    pairs = list(comparisons.values())
    metrics = ((f"recall@{k}", f"Recall@{k}", "tab:blue", -0.15), ("mrr", "MRR", "tab:orange", 0.15))
    for metric, label, color, offset in metrics:
        rows = [(i, c[metric]) for i, c in enumerate(pairs) if metric in c]
        if not rows:
            continue
        ys = [i + offset for i, _ in rows]
        diffs = [s["diff"] for _, s in rows]
        err = [[s["diff"] - s["low"] for _, s in rows], [s["high"] - s["diff"] for _, s in rows]]
        ax.errorbar(diffs, ys, xerr=err, fmt="o", capsize=4, color=color, label=label)
        for y, d in zip(ys, diffs, strict=True):
            ax.annotate(f"{d:+.3f}", (d, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.axvline(0.0, color="black", linewidth=1)
    ax.set_yticks(range(len(pairs)))
    ax.set_yticklabels([f"{c['a']} - {c['b']}" for c in pairs])
    ax.set_ylim(-0.6, len(pairs) - 0.4)
    ax.invert_yaxis()  # the first pair on top, as in the table
    ax.set_title("paired difference A - B (95% CI)")
    ax.legend(loc="best", fontsize=8)
