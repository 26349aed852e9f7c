"""Evaluation of query rewriters: retrieval metrics of gold documents, judge win/tie/loss with
bootstrap confidence intervals, paired differences between two systems on the same samples
(:func:`paired_bootstrap`), one system's whole set of metrics for ``queryrl eval``
(:func:`system_metrics`, :func:`judge_metrics`), the two non-model baselines, and a markdown
comparison table.

Notation: ``ranked`` is one result list of document ids, best first (the ``doc_id`` of the RAG
service's ``response`` entries, in order); ``gold`` the sample's gold document ids
(``reward_model.ground_truth["gold_doc_ids"]``). Relevance is binary: a document is relevant iff it is
gold. A document id repeated in ``ranked`` counts once, at its first position.

Samples without gold cannot be scored on retrieval: :func:`retrieval_metrics` skips them and reports
``n_evaluated`` / ``n_skipped`` (the per-sample functions raise on empty gold rather than return 0).

Turns that need no retrieval ("在吗", "谢谢"): empty gold and a kind in :data:`NO_RETRIEVAL_KINDS`
(:func:`no_retrieval_turn`). The right answer there is an EMPTY rewritten query (the system abstains:
nothing is retrieved). :func:`abstain_metrics` scores that decision on both sides: ``abstain_accuracy``
(no-retrieval turns where the system abstained) and ``false_abstain`` (retrieval turns where it did).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

DEFAULT_KS = (1, 3, 5, 10)
HEADLINE_K = 5  # recall@5 is the headline metric of queryrl eval
# kinds (``extra_info.kind`` / ``turn_type``) whose turns need no retrieval when their gold is empty
NO_RETRIEVAL_KINDS = frozenset({"chitchat"})


def no_retrieval_turn(gold: Sequence[str], kind: str | None) -> bool:
    """True for a turn labelled as needing no retrieval: no gold and a kind in :data:`NO_RETRIEVAL_KINDS`.

    Empty gold alone is not enough: logs without gold annotations have empty gold everywhere.
    """
    return not gold and str(kind or "") in NO_RETRIEVAL_KINDS


def abstained_result() -> dict[str, Any]:
    """The RAG result of an abstention (an empty query): no documents, no service call."""
    return {"status": "success", "response": [], "answer": "", "rewritten_query": "", "cost_time": 0.0}


def abstain_metrics(
    abstained: Sequence[bool], no_retrieval: Sequence[bool], has_gold: Sequence[bool]
) -> dict[str, float]:
    """How well a system decides whether to retrieve at all.

    Args:
        abstained: per sample, the system gave an empty query.
        no_retrieval: per sample, the turn is labelled as needing no retrieval (:func:`no_retrieval_turn`).
        has_gold: per sample, the turn has gold documents (a retrieval turn).

    Returns:
        ``n_no_retrieval``; ``abstain_accuracy`` (share of no-retrieval turns with an empty query; absent
        without such turns); ``false_abstain`` (share of retrieval turns with an empty query; absent
        without them).
    """
    if not len(abstained) == len(no_retrieval) == len(has_gold):
        raise ValueError(f"lengths differ: {len(abstained)}, {len(no_retrieval)}, {len(has_gold)}")
    quiet = [a for a, n in zip(abstained, no_retrieval, strict=True) if n]
    retrieval = [a for a, g in zip(abstained, has_gold, strict=True) if g]
    out: dict[str, float] = {"n_no_retrieval": float(len(quiet))}
    if quiet:
        out["abstain_accuracy"] = float(np.mean(quiet))
    if retrieval:
        out["false_abstain"] = float(np.mean(retrieval))
    return out


def _first_positions(ranked: Sequence[str], gold: Sequence[str]) -> list[int]:
    """0-based first positions in `ranked` of the gold ids that occur there, ascending."""
    gold_set = set(gold)
    if not gold_set:
        raise ValueError("no gold documents: this sample cannot be scored on retrieval")
    seen: set[str] = set()
    positions = []
    for i, doc in enumerate(ranked):
        if doc in gold_set and doc not in seen:
            positions.append(i)
        seen.add(doc)
    return positions


def recall_at_k(ranked: Sequence[str], gold: Sequence[str], k: int) -> float:
    """Fraction of the distinct gold ids found among the first `k` results."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    hits = [p for p in _first_positions(ranked, gold) if p < k]
    return len(hits) / len(set(gold))


