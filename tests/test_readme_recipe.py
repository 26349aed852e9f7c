"""docs/your-data.md's recipe (the users' own first day, step by step), run as written with bash.

What the test sets, and the only change it makes to the block:

- the settings at its top: ``MODEL`` = the demo's tiny model folder, ``RAG_URL`` = the page's own minimal
  RAG service (its ``rag-service:minimal`` block, served with uvicorn as a process on 127.0.0.1 over the
  sales demo's catalogue), ``JUDGE_URL`` = a strict stand-in of OpenAI's API on 127.0.0.1 that behaves like
  GPT-5 (it refuses what GPT-5 refuses, with the API's status codes, checks the key, and spends reasoning
  tokens out of the request's token limit), ``OPENAI_API_KEY`` = a test key, ``JUDGE_PRICES`` = test prices;
- ``crm_export.xlsx`` in the working folder: an Excel file built like a CRM export (a title row, a Chinese
  header, conversation cells merged over their messages, 客户/销售顾问/客服/系统 roles, empty messages where
  stickers and images were, rows out of time order, a column of the team's own rewrites, a 说明 sheet);
- test-sized step counts appended to the ``queryrl sft``, ``queryrl train`` and ``queryrl eval`` lines, and
  ``app.query_rewrite.unparsed=retrieve`` to the ``train`` lines: after 4 SFT steps the tiny model writes no
  JSON yet, and a real model's first steps would; so its replies are retrieved as they are, and the GRPO step
  calls the RAG service and the judge as a real one does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from queryrl.apps.query_rewrite.demo.data import sales_demo_corpus, sales_demo_rows
from queryrl.config import load_config
from queryrl.models import resolve_model_path
from queryrl.testing.judge_server import make_app as make_judge_app
from queryrl.testing.judge_server import running_server
from tests.rag.minimal_service import MinimalService, serve_minimal_service

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-recipe-0123456789abcdef"
SETTINGS = ("MODEL=", "RAG_URL=", "JUDGE_URL=", "export OPENAI_API_KEY", "JUDGE_PRICES=")
PRICES = "app.query_rewrite.judge.price_per_million_input=2.5 app.query_rewrite.judge.price_per_million_output=20"
REASONING = {"minimal": 0, "low": 300, "medium": 1500, "high": 6000}  # hidden tokens a GPT-5-like reply spends
TEST_SIZE = {  # appended to the command lines that start with these words
    "queryrl sft": "sft.max_steps=4 sft.batch_size=4 sft.micro_batch_size=4 trainer.logger=[jsonl] "
    "data.max_prompt_length=320 data.max_response_length=48",
    "queryrl train": "trainer.total_steps=1 data.train_batch_size=2 rollout.n=2 actor.ppo_micro_batch_size=4 "
    "data.max_val_samples=2 trainer.logger=[console,jsonl] trainer.plot=false "
    "data.max_prompt_length=320 data.max_response_length=48 app.query_rewrite.unparsed=retrieve",
    "queryrl eval": "--max-samples 6 --bootstrap 50",
}
SIDE = {"quality": 10, "relevance": 5, "completeness": 5, "retrieval": 5, "sum": 25}


def recipe_lines() -> list[str]:
    """The page's recipe block's command lines, continuation lines joined."""
    text = (REPO / "docs" / "your-data.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- recipe:your-data -->\n```bash\n(.*?)```\n<!-- /recipe:your-data -->", text, re.S)
    assert block, "docs/your-data.md lost its recipe block (<!-- recipe:your-data --> ... <!-- /recipe:your-data -->)"
    return block.group(1).replace("\\\n", " ").splitlines()


def test_the_recipe_sets_its_settings_first() -> None:
    lines = [line for line in recipe_lines() if line.strip() and not line.startswith("#")]
    assert [line.split()[0] if "=" in line.split()[0] else " ".join(line.split()[:2]) for line in lines[:5]] == [
        "MODEL=${MODEL:-/models/Qwen2.5-0.5B-Instruct}",
        "RAG_URL=${RAG_URL:-http://127.0.0.1:8000}",
        "JUDGE_URL=${JUDGE_URL:-https://api.openai.com/v1}",
        "export OPENAI_API_KEY",
        "JUDGE_PRICES=${JUDGE_PRICES:-}",
    ]
    assert all(line.startswith(SETTINGS) for line in lines[:5])
    commands = [line.split()[1] for line in lines if line.startswith("queryrl ")]
    assert commands == ["prepare", "train", "sft", "train", "export", "eval"]


def _conversations(n: int) -> list[dict[str, Any]]:
    """The demo's validation dialogues, each at its last user turn (which carries the whole history)."""
    last: dict[str, dict[str, Any]] = {}
    for row in sales_demo_rows("val"):
        info = row["extra_info"]
        if info["turn"] >= last.get(info["conversation_id"], {"turn": -1})["turn"]:
            last[info["conversation_id"]] = {**info, "target": row["extra_info"].get("sft_target")}
    return list(last.values())[:n]


