"""The rewrite prompt and the tolerant parser of the policy's JSON answer."""

from __future__ import annotations

import pytest

from queryrl.apps.query_rewrite.prompts import (
    ANSWER_FIELDS,
    SYSTEM_PROMPTS,
    ParsedRewrite,
    build_messages,
    check_answer_fields,
    parse_rewrite,
    system_prompt,
)
from queryrl.rewards.json_extract import json_objects

HISTORY = [
    {"role": "user", "content": "星辰 X3 手机多少钱？"},
    {"role": "assistant", "content": "售价 2999 元。"},
    {"role": "user", "content": "它续航怎么样？"},
]


def test_build_messages_zh_shows_history_current_turn_profile_and_summary() -> None:
    messages = build_messages(HISTORY, "价格敏感型用户", "问过 X3 的价格", lang="zh")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == SYSTEM_PROMPTS["zh"]
    assert "rewritten_query" in messages[0]["content"]
    # by default only the query is asked for: the profile and summary are inputs, not outputs
    assert "user_profile" not in messages[0]["content"]
    assert "history_summary" not in messages[0]["content"]
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
        '{"rewritten_query": "星辰 X3',  # truncated inside the query
        '{"rewritten_query": "星辰 X3\\"',  # inside the query: its last quote is escaped
        '{"rewritten_query": "星辰 X3" "学生", "user_profile": "',  # malformed before the cut
        '{"rewritten_query": 42, "user_profile": "学',  # truncated, but the query is not a string
        '{"rewritten_query": "   ", "user_profile": "学',  # truncated, blank query
        '{"rewritten_query": "' + "长" * 300 + '", "user_profile": "学',  # truncated, over the cap
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


# --- the prompt for real instruct models ------------------------------------------------------------

PLACEHOLDERS = ("改写后的查询", "用户画像", "历史摘要", "the rewritten query", "the user profile", "...", "<")


@pytest.mark.parametrize("lang", ["zh", "en"])
@pytest.mark.parametrize("fields", [("rewritten_query",), ANSWER_FIELDS])
def test_no_placeholder_to_copy(lang: str, fields: tuple[str, ...]) -> None:
    """Every JSON object in the system prompt is the labelled worked example (cooking, unrelated to any
    dataset here) or its empty-query twin: no template value a model could copy as its answer."""
    text = system_prompt(lang, "电子产品销售客服", fields)
    objects = json_objects(text)
    assert len(objects) == 2
    example, empty = objects
    assert tuple(example) == fields  # the keys asked for, the query first
    assert empty["rewritten_query"] == ""  # an empty query = no retrieval
    for obj in objects:
        for value in obj.values():
            assert not any(p in value for p in PLACEHOLDERS), value
    assert ("示例" if lang == "zh" else "Example") in text.split("{")[0]  # labelled before the first object
    assert ("红烧肉" if lang == "zh" else "braised pork") in example["rewritten_query"]
    # the schema is described in words
    assert ("一个键 rewritten_query" if lang == "zh" else "one key, rewritten_query") in system_prompt(lang)


def test_domain_line_from_the_caller_and_a_neutral_default() -> None:
    assert "场景：电子产品销售客服。" in build_messages(HISTORY, domain="电子产品销售客服")[0]["content"]
    assert "场景：旅游咨询（北京的景点）。" in system_prompt("zh", "旅游咨询（北京的景点）")
    for lang, line in (("zh", "场景：客服对话。"), ("en", "Domain: customer conversations.")):
        default = system_prompt(lang)
        assert line in default
        assert "销售" not in default
        assert "sales" not in default
    assert system_prompt("zh", "  ") == system_prompt("zh")  # a blank domain is the default


def test_empty_query_means_no_retrieval_in_the_prompt() -> None:
    assert "查询为空字符串" in SYSTEM_PROMPTS["zh"]
    assert "empty query" in SYSTEM_PROMPTS["en"]


