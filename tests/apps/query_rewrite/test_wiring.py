"""The query-rewrite application wired into the library: built-in dataset and prepare commands."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.data import load_records
from tests.helpers import KDCONV, needs_kdconv

runner = CliRunner()


def test_sales_demo_is_a_builtin_dataset_of_the_installed_app(tmp_path: Path) -> None:
    from queryrl.data.builtin import resolve_data_path

    rows = load_records(resolve_data_path("builtin://sales_demo/val", str(tmp_path)))
    assert rows
    assert all(r["data_source"].startswith("query_rewrite/") for r in rows)
    assert any(r["reward_model"]["ground_truth"]["gold_doc_ids"] for r in rows)


def test_prepare_conversations_from_a_csv(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    pd.DataFrame(
        [
            {"conversation_id": "c1", "turn": 1, "role": "用户", "text": "云帆 Pro2 多少钱？", "gold_doc_ids": "d1"},
            {"conversation_id": "c1", "turn": 2, "role": "客服", "text": "三千元。", "gold_doc_ids": ""},
            {"conversation_id": "c1", "turn": 3, "role": "用户", "text": "它有黑色吗？", "gold_doc_ids": "d2;d3"},
        ]
    ).to_csv(log, index=False)
    result = runner.invoke(
        app,
        [
            "prepare",
            "conversations",
            "--input",
            str(log),
            "--out",
            str(tmp_path / "out"),
            "--val-fraction",
            "0",
            "--test-fraction",
            "0",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = load_records(tmp_path / "out" / "train.parquet")
    assert [r["reward_model"]["ground_truth"]["gold_doc_ids"] for r in rows] == [["d1"], ["d2", "d3"]]


def test_prepare_conversations_reports_a_bad_column(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    pd.DataFrame([{"conversation_id": "c1", "role": "user"}]).to_csv(log, index=False)
    result = runner.invoke(app, ["prepare", "conversations", "--input", str(log), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "text" in result.output


@needs_kdconv()
def test_prepare_kdconv(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "prepare",
            "kdconv",
            "--input",
            str(KDCONV / "dev.json"),
            "--kb",
            str(KDCONV / "kb_travel.json"),
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    docs = [json.loads(x) for x in (tmp_path / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    ids = {d["doc_id"] for d in docs}
    rows = load_records(tmp_path / "dev.parquet")
    assert rows
    assert all(set(r["reward_model"]["ground_truth"]["gold_doc_ids"]) <= ids for r in rows)


@pytest.mark.slow
def test_serve_rag_runs_as_a_real_process(tmp_path: Path) -> None:
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    corpus = tmp_path / "corpus.jsonl"
    docs = [
        {"doc_id": "p1-price", "title": "云帆 Pro2", "content": "云帆 Pro2 平板电脑售价 2999 元。"},
        {"doc_id": "p1-color", "title": "云帆 Pro2", "content": "云帆 Pro2 有金色和灰色。"},
        {"doc_id": "p2-price", "title": "极光 Lite7", "content": "极光 Lite7 售价 1999 元。"},
    ]
    corpus.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "queryrl.cli", "serve-rag", "--corpus", str(corpus), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"{base}/health", timeout=1).status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "serve-rag did not come up"
                assert proc.poll() is None, "serve-rag exited"
                time.sleep(0.2)
        ids = {"tenant_id": "t", "contact_id": "c", "account_id": "a", "message_id": "m"}
        contexts = [{"role": "user", "content": "极光 Lite7 多少钱？"}]
        body = {**ids, "contexts": contexts, "rewritten_query": "极光 Lite7 价格"}
        answer = httpx.post(f"{base}/rag/chat_8b", json=body, timeout=10).json()
        assert set(answer) >= {"status", "response", "answer", "rewritten_query", "cost_time"}
        assert answer["response"][0]["doc_id"] == "p2-price"
        reference = httpx.post(f"{base}/rag/chat", json={**ids, "contexts": contexts}, timeout=10).json()
        assert reference["response"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
