"""A run whose every step was skipped ends non-zero with one line, never "done" (issue 49, item 2): here every
sample fails at retrieval, against a real RAG service on loopback that answers every call with an error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.demo.data import sales_demo_rows
from queryrl.cli import app
from queryrl.testing.judge_server import running_server
from tests.helpers import small_run

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "query_rewrite_demo.yaml"


@pytest.fixture(scope="module")
def broken_rag() -> Iterator[tuple[str, dict[str, int]]]:
    """A RAG service that is up (``GET /health``) and answers every query ``{"status": "error"}``."""
    service = FastAPI()
    calls = {"chat_8b": 0, "chat": 0}

    @service.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "documents": 0}

    @service.post("/rag/chat_8b")
    async def chat_8b() -> dict[str, Any]:
        calls["chat_8b"] += 1
        return {"status": "error", "error": "the index is being rebuilt"}

    @service.post("/rag/chat")
    async def chat() -> dict[str, Any]:
        calls["chat"] += 1
        return {"status": "error", "error": "the index is being rebuilt"}

    with running_server(service) as url:
        yield url.removesuffix("/v1"), calls


@pytest.mark.slow
def test_a_run_whose_every_sample_fails_at_retrieval_exits_3_without_done(
    tmp_path: Path, model_cache: Path, broken_rag: tuple[str, dict[str, int]]
) -> None:
    url, calls = broken_rag
    # turns that need retrieval: every rewrite is sent to the service (none is settled by its label alone)
    rows = [r for r in sales_demo_rows("val") if r["extra_info"]["turn_type"] == "pronoun"][:4]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--config",
            str(DEMO),
            *small_run(tmp_path / "runs", model_cache),
            f"data.train_files=[{data}]",
            "trainer.total_steps=2",  # fewer than reward.max_skipped_steps=3: that rule alone never stops it
            "trainer.preflight=false",  # the preflight's RAG probe would stop it first
            f"app.query_rewrite.rag.url={url}",
            "app.query_rewrite.rag.max_retries=0",
            "app.query_rewrite.unparsed=retrieve",  # the untrained model's plain text is retrieved too
            "reward.max_retries=0",
            "reward.max_failed_frac=0.0",
        ],
    )
    assert result.exit_code == 3, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    assert errors[0].startswith("error: stopped: no step trained: the run took 2 steps (steps 1-2)"), errors[0]
    assert "the index is being rebuilt" in errors[0]
    assert "Traceback" not in result.output
    assert "done" not in result.output
    assert calls["chat_8b"] > 0
    run = tmp_path / "runs" / "demo"
    assert not (run / "checkpoints").exists()  # no "final" model that is the untouched start
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2  # both skipped steps are logged