def test_answer_fields_choose_what_the_prompt_asks_for() -> None:
    every = build_messages(HISTORY, answer_fields=ANSWER_FIELDS)[0]["content"]
    assert "user_profile" in every
    assert "history_summary" in every
    assert every.index("rewritten_query") < every.index("user_profile") < every.index("history_summary")
    # the order given does not matter: the query always comes first (a cut answer keeps it)
    assert check_answer_fields("history_summary, rewritten_query") == ("rewritten_query", "history_summary")
    assert check_answer_fields(None) == ("rewritten_query",)
    assert check_answer_fields(["rewritten_query"]) == ("rewritten_query",)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ("user_profile", "must include 'rewritten_query'"),
        ("", "must include 'rewritten_query'"),
        ("rewritten_query,profile", "unknown 'profile'; choose from rewritten_query, user_profile, history_summary"),
        ("rewritten_query,rewritten_query", "'rewritten_query' given twice"),
    ],
)
def test_bad_answer_fields_are_named(fields: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_answer_fields(fields, "--answer-fields")
    with pytest.raises(ValueError, match="--answer-fields"):
        check_answer_fields(fields, "--answer-fields")
    with pytest.raises(ValueError, match=match):
        build_messages(HISTORY, answer_fields=fields.split(","))


# --- truncated replies -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "query"),
    [
        ('{"rewritten_query": "星辰X3手机续航", "user_profile": "学生, 预算', "星辰X3手机续航"),  # cut in a value
        ('{"rewritten_query": "星辰X3手机续航", "user_pro', "星辰X3手机续航"),  # cut in a key
        ('{"rewritten_query": "星辰X3手机续航", "user_profile": ', "星辰X3手机续航"),  # cut after the colon
        ('{"rewritten_query": "星辰X3手机续航",', "星辰X3手机续航"),
        ('{"rewritten_query": "星辰X3手机续航"', "星辰X3手机续航"),  # only the brace missing
        ('```json\n{\n  "rewritten_query": "X3 续航",\n  "history_summary": "问过', "X3 续航"),  # fenced, pretty
        ('{"rewritten_query": "说\\"续航\\"的 X3", "user_profile": "学', '说"续航"的 X3'),  # escaped quotes
        ('{"rewritten_query": "a\\\\", "user_profile": "学', "a\\"),  # an escaped backslash ends the string
        ('{"rewritten_query": "星辰X3手机续航", "user_profile": "说\\"', "星辰X3手机续航"),  # cut after an escape
        ('{"note": 1} {"rewritten_query": "X3 续航", "user_profile": "学', "X3 续航"),  # another object first
    ],
)
def test_a_complete_query_in_a_truncated_reply_parses_and_is_marked(text: str, query: str) -> None:
    assert parse_rewrite(text) == ParsedRewrite(query, "", "", truncated=True)


def test_fields_complete_before_the_cut_are_kept_and_checked() -> None:
    text = '{"user_profile": "学生", "rewritten_query": "X3 续航", "history_summary": "问'  # the query not first
    assert parse_rewrite(text) == ParsedRewrite("X3 续航", "学生", "", truncated=True)
    assert parse_rewrite('{"rewritten_query": "X3 续航", "user_profile": 3, "history_summary": "问') is None
    long_profile = '{"rewritten_query": "X3 续航", "user_profile": "' + "x" * 3000 + '", "history_summary": "问'
    assert parse_rewrite(long_profile) is None


def test_a_whole_reply_is_not_marked_truncated() -> None:
    parsed = parse_rewrite('{"rewritten_query": "X3 续航", "user_profile": "学生"}')
    assert parsed == ParsedRewrite("X3 续航", "学生", "")
    assert parsed is not None
    assert not parsed.truncated


def test_an_empty_query_in_a_truncated_reply_needs_allow_empty() -> None:
    text = '{"rewritten_query": "", "user_profile": "学生'
    assert parse_rewrite(text) is None
    assert parse_rewrite(text, allow_empty=True) == ParsedRewrite("", truncated=True)
