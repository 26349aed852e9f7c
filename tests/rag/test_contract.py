"""The RAG response contract (docs/your-data.md): ``"status": "success"``, and documents whose ``doc_id`` is a
non-empty string, ``title``/``content`` strings and ``score`` (when present) a number. A reply that breaks it
fails the call with one line naming the field, its value and what was expected."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi import FastAPI

from queryrl.rag import RAGClient, RAGError
from queryrl.rag.client import contract_problem, map_document_fields
from queryrl.testing.judge_server import running_server
from tests.rag.helpers import chat_8b_body

DOC = {"doc_id": "d1", "title": "颐和园门票", "content": "30元", "score": 0.9}


def body(**changes: Any) -> dict[str, Any]:
    return {"status": "success", "response": [{**DOC, **changes}], "answer": "", "rewritten_query": "q"}


def test_a_valid_answer_passes() -> None:
    assert contract_problem(body()) is None
    assert contract_problem(body(title="", content="")) is None  # empty text is text
    assert contract_problem({"status": "success", "response": []}) is None
    no_score = body()
    del no_score["response"][0]["score"]
    assert contract_problem(no_score) is None


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"response": [DOC]}, "field 'status' is missing (expected \"success\")"),
        ({"status": None, "response": [DOC]}, "field 'status' is null (expected \"success\")"),
        (
            {"status": "error", "error": "tenant unknown"},
            'field \'status\' is "error" (expected "success"); its \'error\': "tenant unknown"',
        ),
        (body(doc_id=None), "document 0 of 'response': field 'doc_id' is null (expected a non-empty string)"),
        (body(doc_id=""), "document 0 of 'response': field 'doc_id' is \"\" (expected a non-empty string)"),
        (body(doc_id=17), "document 0 of 'response': field 'doc_id' is 17 (expected a non-empty string)"),
        (body(title=None), "document 0 of 'response': field 'title' is null (expected a string)"),
        (body(content=["a"]), "document 0 of 'response': field 'content' is [\"a\"] (expected a string)"),
        (body(score="0.9"), "document 0 of 'response': field 'score' is \"0.9\" (expected a number)"),
        (body(score=None), "document 0 of 'response': field 'score' is null (expected a number)"),
        (body(score=True), "document 0 of 'response': field 'score' is true (expected a number)"),
    ],
)
def test_each_violation_is_one_line_naming_field_value_and_expectation(answer: Any, expected: str) -> None:
    assert contract_problem(answer) == expected


def test_after_mapping_an_integer_id_is_a_string_and_a_null_one_is_named() -> None:
    mapping = {"doc_id": "knowledge_id", "title": "question", "content": "answer"}
    theirs = {"status": "success", "response": [{"knowledge_id": 17, "question": "q", "answer": "a"}]}
    mapped = map_document_fields(theirs, mapping)
    assert mapped["response"][0]["doc_id"] == "17"
    assert contract_problem(mapped, mapping) is None
    null = {"status": "success", "response": [{"knowledge_id": None, "question": None, "answer": "a"}]}
    problem = contract_problem(map_document_fields(null, mapping), mapping)
    assert problem == (
        "document 0 of 'response': field 'doc_id' (the service's 'knowledge_id' by document_fields) is null "
        "(expected a non-empty string)"
    )


def test_the_client_fails_a_reply_without_status_or_with_null_documents_naming_the_field() -> None:
    app = FastAPI()
    hits = {"n": 0}

    @app.post("/rag/chat_8b")
    async def no_status() -> Any:
        hits["n"] += 1
        return {"response": [DOC]}

    @app.post("/rag/chat")
    async def nulls() -> Any:
        return body(doc_id=None, title=None, content=None)

    with running_server(app, max_lifetime_s=60) as url:
        client = RAGClient(url.removesuffix("/v1"), max_retries=2, backoff_base_s=0.01)
        with pytest.raises(RAGError) as caught:
            asyncio.run(client.chat_8b(**chat_8b_body("iPhone 15 多少钱")))
        assert caught.value.error == "field 'status' is missing (expected \"success\")"
        assert hits["n"] == 1  # a broken contract is not retried
        ref = {k: v for k, v in chat_8b_body("x").items() if k in ("tenant_id", "contact_id", "contexts")}
        with pytest.raises(RAGError, match=r"field 'doc_id' is null \(expected a non-empty string\)"):
            asyncio.run(client.chat(**ref, account_id="a", message_id="m"))
    assert client.pop_stats()["rag/failed"] == 2
