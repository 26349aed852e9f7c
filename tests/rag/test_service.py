from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pydantic
import pytest

from queryrl.rag import BM25Index, HeuristicRewriter, InProcessRAG
from tests.rag.helpers import IDS, PRONOUN_CONTEXTS, chat_8b_body

RESPONSE_KEYS = {"status", "response", "answer", "rewritten_query", "cost_time"}
DOC_KEYS = {"doc_id", "title", "content", "score"}


def chat_body(**extra: Any) -> dict[str, Any]:
    return {**IDS, "contexts": PRONOUN_CONTEXTS, "context": "", "thought_unit": "", "score_threshold": 0.0, **extra}


def check_schema(body: dict[str, Any]) -> None:
    assert set(body) == RESPONSE_KEYS
    assert body["status"] == "success"
    assert isinstance(body["answer"], str)
    assert isinstance(body["rewritten_query"], str)
    assert isinstance(body["cost_time"], float)
    assert body["cost_time"] >= 0
    for doc in body["response"]:
        assert set(doc) == DOC_KEYS
        assert 0.0 <= doc["score"] <= 1.0


def test_health(rag_url: str) -> None:
    body = httpx.get(f"{rag_url}/health").json()
    assert body == {"status": "ok", "documents": 20}


def test_chat_8b_retrieves_with_the_given_rewrite(rag_url: str) -> None:
    body = httpx.post(f"{rag_url}/rag/chat_8b", json=chat_8b_body()).json()
    check_schema(body)
    assert body["rewritten_query"] == "iPhone 15 多少钱"
    assert len(body["response"]) == 5  # top_k
    top = body["response"][0]
    assert top["doc_id"] == "iphone-price"
    assert top["score"] == 1.0  # normalised by the query's best score
    assert body["answer"] == top["content"]
    scores = [d["score"] for d in body["response"]]
    assert scores == sorted(scores, reverse=True)


def test_chat_rewrites_internally(rag_url: str) -> None:
    body = httpx.post(f"{rag_url}/rag/chat", json=chat_body()).json()
    check_schema(body)
    assert body["rewritten_query"] == "iphone 15 它多少钱？"  # the heuristic reference rewriter
    assert body["response"][0]["doc_id"] == "iphone-price"
    # `context` stands in for an empty `contexts`
    body = httpx.post(f"{rag_url}/rag/chat", json=chat_body(contexts=[], context="vivo X100 保修")).json()
    assert body["response"][0]["doc_id"] == "vivo-warranty"


def test_score_threshold_keeps_the_top_hit(rag_url: str) -> None:
    body = httpx.post(f"{rag_url}/rag/chat_8b", json=chat_8b_body(score_threshold=0.95)).json()
    assert [d["doc_id"] for d in body["response"]] == ["iphone-price"]  # the users' 0.95: top and near-ties
    empty = httpx.post(f"{rag_url}/rag/chat_8b", json=chat_8b_body(query="   ")).json()
    check_schema(empty)
    assert empty["response"] == []
    assert empty["answer"] == ""


@pytest.mark.parametrize(
    ("endpoint", "body", "field"),
    [
        ("chat_8b", {k: v for k, v in chat_8b_body().items() if k != "rewritten_query"}, "rewritten_query"),
        ("chat_8b", chat_8b_body(score_threshold=1.5), "score_threshold"),
        ("chat", {k: v for k, v in chat_body().items() if k != "tenant_id"}, "tenant_id"),
        ("chat", chat_body(contexts=[{"speaker": "user", "text": "hi"}]), "contexts"),
    ],
)
def test_validation_errors_are_422_naming_the_field(
    rag_url: str, endpoint: str, body: dict[str, Any], field: str
) -> None:
    response = httpx.post(f"{rag_url}/rag/{endpoint}", json=body)
    assert response.status_code == 422
    assert any(field in error["loc"] for error in response.json()["detail"])


def test_in_process_matches_http(rag_url: str, index: BM25Index) -> None:
    rag = InProcessRAG(index, HeuristicRewriter(), top_k=5)
    for endpoint, body in [("chat_8b", chat_8b_body()), ("chat", chat_body())]:
        over_http = httpx.post(f"{rag_url}/rag/{endpoint}", json=body).json()
        local = asyncio.run(getattr(rag, endpoint)(**body))
        check_schema(local)
        assert {**local, "cost_time": 0.0} == {**over_http, "cost_time": 0.0}
    with pytest.raises(pydantic.ValidationError, match="rewritten_query"):
        asyncio.run(rag.chat_8b(**IDS, contexts=[]))
