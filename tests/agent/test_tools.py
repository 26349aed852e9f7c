"""Tool-call parsing, the calculator (attack strings included), tools files, timeouts, truncation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from queryrl.agent import (
    Tool,
    ToolCall,
    ToolConfigError,
    ToolError,
    ToolSet,
    evaluate,
    load_tools,
    parse_tool_calls,
    tool_from_entry,
    truncate_text,
)
from queryrl.agent.builtin_tools import python, rag_search

REPO = Path(__file__).resolve().parents[2]

# --- parsing -------------------------------------------------------------------------------------


def test_hermes_blocks_are_parsed_in_order() -> None:
    text = (
        'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>\n'
        '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("calculator", {"expression": "1+2"}, None),
        ("python", {"code": "print(1)"}, None),
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>{"name": "calculator", "arguments": {</tool_call>', "not valid JSON"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}', "not closed"),
    ],
)
def test_a_malformed_hermes_call_is_kept_with_its_error(text: str, error: str) -> None:
    (call,) = parse_tool_calls(text)
    assert call.error is not None
    assert error in call.error


def test_openai_function_call_json_is_parsed() -> None:
    tool_calls = (
        '{"tool_calls": [{"id": "c1", "type": "function", '
        '"function": {"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}}]}'
    )
    (call,) = parse_tool_calls(tool_calls)
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "2*3"}, None)
    (old,) = parse_tool_calls('```json\n{"function_call": {"name": "f", "arguments": {"x": 1}}}\n```')
    assert (old.name, old.arguments) == ("f", {"x": 1})


@pytest.mark.parametrize(
    "text",
    ["The answer is 42.", '{"rewritten_query": "price of X", "user_profile": ""}', "{not json", ""],
)
def test_a_plain_answer_is_not_a_tool_call(text: str) -> None:
    assert parse_tool_calls(text) == []


# --- calculator ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [("17 * 23", "391"), ("2 + 3 * 4", "14"), ("(2 + 3) * 4", "20"), ("7 / 2", "3.5"), ("6 / 3", "2"),
     ("-2 ** 2", "-4"), ("2 ^ 10", "1024"), ("17 // 5 + 17 % 5", "5"), ("sqrt(16) + abs(-1)", "5"),
     ("round(pi, 2)", "3.14"), ("max(1, 2, 3)", "3")],
)  # fmt: skip
def test_calculator_values(expression: str, value: str) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "attack",
    [
        "__import__('os').system('echo hacked')",
        "().__class__.__bases__[0].__subclasses__()",
        "(1).__class__",
        "open('/etc/passwd')",
        "eval('1+1')",
        "exec('x=1')",
        "globals()",
        "lambda: 1",
        "[x for x in range(10)]",
        "'a' * 10",
        "x",
        "1 if 1 else 2",
        "a.b",
        "sqrt(x=4)",
        "",
        "1 +",
    ],
)
def test_calculator_refuses_anything_but_arithmetic(attack: str) -> None:
    with pytest.raises(ToolError):
        evaluate(attack)


@pytest.mark.parametrize(
    "huge",
    ["2 ** 10 ** 10", "9 ** 999999999", "(10 ** 99) * (10 ** 99)", "10 ** 1000", "-(7 ** 7 ** 7)", "1e308 * 10",
     "-" * 200 + "1", "1+" * 400 + "1"],
)  # fmt: skip
def test_calculator_huge_inputs_are_errors_not_hangs(huge: str) -> None:
    start = time.monotonic()
    with pytest.raises(ToolError):
        evaluate(huge)
    assert time.monotonic() - start < 1.0


def test_calculator_errors_reach_the_model_as_messages() -> None:
    tools = ToolSet([tool_from_entry({"name": "calculator"})])
    try:
        ok = tools.call(ToolCall("calculator", {"expression": "12 * 12"}))
        zero = tools.call(ToolCall("calculator", {"expression": "1 / 0"}))
        attack = tools.call(ToolCall("calculator", {"expression": "__import__('os')"}))
        bad_args = tools.call(ToolCall("calculator", {"expr": "1"}))
    finally:
        tools.close()
    assert (ok.text, ok.error) == ("144", False)
    assert zero.error
    assert zero.text == "Error: division by zero"
    assert attack.error
    assert attack.text.startswith("Error: unsupported syntax: Call")
    assert bad_args.error
    assert "invalid arguments for 'calculator'" in bad_args.text
    assert "expression" in bad_args.text


# --- tools: files, execution, limits -------------------------------------------------------------


def test_the_example_tools_file_loads() -> None:
    tools = load_tools(REPO / "configs" / "tools" / "calculator.yaml")
    assert [t.name for t in tools] == ["calculator", "python"]
    assert tools[1].config == {"timeout_s": 5.0, "memory_mb": 256}
    assert tools[1].parameters["required"] == ["code"]


def test_a_custom_tool_from_a_file_and_verl_layout(tmp_path: Path) -> None:
    (tmp_path / "my_tools.py").write_text(
        "def shout(arguments, suffix='!'):\n    return arguments['text'].upper() + suffix\n"
    )
    (tmp_path / "tools.yaml").write_text(
        "tools:\n"
        "  - tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: shout\n"
        "        description: Upper-case a text.\n"
        "        parameters: {type: object, properties: {text: {type: string}}, required: [text]}\n"
        "    implementation: my_tools.py:shout\n"
        "    config: {suffix: '!!'}\n"
    )
    (tool,) = load_tools(tmp_path / "tools.yaml")
    assert tool.schema()["function"]["name"] == "shout"
    tools = ToolSet([tool])
    try:
        assert tools.call(ToolCall("shout", {"text": "hi"})).text == "HI!!"
    finally:
        tools.close()


@pytest.mark.parametrize(
    "entry",
    [{"description": "no name"}, {"name": "x", "implementation": "nope"}, {"name": "calculator", "colour": "red"},
     {"name": "x", "implementation": "json:no_such_function", "parameters": {}}],
)  # fmt: skip
def test_bad_tool_entries_are_config_errors(entry: dict[str, Any]) -> None:
    with pytest.raises(ToolConfigError):
        tool_from_entry(entry)


def _slow(arguments: dict[str, Any]) -> str:
    time.sleep(1.0)
    return "late"


def _broken(arguments: dict[str, Any]) -> str:
    raise KeyError("boom")


def test_a_slow_or_failing_tool_is_an_error_message() -> None:
    schema = {"type": "object"}
    tools = ToolSet([Tool("slow", "", schema, _slow), Tool("broken", "", schema, _broken)], timeout_s=0.2)
    try:
        start = time.monotonic()
        slow = tools.call(ToolCall("slow", {}))
        assert time.monotonic() - start < 0.8
        broken = tools.call(ToolCall("broken", {}))
        unknown = tools.call(ToolCall("search_web", {}))
    finally:
        tools.close()
    assert slow.error
    assert slow.text == "Error: the tool call timed out after 0.2 s"
    assert broken.error
    assert broken.text == "Error: broken failed: KeyError: 'boom'"
    assert unknown.error
    assert unknown.text == "Error: unknown tool 'search_web'; available tools: broken, slow"


@pytest.mark.parametrize(
    ("side", "expected"),
    [("left", "abcd...(truncated)"), ("right", "(truncated)...wxyz"), ("middle", "ab...(truncated)...yz")],
)
def test_truncation_sides(side: str, expected: str) -> None:
    text = "abcdefghijklmnopqrstuvwxyz"
    assert truncate_text(text, 4, side) == expected
    assert truncate_text(text, 0, side) == text
    assert truncate_text("abc", 4, side) == "abc"


def test_python_tool_runs_in_the_sandbox() -> None:
    assert python({"code": "print(6 * 7)"}, timeout_s=10.0).strip() == "42"
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        python({"code": "1 / 0"}, timeout_s=10.0)


def test_rag_search_queries_the_in_process_service(tmp_path: Path) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(
        '{"doc_id": "d1", "title": "Phone", "content": "The phone costs 3000 yuan."}\n'
        '{"doc_id": "d2", "title": "Laptop", "content": "The laptop battery lasts 10 hours."}\n'
    )
    text = asyncio.run(rag_search({"query": "laptop battery"}, corpus=str(corpus), top_k=1))
    assert text.startswith("[d2] Laptop: The laptop battery")
    with pytest.raises(ToolError, match="not configured"):
        asyncio.run(rag_search({"query": "x"}))