def _messages(c: int, info: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """(role, text, the team's rewrite) of one conversation as the CRM logged it: a 系统 notice first, 客服 on
    every third conversation, a sticker (an empty message) after the first user turn, a recalled message
    (empty, role 客户) on every fourth, the team's own rewrite on each user turn of even conversations."""
    assistant = "客服" if c % 3 == 0 else "销售顾问"
    out: list[tuple[str, str | None, str | None]] = [("系统", "会话已接入", None)]
    users = 0
    for m in info["contexts"]:
        if m["role"] == "user":
            users += 1
            out.append(("客户", m["content"], f"{m['content']}（团队改写）" if c % 2 == 0 else None))
            if users == 1:
                out.append(("客户", None, None))  # a sticker: the export has no text for it
        else:
            out.append((assistant, m["content"], None))
    if c % 4 == 1:
        out.insert(2, ("客户", "   ", None))  # a recalled message
    return out


def crm_export(path: Path, n_conversations: int = 20) -> Path:
    """The demo's validation dialogues written as a CRM's Excel export (see the module doc)."""
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.title = "会话记录"
    sheet.append(["2026年11月 CRM 会话导出"])
    sheet.merge_cells(start_row=1, start_column=1, end_row=1, end_column=6)
    sheet.append(["会话ID", "发送时间", "角色", "消息内容", "用户画像", "改写query"])
    start = datetime(2026, 11, 3, 9, 0)
    for c, info in enumerate(_conversations(n_conversations)):
        first = sheet.max_row + 1
        timed = [(start + timedelta(hours=c, minutes=i), m) for i, m in enumerate(_messages(c, info))]
        if c % 5 == 2 and len(timed) > 3:  # two rows exported out of time order: the send time orders them
            timed[1], timed[2] = timed[2], timed[1]
        for i, (when, (role, text, rewrite)) in enumerate(timed):
            profile = info["user_profile"] or None
            sheet.append([info["conversation_id"] if i == 0 else None, when, role, text, profile, rewrite])
        for col in (1, 5):  # conversation-level cells merged over the conversation's rows
            sheet.merge_cells(start_row=first, start_column=col, end_row=sheet.max_row, end_column=col)
    book.create_sheet("说明").append(["字段说明：系统消息为自动通知；改写query 为团队参考管线的改写"])
    book.save(path)
    return path


def _gpt5_like(judged: list[str]) -> Any:
    """A strict OpenAI stand-in app that reasons like GPT-5 and answers the app's verdict schema."""

    def judge(messages: list[dict[str, Any]]) -> str:
        judged.append(messages[-1]["content"])
        if "same_intent" in str(messages[0].get("content")):  # queryrl eval's intent question
            return json.dumps({"same_intent": "yes", "reason": "the stand-in reads every rewrite as the turn"})
        return json.dumps({"better": "same", "score": {"8b": SIDE, "32b": SIDE}})

    return make_judge_app(judge, strict=True, api_key=SECRET, reasoning_tokens=REASONING)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[MinimalService, str, Any, list[str]]]:
    """The page's minimal RAG service (a process) and the GPT-5-like judge (a thread), both on 127.0.0.1."""
    judged: list[str] = []
    judge_app = _gpt5_like(judged)
    with (
        serve_minimal_service(tmp_path / "rag", sales_demo_corpus()) as rag,
        running_server(judge_app, max_lifetime_s=900) as judge_url,
    ):
        yield rag, judge_url, judge_app.state.stats, judged


