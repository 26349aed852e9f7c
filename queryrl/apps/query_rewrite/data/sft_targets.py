"""SFT targets for the warm start: a reference rewrite in the policy's answer format.

Before RL the policy must first answer in the JSON format at all (a random or generic model
rarely does). The usual warm start distils a reference pipeline. Where the targets come from, in order:

- your own pipeline's rewrites, as a column of the export (``prepare conversations --rewrite-column
  改写query``: the row's ``extra_info.reference_rewrite``, used as it is);
- your RAG service's ``/rag/chat`` (``app.query_rewrite.sft_target=rag_chat``: ``queryrl sft`` asks it for each
  row and takes its ``rewritten_query``, :func:`~.sft_rag.rag_chat_targets`);
- otherwise queryrl's own heuristic rewriter (:class:`~queryrl.rag.HeuristicRewriter`, the rewriter of the
  embedded ``/rag/chat``; not your pipeline: it knows no product names beyond a few patterns and may keep one
  product of two), cleaned up as below.

Each row records which in ``extra_info.sft_target_source``; ``queryrl sft`` prints the counts. The heuristic's
target is its query as ``{"rewritten_query": ...}``, with exactly the fields the row's prompt
asked for (``extra_info.answer_fields``; default only the query): where it asked for ``user_profile`` and
``history_summary`` too, they are carried over from the input. (Carrying the CRM summary made the sales
demo's targets 36.9 tokens long on average with the tiny model's tokenizer, most of them the copied
summary; query-only, 12.9.) Where the reference
prepends terms carried from the history to the current turn, the target is cleaned up in two ways:

- the turn comes first and the carried terms after it (retrieval scores a bag of words, so the
  order changes nothing there), so the answer starts by copying the turn that ends the prompt, at
  a fixed distance from the answer, which a small model learns far sooner than finding it behind a
  variable number of terms;
- carried numbers (prices, capacities: ``8498``, ``97wh``) are dropped: they are not names, and
  they point retrieval at the document that mentioned them. On the sales demo's test split this
  raises the targets' Recall@5 (measured on the earlier, copy-the-document demo data: 0.849 -> 0.879).

Turns that need no retrieval get an EMPTY query: where the row is labelled (empty gold and a kind in
:data:`~queryrl.apps.query_rewrite.metrics.NO_RETRIEVAL_KINDS`, as in the sales demo's ``chitchat``
turns) from the label, otherwise when the reference rewriter abstains (the heuristic's small-talk
list). A labelled retrieval turn never gets an empty target: where the reference abstained there, the
target is the turn itself. ``queryrl sft`` reads the target from ``extra_info.sft_target``. RL then
has to beat the reference, not copy it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from queryrl.apps.query_rewrite.metrics import no_retrieval_turn
from queryrl.apps.query_rewrite.prompts import NO_QUERY, QUERY_FIELD, check_answer_fields
from queryrl.rag import HeuristicRewriter
from queryrl.rag.rewriters import last_user_turn

SFT_TARGET_KEY = "sft_target"  # in extra_info
SFT_SOURCE_KEY = "sft_target_source"  # in extra_info: where the target came from (queryrl sft prints the counts)
REWRITE_KEY = "reference_rewrite"  # in extra_info: the export's own rewrite of the turn
HEURISTIC_SOURCE = "queryrl's heuristic rewriter (HeuristicRewriter, not your pipeline)"
_MEASURE = re.compile(r"[\d.]+[a-z]{0,3}")  # a number, maybe with a unit: 8498, 97wh, 1.4


class SyncRewriter(Protocol):
    """A rewriter with a synchronous ``rewrite_sync`` (:class:`~queryrl.rag.HeuristicRewriter`)."""

    def rewrite_sync(self, contexts: Sequence[Mapping[str, Any]], history_summary: str = "") -> str: ...


def reference_target(
    extra_info: Mapping[str, Any], rewriter: SyncRewriter | None = None, retrieve: bool | None = None
) -> str:
    """The answer the reference rewriter gives for one row's ``extra_info`` (:func:`render_answer`).

    Args:
        extra_info: the row's ``contexts``, ``user_profile``, ``history_summary`` and ``answer_fields`` (the
            keys of the answer, in order; absent: only ``rewritten_query``).
        rewriter: default a plain :class:`~queryrl.rag.HeuristicRewriter`; e.g. one with the corpus's
            entity dictionary (``HeuristicRewriter(title_entities(docs), latin_entities=False)`` for KdConv).
        retrieve: the row's label: False (needs no retrieval: an empty query), True (needs retrieval: never
            an empty query), None (unlabelled: the rewriter decides).
    """
    rewriter = rewriter or HeuristicRewriter()
    contexts = list(extra_info.get("contexts") or [])
    summary = str(extra_info.get("history_summary") or "")
    query = "" if retrieve is False else rewriter.rewrite_sync(contexts, summary)
    last = last_user_turn(contexts)[1].strip()
    if retrieve and not query:
        query = last
    if last and query != last and query.endswith(last):  # carried terms + the turn -> the turn + the terms
        terms = [t for t in query[: -len(last)].split() if not _MEASURE.fullmatch(t)]
        query = " ".join([last, *terms])
    carried = {
        QUERY_FIELD: query,
        "user_profile": str(extra_info.get("user_profile") or ""),
        "history_summary": summary,
    }
    return render_answer(carried, extra_info)


def render_answer(carried: Mapping[str, str], extra_info: Mapping[str, Any]) -> str:
    """The answer the row's prompt asks for, made of `carried` (``rewritten_query`` and the other fields):
    the JSON object of ``extra_info.answer_fields``, or for ``answer_format="text"`` the query itself
    (:data:`~.prompts.NO_QUERY` in the row's language when it is empty)."""
    if extra_info.get("answer_format") == "text":
        query = str(carried[QUERY_FIELD]).strip()
        lang = "en" if str(extra_info.get("lang") or "") == "en" else "zh"
        return query or NO_QUERY[lang]
    answer = {key: carried[key] for key in check_answer_fields(extra_info.get("answer_fields"))}
    return json.dumps(answer, ensure_ascii=False)


def carried_answer(query: str, extra_info: Mapping[str, Any]) -> str:
    """:func:`render_answer` of a reference pipeline's `query` (as it is; :data:`~.prompts.NO_QUERY` = none)
    with the row's own profile and summary."""
    query = query.strip()
    carried = {
        QUERY_FIELD: "" if query in NO_QUERY.values() else query,
        "user_profile": str(extra_info.get("user_profile") or ""),
        "history_summary": str(extra_info.get("history_summary") or ""),
    }
    return render_answer(carried, extra_info)


def add_sft_targets(
    rows: list[dict[str, Any]], rewriter: SyncRewriter | None = None, rewrite_source: str = ""
) -> list[dict[str, Any]]:
    """`rows` with ``extra_info.sft_target`` and ``sft_target_source`` set (rows are changed in place): the
    row's ``extra_info.reference_rewrite`` where it has one (labelled `rewrite_source`, e.g. ``column
    '改写query' of the export``), else :func:`reference_target` with `rewriter` (default a plain
    :class:`~queryrl.rag.HeuristicRewriter`, labelled :data:`HEURISTIC_SOURCE`)."""
    fallback = HEURISTIC_SOURCE if rewriter is None else f"reference rewriter {type(rewriter).__name__}"
    if rewrite_source:
        fallback += f", where {rewrite_source} has no rewrite"
    rewriter = rewriter or HeuristicRewriter()
    for row in rows:
        info = row.setdefault("extra_info", {})
        given = str(info.get(REWRITE_KEY) or "").strip()
        if given:
            info[SFT_TARGET_KEY], info[SFT_SOURCE_KEY] = carried_answer(given, info), rewrite_source or REWRITE_KEY
            continue
        truth = (row.get("reward_model") or {}).get("ground_truth")
        gold = list((truth.get("gold_doc_ids") if isinstance(truth, Mapping) else truth) or [])
        kind = info.get("kind") or info.get("turn_type")
        retrieve = True if gold else False if no_retrieval_turn(gold, kind) else None
        info[SFT_TARGET_KEY], info[SFT_SOURCE_KEY] = reference_target(info, rewriter, retrieve), fallback
    return rows


def sources_line(rows: Sequence[Mapping[str, Any]]) -> str:
    """``SFT targets: A (312 rows), B (13 rows)``: where the rows' targets came from, most first."""
    counts = Counter(str((r.get("extra_info") or {}).get(SFT_SOURCE_KEY) or "none") for r in rows)
    return "SFT targets: " + (", ".join(f"{where} ({n} rows)" for where, n in counts.most_common()) or "no rows")