def mrr(ranked: Sequence[str], gold: Sequence[str]) -> float:
    """Reciprocal rank of the first gold id in `ranked` (0 when none is there); averaged over samples it is MRR."""
    positions = _first_positions(ranked, gold)
    return 1.0 / (positions[0] + 1) if positions else 0.0


def ndcg_at_k(ranked: Sequence[str], gold: Sequence[str], k: int) -> float:
    """Binary-relevance NDCG@k: ``DCG = sum_{gold at 0-based i < k} 1 / log2(i + 2)``, over the ideal DCG
    (all ``min(k, |gold|)`` gold ids at the top)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    dcg = sum(1.0 / math.log2(p + 2) for p in _first_positions(ranked, gold) if p < k)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(set(gold)))))
    return dcg / ideal


def retrieval_metrics(
    results: Sequence[Sequence[str]], golds: Sequence[Sequence[str]], ks: Sequence[int] = DEFAULT_KS
) -> dict[str, float]:
    """Mean ``recall@k``, ``ndcg@k`` (each k in `ks`) and ``mrr`` over the samples that have gold.

    Returns the means plus ``n_evaluated`` and ``n_skipped`` (samples without gold); the means are
    absent when no sample has gold.
    """
    if len(results) != len(golds):
        raise ValueError(f"{len(results)} result lists but {len(golds)} gold lists")
    scored = [(list(r), list(g)) for r, g in zip(results, golds, strict=True) if g]
    out: dict[str, float] = {"n_evaluated": float(len(scored)), "n_skipped": float(len(results) - len(scored))}
    if not scored:
        return out
    for k in ks:
        out[f"recall@{k}"] = float(np.mean([recall_at_k(r, g, k) for r, g in scored]))
    out["mrr"] = float(np.mean([mrr(r, g) for r, g in scored]))
    for k in ks:
        out[f"ndcg@{k}"] = float(np.mean([ndcg_at_k(r, g, k) for r, g in scored]))
    return out


def bootstrap_ci(
    values: Sequence[float], n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high): the sample mean and the percentile bootstrap ``1 - alpha`` interval of the mean.

    Deterministic for a given `seed`. One value gives a zero-width interval.
    """
    x = np.asarray(values, dtype=np.float64)  # (n,)
    if x.size == 0:
        raise ValueError("bootstrap_ci of no values")
    if not 0.0 < alpha < 1.0 or n_boot < 1:
        raise ValueError(f"need 0 < alpha < 1 and n_boot >= 1, got alpha={alpha}, n_boot={n_boot}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))  # (n_boot, n)
    means = x[idx].mean(axis=1)  # (n_boot,)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(x.mean()), float(low), float(high)


# two per-sample values closer than this count as equal (the same ranked list scored twice is bit-equal;
# this only absorbs float noise between two paths to the same number)
TIE_TOL = 1e-12


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    groups: Sequence[str] | None = None,
) -> dict[str, float]:
    """The mean difference ``A - B`` over the same samples, with its PAIRED percentile bootstrap interval.

    Each replicate draws one set of sample indices and applies it to both systems, so what the interval
    measures is the spread of the per-sample differences, not of each system's own scores: two systems
    that both find hard turns hard (a large shared variance) can differ reliably by little. The unpaired
    intervals of each mean (:func:`bootstrap_ci`) can then overlap while this one excludes zero.

    The replicates are the ones :func:`bootstrap_ci` draws for the same `seed` and sample count, so with
    ``b`` all zeros the interval is ``bootstrap_ci(a)``'s. Deterministic for a given `seed`.

    Turns of one conversation are not independent (they share its entity and its difficulty): with
    `groups` (each sample's conversation id), :func:`group_interval` also resamples whole conversations.

    Args:
        a, b: per-sample scores of systems A and B on the same samples, in the same order; (n,) each.
        n_boot, alpha, seed: the bootstrap (``1 - alpha`` interval).
        groups: each sample's group (conversation id; "" for none: a group of its own), or None.

    Returns:
        ``n``; ``a`` and ``b`` (each system's mean); ``diff`` (mean of ``a - b``) with ``low`` / ``high``;
        ``a_better``, ``b_better``, ``tie``: the shares of samples where A > B, A < B and A = B
        (within :data:`TIE_TOL`), summing to 1; with `groups` of at least two groups, ``groups`` (their
        number) and ``group_low`` / ``group_high`` (:func:`group_interval`).
    """
    x = np.asarray(a, dtype=np.float64)  # (n,)
    y = np.asarray(b, dtype=np.float64)  # (n,)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired samples must be two equally long lists, got {x.shape} and {y.shape}")
    if x.size == 0:
        raise ValueError("paired_bootstrap of no samples")
    if not 0.0 < alpha < 1.0 or n_boot < 1:
        raise ValueError(f"need 0 < alpha < 1 and n_boot >= 1, got alpha={alpha}, n_boot={n_boot}")
    d = x - y  # (n,)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))  # (n_boot, n): one draw per replicate, both systems
    # mean(a[idx]) - mean(b[idx]) == mean(d[idx]); taken on d so a constant difference stays exact
    diffs = d[idx].mean(axis=1)  # (n_boot,)
    low, high = np.quantile(diffs, [alpha / 2, 1 - alpha / 2])
    tie = np.abs(d) <= TIE_TOL
    return {
        "n": float(x.size),
        "a": float(x.mean()),
        "b": float(y.mean()),
        "diff": float(d.mean()),
        "low": float(low),
        "high": float(high),
        "a_better": float(np.mean((d > 0) & ~tie)),
        "b_better": float(np.mean((d < 0) & ~tie)),
        "tie": float(np.mean(tie)),
    } | (group_interval(d, groups, n_boot, alpha, seed) if groups is not None else {})


