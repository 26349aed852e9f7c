"""``app.query_rewrite.sft_target=rag_chat``: ``queryrl sft``'s targets from the RAG service's ``/rag/chat``.

Your reference pipeline (the service at ``app.query_rewrite.rag.url``) rewrites each training row's turn as it
does for the reward's reference side, with the same request (the reward's
:func:`~queryrl.apps.query_rewrite.reward.rag.rag_request_fields`); its ``rewritten_query`` is the target, in the
answer format the row's prompt asked for (:func:`~.sft_targets.carried_answer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from queryrl.apps.query_rewrite.config import QueryRewriteRAGConfig
from queryrl.apps.query_rewrite.data.sft_targets import carried_answer
from queryrl.apps.query_rewrite.reward.rag import make_rag_client, rag_request_fields
from queryrl.data.records import DataError
from queryrl.rag import RAGError
from queryrl.rag.client import CHAT_FIELDS


def rag_chat_targets(
    source: str, rows: Sequence[tuple[int, Mapping[str, Any]]], rag: QueryRewriteRAGConfig, concurrency: int = 8
) -> list[tuple[str, str] | None]:
    """Per row of `rows` ((index in the file `source`, row)), the answer made of the ``rewritten_query`` that
    ``/rag/chat`` of the service `rag` returns for it (:func:`carried_answer`) and where it came from; None where
    the answer has no non-empty ``rewritten_query`` (the row keeps its own). The request is the reward's
    (:func:`~queryrl.apps.query_rewrite.reward.rag.rag_request_fields`), at most `concurrency` at once.

    Raises:
        DataError: a call that failed after its retries, naming the file and the row.
    """
    where = f"rewritten_query of /rag/chat at {rag.url}" if rag.url else "rewritten_query of the embedded /rag/chat"
    client = make_rag_client(rag)

    async def one(index: int, row: Mapping[str, Any], gate: asyncio.Semaphore) -> tuple[str, str] | None:
        info = row.get("extra_info") or {}
        fields = {k: v for k, v in rag_request_fields(info, "").items() if k in CHAT_FIELDS}
        async with gate:
            try:
                answer = await client.chat(**fields)
            except RAGError as exc:
                raise DataError(
                    f"{source}: row {index}: app.query_rewrite.sft_target=rag_chat: /rag/chat failed: {exc.error}"
                ) from None
        query = answer.get("rewritten_query")
        return (carried_answer(query, info), where) if isinstance(query, str) and query.strip() else None

    async def every() -> list[tuple[str, str] | None]:
        gate = asyncio.Semaphore(concurrency)
        try:
            return list(await asyncio.gather(*(one(i, r, gate) for i, r in rows)))
        finally:
            await client.aclose()

    return asyncio.run(every())
