"""A RAG service over the sales demo's catalogue and a strict OpenAI-compatible judge, both on 127.0.0.1,
for the tests that run the users' own path end to end (docs/your-data.md's recipe, the users' launch script)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from queryrl.apps.query_rewrite.demo.data import sales_demo_corpus
from queryrl.rag import BM25Index, Document, HeuristicRewriter
from queryrl.rag import make_app as make_rag_app
from queryrl.testing.judge_server import make_app as make_judge_app
from queryrl.testing.judge_server import running_server

CHAT_8B_REQUEST: dict[str, Any] = {  # one /rag/chat_8b request of the users' contract, for the services' tests
    "tenant_id": "t",
    "contact_id": "c",
    "account_id": "a",
    "message_id": "m",
    "contexts": [{"role": "user", "content": "退货政策是什么"}],
    "rewritten_query": "退货政策",
}
SIDE = {"quality": 10, "relevance": 5, "completeness": 5, "retrieval": 5, "sum": 25}


@dataclass
class Services:
    rag_url: str  # the service's root: POST /rag/chat_8b, POST /rag/chat (or /chat_8b, /chat with seed_paths)
    judge_url: str  # the OpenAI-compatible base URL (.../v1)
    rag_requests: dict[str, int]  # requests per endpoint: "chat_8b", "chat"
    judged: list[str]  # the last message of every judge request
    judge_stats: Any  # the judge server's counters (refused, last_body, ...)


def _seed_paths(app: Any) -> Any:
    """The RAG service also at the users' paths (``/chat_8b``, ``/chat``, no ``/rag`` prefix)."""

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] in ("/chat_8b", "/chat"):
            scope = {**scope, "path": "/rag" + scope["path"], "raw_path": ("/rag" + scope["path"]).encode()}
        await app(scope, receive, send)

    return asgi


@contextmanager
def rag_and_judge(api_key: str, better: str = "same", seed_paths: bool = False) -> Iterator[Services]:
    """Both services for the block's duration; the judge answers `better` with the users' verdict schema,
    refuses what OpenAI's API refuses for GPT-5 (strict) and checks `api_key`."""
    docs = [Document(d["doc_id"], d["title"], d["content"]) for d in sales_demo_corpus()]
    rag = make_rag_app(BM25Index(docs), HeuristicRewriter(), top_k=5)
    judged: list[str] = []

    def judge(messages: list[dict[str, Any]]) -> str:
        judged.append(messages[-1]["content"])
        if "same_intent" in str(messages[0].get("content")):  # queryrl eval's intent question (intent_judge.py)
            return json.dumps({"same_intent": "yes", "reason": "the stand-in reads every rewrite as the turn"})
        other = {**SIDE, "sum": SIDE["sum"] - 5} if better == "8b" else SIDE
        return json.dumps({"better": better, "score": {"8b": SIDE, "32b": other}})

    judge_app = make_judge_app(judge, strict=True, api_key=api_key)
    served = _seed_paths(rag) if seed_paths else rag
    with running_server(served) as rag_url, running_server(judge_app) as judge_url:
        yield Services(rag_url.removesuffix("/v1"), judge_url, rag.state.requests, judged, judge_app.state.stats)


@contextmanager
def serve_judge_process(judge: str = "constant", startup_s: float = 60.0, *options: str) -> Iterator[str]:
    """``queryrl serve-judge --judge JUDGE [OPTIONS]`` as a real process on 127.0.0.1; yields its base URL
    (``.../v1``) once ``GET /v1/models`` answers."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "queryrl.cli", "serve-judge", "--judge", judge, "--port", str(port), *options]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    try:
        wait_until_up(f"http://127.0.0.1:{port}/v1/models", proc, startup_s, "serve-judge")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def wait_until_up(url: str, proc: Any, startup_s: float, what: str, log: Any = None) -> None:
    """Wait until ``GET url`` answers 2xx; fail the test if `proc` (a Popen) exits or `startup_s` pass first
    (quoting the end of `log`, a Path, when given)."""
    import time

    import httpx

    deadline = time.monotonic() + startup_s
    while True:
        try:
            httpx.get(url, timeout=1).raise_for_status()
            return
        except httpx.TransportError:
            tail = log.read_text(errors="replace")[-2000:] if log is not None else ""
            assert proc.poll() is None, f"{what} exited {tail}"
            assert time.monotonic() < deadline, f"{what} did not come up"
            time.sleep(0.2)
