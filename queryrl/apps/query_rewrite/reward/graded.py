"""The query-rewrite reward's graded retrieval component (``weights.retrieval_graded``) as the reward computes it.

The pure reward is :func:`~queryrl.apps.query_rewrite.reward.modes.retrieval_graded_reward`; this module reads
its inputs from a RAG answer and a row: the documents' scores, the length budget (the turn and the reference's
query) and the offline intent verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from queryrl.apps.query_rewrite.reward.calls import RewardFailure
from queryrl.apps.query_rewrite.reward.modes import GRADED_LENGTH_SLACK, length_factor, retrieval_graded_reward
from queryrl.apps.query_rewrite.reward.rag import row_contexts
from queryrl.rag.rewriters import last_user_turn


def length_budget(info: Mapping[str, Any], reference_query: str) -> int:
    """The characters a rewrite may use before :func:`~.modes.length_factor` cuts its graded reward:
    :data:`~.modes.GRADED_LENGTH_SLACK` times the longer of the row's last user turn and `reference_query`."""
    turn = last_user_turn(row_contexts(info))[1]
    return round(GRADED_LENGTH_SLACK * max(len(turn.strip()), len(reference_query.strip())))


def graded_component(
    query: str,
    ranked: list[dict[str, Any]],
    gold: list[str],
    info: Mapping[str, Any],
    reference_query: str,
    intent: Any,
) -> float:
    """:func:`~.modes.retrieval_graded_reward` of the candidate's `ranked` documents (to ``rag.rank_depth``),
    with the length budget :func:`length_budget` and the offline intent verdict `intent` (None: nothing to check
    against, counted as kept).

    Raises:
        RewardFailure: a document without a numeric ``score`` (the margin needs the service's scores).
    """
    raw = [d.get("score") for d in ranked]
    scores = [float(v) for v in raw if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(scores) != len(raw):
        raise RewardFailure(
            "app.query_rewrite.weights.retrieval_graded is set but the RAG service's documents carry no numeric "
            "'score' (map it with rag.document_fields, or leave the weight at 0)"
        )
    factor = length_factor(len(query), length_budget(info, reference_query))
    kept = intent is None or bool(intent.kept)
    graded = retrieval_graded_reward([str(d.get("doc_id")) for d in ranked], scores, gold, factor, kept)
    assert graded is not None  # gold is non-empty here
    return graded
