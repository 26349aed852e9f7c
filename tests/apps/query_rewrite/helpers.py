"""Shared by the query-rewrite tests: a two-turn conversation, a recording HTTP RAG service over the demo
corpus, a demo retrieval turn and its gold title, a small conversation log and the 16 demo rows the training
tests use (the KdConv folder and its skip mark: ``tests.helpers``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from queryrl.apps.query_rewrite.data.conversations import Conversation, Message
from queryrl.apps.query_rewrite.demo.data import make_catalogue, sales_demo_rows

CONVERSATION = Conversation(
    "c1",
    [
        Message("user", "星辰 X3 多少钱？", 0, "学生", "", gold_doc_ids=["phone-01-price"]),
        Message("assistant", "售价 2999 元。", 1),
        Message("user", "它续航怎么样？", 2, history_summary="问过星辰 X3 的价格", gold_doc_ids=["phone-01-battery"]),
    ],
)


@cache
def demo_row() -> dict[str, Any]:
    """A retrieval turn of the demo whose CRM profile and summary are both non-empty."""
    return next(
        r
        for r in sales_demo_rows("val")
        if r["reward_model"]["ground_truth"]["gold_doc_ids"]
        and r["extra_info"]["user_profile"]
        and r["extra_info"]["history_summary"]
    )


def gold_title(row: dict[str, Any]) -> str:
    titles = {d["doc_id"]: d["title"] for d in make_catalogue()}
    return titles[row["reward_model"]["ground_truth"]["gold_doc_ids"][0]]


def write_log(path: Path) -> Path:
    messages = []
    for c in range(3):
        messages += [
            {"conversation_id": f"c{c}", "turn": 0, "role": "user", "text": "星辰 X3 多少钱？", "user_profile": "学生"},
            {"conversation_id": f"c{c}", "turn": 1, "role": "assistant", "text": "2999 元。", "user_profile": ""},
            {"conversation_id": f"c{c}", "turn": 2, "role": "user", "text": "它续航呢？", "user_profile": ""},
        ]
    pd.DataFrame(messages).to_csv(path, index=False)
    return path


def pronoun_rows() -> list[dict[str, Any]]:
    """16 pronoun turns of the sales demo's val split: the training data of the tests that train on the demo
    (and of the shared ``json_model``, tests/apps/query_rewrite/conftest.py)."""
    return [r for r in sales_demo_rows("val") if r["extra_info"]["turn_type"] == "pronoun"][:16]
