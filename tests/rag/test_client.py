from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from queryrl.rag import BM25Index, HeuristicRewriter, InProcessRAG, RAGClient, RAGError, RAGFailure, make_app
from queryrl.testing.judge_server import running_server
from tests.rag.helpers import chat_8b_body

OK_BODY = {"status": "success", "response": [], "answer": "", "rewritten_query": "q", "cost_time": 0.0}


def fields(query: str = "iPhone 15 多少钱") -> dict[str, Any]:
    return chat_8b_body(query)


def base(url: str) -> str:
    return url.removesuffix("/v1")


def test_both_calls_the_endpoints_in_parallel() -> None:
    state = {"in_flight": 0, "max_in_flight": 0}
    app = FastAPI()

    async def slow() -> dict[str, Any]:
        state["in_flight"] += 1
        state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        await asyncio.sleep(0.3)
        state["in_flight"] -= 1
        return OK_BODY

    app.post("/rag/chat_8b")(slow)
    app.post("/rag/chat")(slow)
    with running_server(app, max_lifetime_s=60) as url:
        client = RAGClient(base(url))

        async def run() -> tuple[Any, Any]:
            try:
                return await client.both(**fields())
            finally:
                await client.aclose()

        cand, ref = asyncio.run(run())
    assert cand == OK_BODY
    assert ref == OK_BODY
    assert state["max_in_flight"] == 2  # both requests were in the server at once


def test_reference_result_is_cached_per_prompt(index: BM25Index) -> None:
    app = make_app(index, HeuristicRewriter())
    with running_server(app, max_lifetime_s=60) as url:
        client = RAGClient(base(url))

        async def run() -> list[tuple[Any, Any]]:
            try:
                first = [await client.both(**fields("iPhone 15 多少钱"))]
                # a group of candidates for the same prompt, concurrently: one reference request in all
                group = await asyncio.gather(*(client.both(**fields(f"iPhone 15 价格 {i}")) for i in range(4)))
                return first + list(group)
            finally:
                await client.aclose()

        results = asyncio.run(run())
        assert app.state.requests == {"chat_8b": 5, "chat": 1}
        other = dict(fields(), message_id="m2")
        asyncio.run(
            client.chat(
                **{
                    k: v
                    for k, v in other.items()
                    if k in ("tenant_id", "contact_id", "account_id", "message_id", "contexts")
                }
            )
        )
        assert app.state.requests["chat"] == 2  # another prompt: another reference call
    refs = [ref for _, ref in results]
    assert all(ref == refs[0] for ref in refs)
    assert refs[0]["response"][0]["doc_id"] == "iphone-price"
    stats = client.pop_stats()
    assert stats["rag/calls"] == 11
    assert stats["rag/cache_hits"] == 4
    assert stats["rag/failed"] == 0
    assert stats["rag/latency_s"] > 0
    assert client.pop_stats()["rag/calls"] == 0  # popped


def test_retries_a_server_that_fails_twice() -> None:
    hits = {"n": 0}
    app = FastAPI()

    @app.post("/rag/chat_8b")
    async def flaky() -> Any:
        hits["n"] += 1
        if hits["n"] <= 2:
            return JSONResponse({"error": "boom"}, status_code=503)
        return OK_BODY

    with running_server(app, max_lifetime_s=60) as url:
        client = RAGClient(base(url), max_retries=2, backoff_base_s=0.01)
        assert asyncio.run(client.chat_8b(**fields())) == OK_BODY
        assert hits["n"] == 3
        stats = client.pop_stats()
        assert (stats["rag/requests"], stats["rag/retries"], stats["rag/failed"]) == (3, 2, 0)

        hits["n"] = 0
        client = RAGClient(base(url), max_retries=1, backoff_base_s=0.01)
        with pytest.raises(RAGError, match="HTTP 503"):
            asyncio.run(client.chat_8b(**fields()))
        assert hits["n"] == 2


