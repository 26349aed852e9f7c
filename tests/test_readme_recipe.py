"""docs/your-data.md's recipe (the users' own run, step by step), run as written with bash.

What the test sets, and the only change it makes to the block:

- the four settings at its top: ``MODEL`` = the demo's tiny model folder, ``RAG_URL`` = a real RAG
  service on 127.0.0.1, ``JUDGE_URL`` = a strict stand-in of OpenAI's API on 127.0.0.1 (it refuses what
  GPT-5 refuses, with the API's status codes, and checks the key), ``OPENAI_API_KEY`` = a test key;
- ``crm_export.xlsx`` in the working folder: an Excel file built like a CRM export (a title row, a Chinese
  header, conversation cells merged over their messages, 客户/销售顾问/系统 roles, a send-time column, a
  说明 sheet);
- test-sized step counts appended to the ``queryrl sft``, ``queryrl train`` and ``queryrl eval`` lines.
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

from queryrl.apps.query_rewrite.demo.data import sales_demo_rows
from queryrl.config import load_config
from queryrl.models import resolve_model_path
from tests.loopback import Services, rag_and_judge

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-recipe-0123456789abcdef"
SETTINGS = ("MODEL=", "RAG_URL=", "JUDGE_URL=", "export OPENAI_API_KEY")
TEST_SIZE = {  # appended to the command lines that start with these words
    "queryrl sft": "sft.max_steps=4 sft.batch_size=4 sft.micro_batch_size=4 trainer.logger=[jsonl] "
    "data.max_prompt_length=320 data.max_response_length=48",
    "queryrl train": "trainer.total_steps=1 data.train_batch_size=2 rollout.n=2 actor.ppo_micro_batch_size=4 "
    "data.max_val_samples=2 trainer.logger=[jsonl] trainer.plot=false "
    "data.max_prompt_length=320 data.max_response_length=48",
    "queryrl eval": "--max-samples 6 --bootstrap 50",
}


def recipe_lines() -> list[str]:
    """The page's recipe block's command lines, continuation lines joined."""
    text = (REPO / "docs" / "your-data.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- recipe:your-data -->\n```bash\n(.*?)```\n<!-- /recipe:your-data -->", text, re.S)
    assert block, "docs/your-data.md lost its recipe block (<!-- recipe:your-data --> ... <!-- /recipe:your-data -->)"
    return block.group(1).replace("\\\n", " ").splitlines()


def test_the_recipe_sets_its_four_settings_first() -> None:
    lines = [line for line in recipe_lines() if line.strip() and not line.startswith("#")]
    assert [line.split()[0] if "=" in line.split()[0] else " ".join(line.split()[:2]) for line in lines[:4]] == [
        "MODEL=${MODEL:-/models/Qwen2.5-0.5B-Instruct}",
        "RAG_URL=${RAG_URL:-http://127.0.0.1:8000}",
        "JUDGE_URL=${JUDGE_URL:-https://api.openai.com/v1}",
        "export OPENAI_API_KEY",
    ]
    assert all(line.startswith(SETTINGS) for line in lines[:4])
    commands = [line.split()[1] for line in lines if line.startswith("queryrl ")]
    assert commands == ["prepare", "train", "sft", "train", "export", "eval"]


def crm_export(path: Path, n_conversations: int = 20) -> Path:
    """The demo's validation dialogues written as a CRM's Excel export."""
    import openpyxl

    last: dict[str, dict[str, Any]] = {}
    for row in sales_demo_rows("val"):  # a conversation's last user turn carries its whole history
        info = row["extra_info"]
        if info["turn"] >= last.get(info["conversation_id"], {"turn": -1})["turn"]:
            last[info["conversation_id"]] = info
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.title = "会话记录"
    sheet.append(["2026年11月 CRM 会话导出"])
    sheet.merge_cells(start_row=1, start_column=1, end_row=1, end_column=5)
    sheet.append(["会话ID", "发送时间", "角色", "消息内容", "用户画像"])
    start = datetime(2026, 11, 3, 9, 0)
    for c, info in enumerate(list(last.values())[:n_conversations]):
        first = sheet.max_row + 1
        messages = [("系统", "会话已接入")] + [
            ("客户" if m["role"] == "user" else "销售顾问", m["content"]) for m in info["contexts"]
        ]
        for i, (role, text) in enumerate(messages):
            when = start + timedelta(hours=c, minutes=i)
            sheet.append([info["conversation_id"] if i == 0 else None, when, role, text, info["user_profile"] or None])
        for col in (1, 5):  # conversation-level cells merged over the conversation's rows
            sheet.merge_cells(start_row=first, start_column=col, end_row=sheet.max_row, end_column=col)
    book.create_sheet("说明").append(["字段说明：系统消息为自动通知"])
    book.save(path)
    return path


@pytest.fixture
def services() -> Iterator[Services]:
    with rag_and_judge(SECRET) as found:
        yield found


@pytest.mark.slow
def test_the_recipe_runs_as_written(tmp_path: Path, model_cache: Path, services: Services) -> None:
    rag_url, judge_url = services.rag_url, services.judge_url
    rag_requests, judged, judge_stats = services.rag_requests, services.judged, services.judge_stats
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
        "RAG_URL": rag_url,
        "JUDGE_URL": judge_url,
        "OPENAI_API_KEY": SECRET,
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]

    splits = {p.name for p in (work / "data" / "qr").glob("*.parquet")}
    assert splits == {"train.parquet", "val.parquet", "test.parquet"}
    report = json.loads((work / "runs" / "query_rewrite" / "eval.json").read_text())
    assert set(report["systems"]) == {"raw_turn", "concat_last3", "reference", "sft", "grpo"}
    assert report["judge_calls"]["sent"] > 0
    assert report["judge_calls"]["failed"] == 0
    assert rag_requests["chat_8b"] > 0, "the RAG service's 8B endpoint got no request"
    assert rag_requests["chat"] > 0, "the RAG service's reference endpoint got no request"
    assert judged, "the judge got no request"
    assert judge_stats.refused == 0, "the strict judge refused a request GPT-5 would refuse"
    assert SECRET not in output
    for path in work.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), f"the API key was written to {path}"