def group_interval(
    d: Sequence[float] | np.ndarray, groups: Sequence[str], n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> dict[str, float]:
    """The percentile interval of the mean per-sample difference `d` when whole groups are resampled.

    A cluster bootstrap: each replicate draws as many groups as there are, with replacement, and takes the
    mean over all samples of the groups drawn (a group's samples move together). Groups are numbered in
    order of first appearance; a sample whose group is "" is a group of its own. Fewer than two groups:
    ``{}`` (nothing to resample). Deterministic for a given `seed`.

    Returns:
        ``groups`` (how many), ``group_low``, ``group_high``.
    """
    x = np.asarray(d, dtype=np.float64)  # (n,)
    if len(groups) != x.size:
        raise ValueError(f"{x.size} samples but {len(groups)} group ids")
    index: dict[str, int] = {}
    ids = np.array([index.setdefault(g if g else f"\0{i}", len(index)) for i, g in enumerate(groups)], dtype=np.int64)
    if len(index) < 2:
        return {}
    sums = np.bincount(ids, weights=x, minlength=len(index))  # (G,)
    counts = np.bincount(ids, minlength=len(index)).astype(np.float64)  # (G,)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(index), size=(n_boot, len(index)))  # (n_boot, G): whole groups drawn
    means = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)  # (n_boot,)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return {"groups": float(len(index)), "group_low": float(low), "group_high": float(high)}