def test_client_errors_are_not_retried(rag_url: str) -> None:
    client = RAGClient(rag_url, max_retries=2, backoff_base_s=0.01)
    bad = {k: v for k, v in fields().items() if k != "rewritten_query"}
    with pytest.raises(RAGError, match=r"422.*rewritten_query"):
        asyncio.run(client.chat_8b(**bad))
    stats = client.pop_stats()
    assert (stats["rag/requests"], stats["rag/failed"]) == (1, 1)


def test_documents_under_other_field_names_fail_the_call_naming_them() -> None:
    """A service whose documents say knowledge_id/question/answer: each call fails, naming what is missing."""
    app = FastAPI()
    doc = {"knowledge_id": "k1", "question": "颐和园门票多少钱", "answer": "30元", "score": 1.2}

    @app.post("/rag/chat_8b")
    async def other_names() -> Any:
        return {**OK_BODY, "response": [doc]}

    @app.post("/rag/chat")
    async def no_list() -> Any:
        return {"status": "success", "docs": [doc]}

    with running_server(app, max_lifetime_s=60) as url:
        client = RAGClient(base(url), max_retries=2, backoff_base_s=0.01)
        with pytest.raises(RAGError) as caught:
            asyncio.run(client.chat_8b(**fields()))
        assert "document 0 of 'response' lacks doc_id, title, content" in str(caught.value)
        assert "(it has: answer, knowledge_id, question, score)" in str(caught.value)
        cand, ref = asyncio.run(client.both(**fields()))
        assert isinstance(cand, RAGFailure)
        assert isinstance(ref, RAGFailure)
        assert "no 'response' list of documents (its keys: docs, status)" in ref.error
        assert client.pop_stats()["rag/retries"] == 0  # a broken contract is not retried


def test_a_field_mapping_reads_documents_under_other_names() -> None:
    """app.query_rewrite.rag.document_fields maps the service's names to ours; a wrong map still fails loudly."""
    app = FastAPI()
    doc = {"knowledge_id": 17, "question": "颐和园门票多少钱", "answer": "30元", "score": 1.2}

    @app.post("/rag/chat_8b")
    async def other_names() -> Any:
        return {**OK_BODY, "response": [doc]}

    mapping = {"doc_id": "knowledge_id", "title": "question", "content": "answer"}
    with running_server(app, max_lifetime_s=60) as url:
        result = asyncio.run(RAGClient(base(url), document_fields=mapping).chat_8b(**fields()))
        (got,) = result["response"]
        assert (got["doc_id"], got["title"], got["content"]) == ("17", "颐和园门票多少钱", "30元")
        assert got["knowledge_id"] == 17  # the service's own keys are kept
        wrong = RAGClient(base(url), document_fields={"doc_id": "id", "title": "question", "content": "answer"})
        with pytest.raises(RAGError) as caught:
            asyncio.run(wrong.chat_8b(**fields()))
        assert "lacks doc_id after app.query_rewrite.rag.document_fields" in str(caught.value)
    with pytest.raises(ValueError, match="unknown field 'text'"):
        RAGClient("http://127.0.0.1:1", document_fields={"text": "answer"})
    with pytest.raises(ValueError, match=r"document_fields\.title: the service's field name must be"):
        RAGClient("http://127.0.0.1:1", document_fields={"title": ""})


