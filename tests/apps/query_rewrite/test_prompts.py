"""The rewrite prompt and the tolerant parser of the policy's JSON answer."""

from __future__ import annotations

import pytest

from queryrl.apps.query_rewrite.prompts import SYSTEM_PROMPTS, ParsedRewrite, build_messages, parse_rewrite

HISTORY = [
    {"role": "user", "content": "星辰 X3 手机多少钱？"},
    {"role": "assistant", "content": "售价 2999 元。"},
    {"role": "user", "content": "它续航怎么样？"},
]


def test_build_messages_zh_shows_history_current_turn_profile_and_summary() -> None:
    messages = build_messages(HISTORY, "价格敏感型用户", "问过 X3 的价格", lang="zh")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPTS["zh"]
    for key in ("rewritten_query", "user_profile", "history_summary"):
        assert key in messages[0]["content"]
    body = messages[1]["content"]
    assert "用户：星辰 X3 手机多少钱？" in body
    assert "客服：售价 2999 元。" in body
    assert body.index("当前问题：") < body.index("它续航怎么样？")
    assert "它续航怎么样？" not in body.split("当前问题：")[0]  # the current turn is not repeated as history
    assert "价格敏感型用户" in body
    assert "问过 X3 的价格" in body
    assert body.endswith("当前问题：\n它续航怎么样？")  # the current turn comes last


def test_build_messages_first_turn_and_no_profile() -> None:
    body = build_messages(HISTORY[:1], "", "  ")[1]["content"]
    assert "（无）" in body
    assert "用户画像" not in body
    assert "历史摘要" not in body


def test_build_messages_english() -> None:
    messages = build_messages(HISTORY, "student", "", lang="en")
    assert messages[0]["content"] == SYSTEM_PROMPTS["en"]
    assert "User: 星辰 X3 手机多少钱？" in messages[1]["content"]
    assert "Assistant: 售价 2999 元。" in messages[1]["content"]
    assert "User profile:\nstudent" in messages[1]["content"]


@pytest.mark.parametrize(
    "history", [[], [{"role": "assistant", "content": "您好"}], [{"role": "user", "content": "hi"}]]
)
def test_build_messages_rejects_bad_input(history: list[dict[str, str]]) -> None:
    with pytest.raises(ValueError, match=r"history|language"):
        build_messages(history, lang="fr" if history and history[0]["role"] == "user" else "zh")


@pytest.mark.parametrize(
    "text",
    [
        '{"rewritten_query": "星辰 X3 手机续航", "user_profile": "学生", "history_summary": "问过价格"}',
        '```json\n{"rewritten_query": "星辰 X3 手机续航", "user_profile": "学生", "history_summary": "问过价格"}\n```',
        '好的，改写如下：\n{"rewritten_query": " 星辰 X3 手机续航 ", "user_profile": "学生", '
        '"history_summary": "问过价格"}\n希望有帮助。',
        '{"note": "draft"} then {"rewritten_query": "星辰 X3 手机续航", "user_profile": "学生", '
        '"history_summary": "问过价格",}',  # trailing comma repaired; the object without the key skipped
    ],
)
def test_parse_rewrite_accepts_fences_prose_and_repairs(text: str) -> None:
    assert parse_rewrite(text) == ParsedRewrite("星辰 X3 手机续航", "学生", "问过价格")


def test_parse_rewrite_optional_fields() -> None:
    assert parse_rewrite('{"rewritten_query": "q"}') == ParsedRewrite("q", "", "")
    assert parse_rewrite('{"rewritten_query": "q", "user_profile": null}') == ParsedRewrite("q", "", "")


@pytest.mark.parametrize(
    "text",
    [
        '{"user_profile": "学生", "history_summary": ""}',  # missing key
        '{"rewritten_query": ""}',  # empty
        '{"rewritten_query": "   "}',  # blank
        '{"rewritten_query": 42}',  # not a string
        '{"rewritten_query": ["a"]}',
        '{"rewritten_query": "q", "user_profile": 3}',  # optional field of the wrong type
        '{"rewritten_query": "q", "history_summary": {"a": 1}}',
        '{"rewritten_query": "' + "长" * 300 + '"}',  # over the default cap
        '{"rewritten_query": "q", "history_summary": "' + "x" * 3000 + '"}',
        '{"rewritten_query": "星辰 X3',  # truncated
        "星辰 X3 手机续航",  # plain text
        "",
    ],
)
def test_parse_rewrite_rejects_format_failures(text: str) -> None:
    assert parse_rewrite(text) is None


def test_parse_rewrite_length_cap_is_configurable() -> None:
    text = '{"rewritten_query": "abcdef"}'
    assert parse_rewrite(text, max_query_chars=6) == ParsedRewrite("abcdef")
    assert parse_rewrite(text, max_query_chars=5) is None


@pytest.mark.parametrize(
    "garbage", [None, 12, b'{"rewritten_query": "q"}', ["x"], {"rewritten_query": "q"}, "{" * 5000, '{"a": ' * 3000]
)
def test_parse_rewrite_never_raises(garbage: object) -> None:
    assert parse_rewrite(garbage) is None