def win_tie_loss(
    verdicts: Sequence[Mapping[str, Any] | None], n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> dict[str, float]:
    """Counts and rates of the candidate against the reference, from verdicts with the candidate as ``"8b"``.

    A verdict that is None or whose ``better`` is not ``"8b"|"32b"|"same"`` counts as ``failed`` and is
    left out of the rates. Returns ``n`` (valid verdicts), ``failed``, ``win``, ``tie``, ``loss``,
    ``win_rate`` (wins / n) and ``score`` ((wins + ties / 2) / n), each rate with its bootstrap interval
    (``win_rate_low`` / ``win_rate_high``, ``score_low`` / ``score_high``); rates are absent when n = 0.
    """
    outcomes = [v.get("better") if isinstance(v, Mapping) else None for v in verdicts]
    valid = [o for o in outcomes if o in ("8b", "32b", "same")]
    wins = [1.0 if o == "8b" else 0.0 for o in valid]
    out: dict[str, float] = {
        "n": float(len(valid)),
        "failed": float(len(outcomes) - len(valid)),
        "win": float(sum(o == "8b" for o in valid)),
        "tie": float(sum(o == "same" for o in valid)),
        "loss": float(sum(o == "32b" for o in valid)),
    }
    if not valid:
        return out
    out["win_rate"], out["win_rate_low"], out["win_rate_high"] = bootstrap_ci(wins, n_boot, alpha, seed)
    scores = [1.0 if o == "8b" else 0.5 if o == "same" else 0.0 for o in valid]
    out["score"], out["score_low"], out["score_high"] = bootstrap_ci(scores, n_boot, alpha, seed)
    return out


# --- one system's metrics (queryrl eval) -----------------------------------------------------------


class LabelledTurn(Protocol):
    """What :func:`system_metrics` reads of a sample (:class:`~.eval.samples.Sample` is one)."""

    gold: list[str]
    kind: str


def _metric_values(ranked: Sequence[str], gold: Sequence[str], ks: Sequence[int]) -> dict[str, float]:
    values = {f"recall@{k}": recall_at_k(ranked, gold, k) for k in ks}
    values["mrr"] = mrr(ranked, gold)
    values.update({f"ndcg@{k}": ndcg_at_k(ranked, gold, k) for k in ks})
    return values


def _with_ci(
    per_sample: Sequence[Mapping[str, float]], keys: Sequence[str], n_boot: int, seed: int
) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in keys:
        mean, low, high = bootstrap_ci([v[key] for v in per_sample], n_boot, seed=seed)
        out[key], out[f"{key}_low"], out[f"{key}_high"] = mean, low, high
    return out


def system_metrics(
    ranked: Sequence[Sequence[str]],
    samples: Sequence[LabelledTurn],
    format_ok: Sequence[bool],
    dependent: Sequence[bool],
    ks: Sequence[int],
    n_boot: int,
    seed: int,
    abstained: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """One system's retrieval metrics with bootstrap intervals, ``format_ok``, ``by_kind`` and ``context_dependent``.

    Retrieval metrics cover the turns with gold only. `abstained` (per sample: the system gave an empty
    query; default none did) gives ``abstain_accuracy`` on the turns that need no retrieval and
    ``false_abstain`` on the turns with gold (:func:`abstain_metrics`); in ``by_kind`` a no-retrieval kind
    shows its ``n`` and ``abstain_accuracy``.

    Args:
        ranked: per sample, the system's result doc ids, best first.
        samples: per sample, its ``gold`` ids and ``kind``.
        format_ok: per sample, the system's answer parsed.
        dependent: per sample, the turn needs the history (``context_dependent`` covers these).
        ks: the cutoffs of recall@k and ndcg@k.
        n_boot, seed: the bootstrap of every interval.
        abstained: per sample, the system's query was empty.
    """
    scored = [
        (i, _metric_values(r, s.gold, ks)) for i, (r, s) in enumerate(zip(ranked, samples, strict=True)) if s.gold
    ]
    quiet = [no_retrieval_turn(s.gold, s.kind) for s in samples]
    empty = list(abstained) if abstained is not None else [False] * len(samples)
    out: dict[str, Any] = {
        "n": len(scored),
        "n_skipped": len(samples) - len(scored),
        "format_ok": float(np.mean(format_ok)),
        **abstain_metrics(empty, quiet, [bool(s.gold) for s in samples]),
    }
    quiet_kinds = sorted({s.kind for s, q in zip(samples, quiet, strict=True) if q})
    by_kind: dict[str, Any] = {}
    for kind in quiet_kinds:
        flags = [e for s, q, e in zip(samples, quiet, empty, strict=True) if q and s.kind == kind]
        by_kind[kind] = {"n": len(flags), "abstain_accuracy": float(np.mean(flags))}
    if by_kind:
        out["by_kind"] = by_kind
    if not scored:
        return out
    keys = list(scored[0][1])
    out.update(_with_ci([v for _, v in scored], keys, n_boot, seed))
    headline = (f"recall@{HEADLINE_K}", "mrr")

    def subset(members: list[dict[str, float]]) -> dict[str, float]:
        return {"n": len(members), **_with_ci(members, headline, n_boot, seed)} if members else {"n": 0}

    kinds = sorted({samples[i].kind for i, _ in scored if samples[i].kind})
    if kinds:
        by_kind.update({k: subset([v for i, v in scored if samples[i].kind == k]) for k in kinds})
        out["by_kind"] = dict(sorted(by_kind.items()))
    out["context_dependent"] = subset([v for i, v in scored if dependent[i]])
    return out


_JUDGE_NAMES = {"n": "judge_n", "failed": "judge_failed", "score": "judge_score"}


def judge_metrics(verdicts: Sequence[Mapping[str, Any] | None], n_boot: int, seed: int) -> dict[str, float]:
    """:func:`win_tie_loss` under the names of a system's metrics: ``judge_`` before ``n``, ``failed`` and
    ``score`` (and its interval), the rest (``win``, ``tie``, ``loss``, ``win_rate*``) as they are."""
    out: dict[str, float] = {}
    for key, value in win_tie_loss(verdicts, n_boot, seed=seed).items():
        base, _, suffix = key.partition("_")
        if key in _JUDGE_NAMES:
            out[_JUDGE_NAMES[key]] = value
        elif base == "score":
            out[f"judge_score_{suffix}"] = value
        else:
            out[key] = value
    return out


def format_table(rows: Mapping[str, Mapping[str, float | str]], digits: int = 3) -> str:
    """A markdown table, one row per system (in the given order), one column per metric (first-seen order).

    A metric a system lacks shows as ``-``; an int (a count) prints without decimals, a float (a rate or a
    mean) with `digits` decimals, a whole one too (``1.000``: a rate of 1 is not a count).
    """
    columns: list[str] = []
    for metrics in rows.values():
        columns += [key for key in metrics if key not in columns]
    lines = ["| system | " + " | ".join(columns) + " |", "| --- |" + " ---: |" * len(columns)]
    for system, metrics in rows.items():
        cells = [_cell(metrics.get(c), digits) for c in columns]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: float | str | None, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int):  # a count: 0 is "0", not "0.000"
        return str(value)
    return f"{value:.{digits}f}"  # a rate or a mean, whole or not: 1.000, not 1


# --- non-model baselines ------------------------------------------------------------------------


def _user_turns(contexts: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(m.get("content", "")).strip() for m in contexts if m.get("role") == "user"]


def raw_last_turn(contexts: Sequence[Mapping[str, Any]]) -> str:
    """The last user turn as it was typed: the no-rewrite baseline."""
    turns = _user_turns(contexts)
    if not turns:
        raise ValueError("contexts has no user turn")
    return turns[-1]


def last_k_turns(contexts: Sequence[Mapping[str, Any]], k: int = 3) -> str:
    """The last `k` USER turns, oldest first, joined by a space.

    User turns only: in sales dialogues the assistant's turns are long answers whose words swamp a
    search query, while the user's earlier turns carry the entities that pronouns and ellipsis in the
    current turn refer to (the usual "concatenate the previous questions" CQR baseline).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    turns = [t for t in _user_turns(contexts) if t]
    if not turns:
        raise ValueError("contexts has no user turn")
    return " ".join(turns[-k:])
