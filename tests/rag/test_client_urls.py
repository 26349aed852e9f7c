"""The RAG client's URL forms: a service root (``/rag/<endpoint>``) or a ``{endpoint}`` template (the users'
``http://host:8000/chat_8b``-style endpoints), against a real service on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

from queryrl.rag import BM25Index, Document, HeuristicRewriter, RAGClient, RAGFailure, make_app
from queryrl.rag.client import endpoint_url
from queryrl.testing.judge_server import running_server


def _under(prefix: str, app: Any) -> Any:
    """`app` (which serves ``/rag/chat_8b``, ``/rag/chat``) answering at ``<prefix>/chat_8b``, ``<prefix>/chat``."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(prefix + "/"):
            path = "/rag" + scope["path"][len(prefix) :]
            scope = {**scope, "path": path, "raw_path": path.encode()}
        elif scope["type"] == "http" and scope["path"].startswith("/rag/"):
            scope = {**scope, "path": "/gone", "raw_path": b"/gone"}  # only the prefixed paths exist
        await app(scope, receive, send)

    return asgi


def test_endpoint_url_forms() -> None:
    assert endpoint_url("http://h:8000", "chat_8b") == "http://h:8000/rag/chat_8b"
    assert endpoint_url("http://h:8000/", "chat") == "http://h:8000/rag/chat"
    assert endpoint_url("http://h:8000/{endpoint}", "chat_8b") == "http://h:8000/chat_8b"
    assert endpoint_url("http://h/api/v2/{endpoint}/", "chat") == "http://h/api/v2/chat"


def test_a_template_url_reaches_a_service_without_the_rag_prefix(corpus: list[Document]) -> None:
    app = make_app(BM25Index(corpus), HeuristicRewriter(), top_k=3)
    fields: dict[str, Any] = {
        "tenant_id": "t",
        "contact_id": "c",
        "account_id": "a",
        "message_id": "m1",
        "contexts": [{"role": "user", "content": "小米 14 多少钱？"}],
        "rewritten_query": "小米 14 价格",
    }
    with running_server(_under("/api", app)) as url:
        base = url.removesuffix("/v1")
        cand, ref = asyncio.run(RAGClient(f"{base}/api/{{endpoint}}", max_retries=0).both(**fields))
        assert not isinstance(cand, RAGFailure), cand
        assert not isinstance(ref, RAGFailure), ref
        assert cand["response"][0]["doc_id"] == "xiaomi-price"
        assert app.state.requests == {"chat_8b": 1, "chat": 1}
        cand, _ = asyncio.run(RAGClient(base, max_retries=0).both(**fields))  # the root form posts to /rag/...
        assert isinstance(cand, RAGFailure)
        assert "404" in cand.error
