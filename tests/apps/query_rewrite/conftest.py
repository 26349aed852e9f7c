"""Fixtures of the query-rewrite tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from queryrl.apps.query_rewrite.demo.data import sales_demo_corpus
from queryrl.rag import BM25Index, Document, HeuristicRewriter, InProcessRAG
from queryrl.testing.judge_server import running_server
from tests.apps.query_rewrite.helpers import pronoun_rows

DEMO = Path(__file__).resolve().parents[3] / "configs" / "query_rewrite_demo.yaml"


@pytest.fixture(scope="session")
def json_model(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Path:
    """The demo's tiny model after a short SFT on the 16 rows of
    :func:`~tests.apps.query_rewrite.helpers.pronoun_rows`: it answers in the JSON format.

    Built once per session (per xdist worker) and only read by the tests that use it (as ``model.path``, a
    frozen reference rewriter): each test trains into a folder of its own."""
    from queryrl.config import load_config
    from queryrl.trainer.sft import run_sft

    tmp = tmp_path_factory.mktemp("json_model")
    rows = tmp / "rows.jsonl"
    rows.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in pronoun_rows()), encoding="utf-8")
    overrides = [
        f"model.cache_dir={model_cache}",
        f"trainer.output_dir={tmp}",
        f"data.train_files=[{rows}]",
        "data.val_files=[]",
        "trainer.logger=[jsonl]",
        "trainer.plot=false",
        "sft.max_steps=120",  # the answers carry the CRM summary: 60 steps left most unparseable
        "sft.lr=5e-3",
        "sft.lr_schedule=constant",
        "sft.warmup_steps=0",
        "sft.batch_size=8",
        "sft.micro_batch_size=8",
        f"sft.output_dir={tmp / 'sft'}",
    ]
    return run_sft(load_config(DEMO, overrides))


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
