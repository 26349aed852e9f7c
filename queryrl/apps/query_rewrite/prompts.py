"""The query-rewrite prompt (Chinese by default, English) and a tolerant parser of the reply.

The policy sees one system message (the task and the JSON it must answer with) and one user
message (the history, the current user turn, and the user profile / history summary when
present). It answers ``{"rewritten_query": ..., "user_profile": ..., "history_summary": ...}``
(seed 000: the 8B model's structured output, sent on to ``/rag/chat_8b``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from queryrl.rewards.json_extract import json_objects

MAX_QUERY_CHARS = 256  # a longer "query" is an essay, not a search query: a format failure
MAX_FIELD_CHARS = 2000  # cap on user_profile / history_summary

SYSTEM_PROMPTS = {
    "zh": (
        "你是销售客服系统中的查询改写助手。请根据对话历史、用户当前的问题，以及（如有）用户画像和历史摘要，"
        "把当前问题改写成一个独立、完整、可以直接用于知识库检索的查询：补全代词和省略的商品名称与属性，"
        "保留用户的原意，不要编造对话中没有的信息。同时更新用户画像（身份、偏好、关注点）"
        "和历史摘要（到目前为止对话的要点）。\n"
        "只输出一个 JSON 对象，不要输出其他内容：\n"
        '{"rewritten_query": "改写后的查询", "user_profile": "用户画像", "history_summary": "历史摘要"}'
    ),
    "en": (
        "You are the query rewriter of a sales support chatbot. Given the conversation history, the "
        "user's current turn and, if present, the user profile and the history summary, rewrite the "
        "current turn as one standalone search query for the knowledge base: resolve pronouns and "
        "ellipsis (name the product and the attribute), keep the user's intent, and add nothing the "
        "conversation does not say. Also update the user profile (who they are, preferences, concerns) "
        "and the history summary (the main points so far).\n"
        "Answer with one JSON object and nothing else:\n"
        '{"rewritten_query": "the rewritten query", "user_profile": "the user profile", '
        '"history_summary": "the history summary"}'
    ),
}

_LABELS = {
    "zh": {
        "history": "对话历史：",
        "none": "（无）",
        "current": "当前问题：",
        "profile": "用户画像：",
        "summary": "历史摘要：",
        "user": "用户",
        "assistant": "客服",
        "sep": "：",
    },
    "en": {
        "history": "Conversation history:",
        "none": "(none)",
        "current": "Current user turn:",
        "profile": "User profile:",
        "summary": "History summary:",
        "user": "User",
        "assistant": "Assistant",
        "sep": ": ",
    },
}


@dataclass(frozen=True)
class ParsedRewrite:
    """The policy's structured answer."""

    rewritten_query: str
    user_profile: str = ""
    history_summary: str = ""


def build_messages(
    history: Sequence[dict[str, Any]], user_profile: str = "", history_summary: str = "", lang: str = "zh"
) -> list[dict[str, str]]:
    """Chat messages asking the policy to rewrite the last user turn of `history`.

    The user message holds, in this order: the user profile and the history summary (when
    non-empty), the earlier turns, and the current turn, last.

    Args:
        history: the conversation so far as ``{"role": "user"|"assistant", "content": str}``
            messages, ending with the current user turn.
        user_profile: shown when non-empty.
        history_summary: shown when non-empty.
        lang: ``"zh"`` (default) or ``"en"``.

    Raises:
        ValueError: unknown `lang`, empty `history`, or a last message that is not the user's.
    """
    if lang not in SYSTEM_PROMPTS:
        raise ValueError(f"unknown prompt language {lang!r}; use one of {sorted(SYSTEM_PROMPTS)}")
    if not history or history[-1].get("role") != "user":
        raise ValueError("history must end with the current user turn (role 'user')")
    labels = _LABELS[lang]
    earlier = [f"{labels.get(str(m['role']), str(m['role']))}{labels['sep']}{m['content']}" for m in history[:-1]]
    parts: list[str] = []
    if user_profile and user_profile.strip():
        parts += [labels["profile"], user_profile.strip(), ""]
    if history_summary and history_summary.strip():
        parts += [labels["summary"], history_summary.strip(), ""]
    parts += [labels["history"], "\n".join(earlier) if earlier else labels["none"], ""]
    # the current turn last, right before the answer: at a fixed distance from where the model writes
    parts += [labels["current"], str(history[-1]["content"])]
    return [{"role": "system", "content": SYSTEM_PROMPTS[lang]}, {"role": "user", "content": "\n".join(parts)}]


def parse_rewrite(
    text: Any, max_query_chars: int = MAX_QUERY_CHARS, max_field_chars: int = MAX_FIELD_CHARS
) -> ParsedRewrite | None:
    """The first JSON object in `text` with a ``rewritten_query`` key, checked; None otherwise.

    Code fences and prose around the object are tolerated. Format failures (None): no such
    object; ``rewritten_query`` not a string, blank, or longer than `max_query_chars` after
    stripping; ``user_profile`` / ``history_summary`` present but not a string (null counts as
    absent) or longer than `max_field_chars`. Never raises.
    """
    try:
        obj = next((o for o in json_objects(text) if "rewritten_query" in o), None)
        if obj is None:
            return None
        query = obj["rewritten_query"]
        if not isinstance(query, str) or not query.strip() or len(query.strip()) > max_query_chars:
            return None
        fields: dict[str, str] = {}
        for key in ("user_profile", "history_summary"):
            value = obj.get(key)
            if value is None:
                value = ""
            if not isinstance(value, str) or len(value.strip()) > max_field_chars:
                return None
            fields[key] = value.strip()
        return ParsedRewrite(query.strip(), fields["user_profile"], fields["history_summary"])
    except Exception:  # a parser of model output must never take the reward loop down
        return None
