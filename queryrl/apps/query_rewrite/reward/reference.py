"""The reference pipeline's own rewrite of a turn, scored under the run's reward: the reward's ``reference_score``.

``algo.adv_estimator=grpo_reference`` (:func:`queryrl.algos.advantages.grpo_reference`) counts that score in each
group's mean and standard deviation, so a group whose samples all score alike (four rewrites that retrieve the same
documents) still learns where the reference pipeline scores otherwise. The reference's rewrite is the
``rewritten_query`` of the RAG service's ``/rag/chat`` answer, the one the judge compares every candidate with, and
it is scored exactly as the policy's reply would be had it written that rewrite (:class:`~.score.QueryRewriteReward`):
every component, the judge's included, which then compares the reference's documents with themselves (a tie, but
not a zero: the users' quality mapping gives a tie 0.5-0.7 by how good the documents are). It costs one more
candidate call and one more judge call a prompt, shared by the prompt's samples like any identical rewrite's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from queryrl.apps.query_rewrite.config import QueryRewriteRAGConfig
from queryrl.apps.query_rewrite.reward.calls import RewardFailure
from queryrl.apps.query_rewrite.reward.rag import fetch_depth, rag_client, rag_request_fields
from queryrl.rag import RAGError
from queryrl.rag.client import CHAT_FIELDS


def reference_reply(query: str, answer_format: Any) -> str:
    """The reference's rewrite as the policy answers: the query itself for a ``text`` row, else the JSON answer."""
    return query if answer_format == "text" else json.dumps({"rewritten_query": query}, ensure_ascii=False)


async def reference_query(rag: QueryRewriteRAGConfig, info: Mapping[str, Any], out: Mapping[str, Any]) -> str:
    """The reference's rewrite of the row `info`: the one the reward just retrieved with (`out`'s
    ``reference_query``), else, where the sample made no RAG call (it abstained or did not parse), ``/rag/chat``'s.

    Raises:
        RewardFailure: ``/rag/chat`` failed, or its answer has no ``rewritten_query`` field (an empty one is the
            reference abstaining, scored as such).
    """
    query = out.get("reference_query")
    if query is None:
        fields = {k: v for k, v in rag_request_fields(info, "").items() if k in CHAT_FIELDS}
        try:
            answer = await rag_client(rag, fetch_depth(rag)).chat(**fields)
        except RAGError as exc:
            raise RewardFailure(f"RAG /rag/chat failed: {exc.error}") from None
        if "rewritten_query" not in answer:
            raise RewardFailure(
                "algo.adv_estimator=grpo_reference scores the reference's rewrite, and /rag/chat returned no "
                "rewritten_query for this row"
            )
        query = answer["rewritten_query"]
    return str(query or "")  # empty: the reference abstained, and is scored so
