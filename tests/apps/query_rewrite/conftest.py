"""Fixtures of the query-rewrite tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request

from queryrl.apps.query_rewrite.demo.data import sales_demo_corpus
from queryrl.rag import BM25Index, Document, HeuristicRewriter, InProcessRAG
from queryrl.testing.judge_server import running_server


@pytest.fixture(scope="module")
def recording_rag() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A real HTTP RAG service (the embedded one behind FastAPI) that keeps every /rag/chat_8b body."""
    rag = InProcessRAG(
        BM25Index([Document(d["doc_id"], d["title"], d["content"]) for d in sales_demo_corpus()]),
        HeuristicRewriter(),
        top_k=5,
    )
    bodies: list[dict[str, Any]] = []
    service = FastAPI()

    @service.post("/rag/chat_8b")
    async def chat_8b(request: Request) -> dict[str, Any]:
        body = await request.json()
        bodies.append(body)
        return await rag.chat_8b(**body)

    @service.post("/rag/chat")
    async def chat(request: Request) -> dict[str, Any]:
        return await rag.chat(**await request.json())

    with running_server(service) as url:
        yield url.removesuffix("/v1"), bodies