@pytest.mark.slow
def test_the_recipe_runs_as_written(tmp_path: Path, model_cache: Path, services: Any) -> None:
    rag, judge_url, judge_stats, judged = services
    demo = load_config(REPO / "configs" / "query_rewrite_demo.yaml", [f"model.cache_dir={model_cache}"])
    model = resolve_model_path(demo.model)  # the demo's tiny model, built into the test session's cache
    work = tmp_path / "work"
    work.mkdir()
    (work / "configs").symlink_to(REPO / "configs")
    crm_export(work / "crm_export.xlsx")

    script = ["set -euo pipefail"]
    for line in recipe_lines():
        extra = next((v for k, v in TEST_SIZE.items() if line.startswith(k)), "")
        script.append(f"{line} {extra}".rstrip())
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MODEL": str(model),
        "RAG_URL": rag.url,
        "JUDGE_URL": judge_url,
        "OPENAI_API_KEY": SECRET,
        "JUDGE_PRICES": PRICES,
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=work, env=env, capture_output=True, text=True, timeout=900
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]

    # 1. the export: empty messages and 系统 notices skipped and counted, the team's rewrites taken as targets
    splits = {p.name for p in (work / "data" / "qr").glob("*.parquet")}
    assert splits == {"train.parquet", "val.parquet", "test.parquet"}
    assert re.search(r"\d+ empty user message", output), output[-4000:]
    assert "'系统'" in output
    assert "column '改写query'" in output, "the team's rewrite column was not taken as the SFT targets"
    # 4. GRPO: the preflight checked both endpoints with the first row, and the run trained
    assert re.search(r"preflight: .*chat_8b", output), output[-4000:]
    assert re.search(r"preflight: .*/rag/chat\b", output), output[-4000:]
    metrics = [
        json.loads(line) for line in (work / "runs" / "query_rewrite" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [m for m in metrics if "actor/pg_loss" in m]
    assert steps, "the GRPO run trained no step"
    assert all(m.get("judge/failed", 0) == 0 for m in steps), steps
    assert all(m.get("rag/failed", 0) == 0 for m in steps), steps
    assert any(m.get("rag/calls", 0) > 0 for m in steps), "the GRPO step made no RAG call"
    assert any(m.get("judge/reasoning_tokens", 0) > 0 for m in steps), "GPT-5's reasoning tokens were not counted"
    assert "judge_in" in output, "no judge tokens on the console"
    assert "judge_cost" in output, "no judge cost on the console"
    # 5. the evaluation, its judge calls and their cost
    report = json.loads((work / "runs" / "query_rewrite" / "eval.json").read_text())
    assert set(report["systems"]) == {"raw_turn", "concat_last3", "reference", "sft", "grpo"}
    assert report["judge_calls"]["sent"] > 0
    assert report["judge_calls"]["failed"] == 0
    assert rag.requests("chat_8b") > 0, "the RAG service's 8B endpoint got no request"
    assert rag.requests("chat") > 0, "the RAG service's reference endpoint got no request"
    assert judged, "the judge got no request"
    assert judge_stats.refused == 0, "the strict judge refused a request GPT-5 would refuse"
    assert SECRET not in output
    for path in work.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), f"the API key was written to {path}"