def test_the_service_check_finds_a_broken_contract_before_training() -> None:
    """One request per endpoint with a row's fields, checked as training checks every answer."""
    from queryrl.apps.query_rewrite.config import QueryRewriteRAGConfig
    from queryrl.apps.query_rewrite.eval.checks import ServiceCheckFailed, check_rag_endpoint

    app = FastAPI()
    doc = {"knowledge_id": "k1", "question": "颐和园门票多少钱", "answer": "30元"}
    seen: list[dict[str, Any]] = []

    @app.post("/rag/chat")
    async def other_names(request: Request) -> Any:
        seen.append(await request.json())
        return {**OK_BODY, "response": [doc]}

    @app.post("/needs_ids/rag/chat")
    async def picky() -> Any:
        return JSONResponse({"detail": "tenant_id required"}, status_code=422)

    info = {**chat_8b_body(), "kind": "price"}
    with running_server(app, max_lifetime_s=60) as url:
        rag = QueryRewriteRAGConfig(url=base(url), timeout_s=5.0, max_retries=0)
        with pytest.raises(ServiceCheckFailed, match="lacks doc_id, title, content"):
            check_rag_endpoint(rag, "chat", info, "row 0")
        rag.document_fields = {"doc_id": "knowledge_id", "title": "question", "content": "answer"}
        assert "with row 0 answered 1 documents" in check_rag_endpoint(rag, "chat", info, "row 0")
        rag.url = base(url) + "/needs_ids"
        with pytest.raises(ServiceCheckFailed, match=r"POST .*/needs_ids/rag/chat with row 0: HTTP 422"):
            check_rag_endpoint(rag, "chat", info, "row 0")
    ids = {k: info[k] for k in ("tenant_id", "contact_id", "account_id", "message_id")}
    assert seen[0] == {**ids, "contexts": info["contexts"]}  # /rag/chat gets the row's ids and conversation


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_service_that_is_down_gives_failures_quickly() -> None:
    client = RAGClient(f"http://127.0.0.1:{free_port()}", timeout_s=1, max_retries=2, backoff_base_s=0.05)
    start = time.perf_counter()
    cand, ref = asyncio.run(client.both(**fields()))
    assert time.perf_counter() - start < 3.0
    assert isinstance(cand, RAGFailure)
    assert cand.endpoint == "chat_8b"
    assert isinstance(ref, RAGFailure)
    assert ref.endpoint == "chat"
    assert "ConnectError" in cand.error
    stats = client.pop_stats()
    assert (stats["rag/failed"], stats["rag/requests"], stats["rag/cache_hits"]) == (2, 6, 0)


def test_a_slow_service_times_out_into_a_failure() -> None:
    app = FastAPI()

    @app.post("/rag/chat")
    async def slow() -> dict[str, Any]:
        await asyncio.sleep(2.0)
        return OK_BODY

    @app.post("/rag/chat_8b")
    async def fast() -> dict[str, Any]:
        return OK_BODY

    with running_server(app, max_lifetime_s=60) as url:
        client = RAGClient(base(url), timeout_s=0.2, max_retries=0)
        start = time.perf_counter()
        cand, ref = asyncio.run(client.both(**fields()))
        assert time.perf_counter() - start < 1.5
    assert cand == OK_BODY
    assert isinstance(ref, RAGFailure)
    assert "Timeout" in ref.error


def test_in_process_client_matches_http(rag_url: str, index: BM25Index) -> None:
    http = RAGClient(rag_url)
    local = RAGClient(InProcessRAG(index, HeuristicRewriter(), top_k=5))
    got_http = asyncio.run(http.both(**fields()))
    got_local = asyncio.run(local.both(**fields()))
    for a, b in zip(got_http, got_local, strict=True):
        assert isinstance(a, dict)
        assert isinstance(b, dict)
        assert {**a, "cost_time": 0} == {**b, "cost_time": 0}
    bad = {k: v for k, v in fields().items() if k != "rewritten_query"}
    cand, _ = asyncio.run(local.both(**bad))
    assert isinstance(cand, RAGFailure)
    assert "rewritten_query" in cand.error
    assert httpx.get(f"{rag_url}/health").status_code == 200


def test_a_bad_field_mapping_in_the_config_is_one_message() -> None:
    from queryrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"app\.query_rewrite\.rag\.document_fields: unknown field 'text'"):
        load_config(None, ["app.query_rewrite.enable=true", "+app.query_rewrite.rag.document_fields.text=answer"])
    cfg = load_config(None, ["app.query_rewrite.enable=true", "+app.query_rewrite.rag.document_fields.doc_id=kid"])
    assert dict(cfg.app.query_rewrite.rag.document_fields) == {"doc_id": "kid"}
