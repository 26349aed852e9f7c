"""Request data shared by the RAG tests: a conversation whose last turn needs its context, request bodies."""

from __future__ import annotations

from typing import Any

IDS = {"tenant_id": "t1", "contact_id": "c1", "account_id": "a1", "message_id": "m1"}

PRONOUN_CONTEXTS = [
    {"role": "user", "content": "iPhone 15 有什么颜色？"},
    {"role": "assistant", "content": "iPhone 15 有黑色、蓝色、粉色、黄色四种颜色。"},
    {"role": "user", "content": "它多少钱？"},
]


def chat_8b_body(query: str = "iPhone 15 多少钱", **extra: Any) -> dict[str, Any]:
    """A ``POST /rag/chat_8b`` body: the pronoun conversation with `query` as the given rewrite, `extra` on top."""
    return {
        **IDS,
        "contexts": PRONOUN_CONTEXTS,
        "thought_unit": "",
        "score_threshold": 0.0,
        "user_profile": "学生",
        "history_summary": "",
        "rewritten_query": query,
        **extra,
    }
