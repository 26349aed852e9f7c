"""Tool calls in a model turn: hermes ``<tool_call>{json}</tool_call>`` blocks and OpenAI function-call JSON.

Hermes (Qwen2.5/Qwen3, NousResearch) writes each call as a tagged JSON object::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "17 * 23"}}
    </tool_call>

OpenAI-style models write a JSON object with ``tool_calls`` (``[{"type": "function",
"function": {"name": ..., "arguments": "<json string>"}}]``) or the older ``function_call``
(``{"name": ..., "arguments": ...}``), as the whole turn or in a fenced ````json`` block.
``arguments`` may be an object or a JSON string of one.

A call that cannot be read is kept as a :class:`ToolCall` with ``error`` set, so the agent
loop answers it with an error message instead of ignoring it or crashing. A plain JSON answer
(e.g. the query rewriter's ``{"rewritten_query": ...}``) is not a tool call: only the tags or
the ``tool_calls``/``function_call`` keys make one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass
class ToolCall:
    """One call the model made.

    Attributes:
        name: the tool's name ("" when it could not be read).
        arguments: the arguments object.
        error: why the call could not be read (None when it could).
        raw: the call's text as the model wrote it.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    raw: str = ""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The tool calls in `text`, in order; ``[]`` when the turn is a final answer.

    Hermes blocks win when present (an unclosed last block counts, its error says so);
    otherwise a ``tool_calls``/``function_call`` JSON object (the whole turn or a fenced block).
    """
    if "<tool_call>" in text:
        calls = []
        for match in _HERMES.finditer(text):
            body = match.group(1)
            closed = match.group(0).endswith("</tool_call>")
            call = _from_object_text(body)
            if not closed and call.error is None:
                call.error = "the <tool_call> block is not closed with </tool_call>"
            call.raw = match.group(0)
            calls.append(call)
        return calls
    for candidate in [text.strip(), *(m.group(1).strip() for m in _FENCE.finditer(text))]:
        if not candidate.startswith("{"):
            continue
        try:
            obj = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and ("tool_calls" in obj or "function_call" in obj):
            return _openai_calls(obj, candidate)
    return []


def _from_object_text(body: str) -> ToolCall:
    """A hermes block's JSON ``{"name": ..., "arguments": {...}}``."""
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as e:
        return ToolCall("", error=f"the tool call is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})")
    if not isinstance(obj, dict):
        return ToolCall("", error=f'a tool call must be a JSON object {{"name": ..., "arguments": ...}}, got {obj!r}')
    if "function" in obj and isinstance(obj["function"], dict):  # an OpenAI call object inside the tags
        obj = obj["function"]
    return _call(obj.get("name"), obj.get("arguments", obj.get("parameters", {})))


def _openai_calls(obj: dict[str, Any], raw: str) -> list[ToolCall]:
    if "function_call" in obj:
        items: Any = [{"function": obj["function_call"]}]
    else:
        items = obj["tool_calls"]
    if not isinstance(items, list):
        return [ToolCall("", error="'tool_calls' must be a list of calls", raw=raw)]
    calls = []
    for item in items:
        fn = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(fn, dict):
            calls.append(ToolCall("", error=f"a tool call must be an object, got {item!r}", raw=raw))
            continue
        call = _call(fn.get("name"), fn.get("arguments", {}))
        call.raw = raw
        calls.append(call)
    return calls


def _call(name: Any, arguments: Any) -> ToolCall:
    """Check the name and decode the arguments (an object, or a JSON string of one)."""
    if not isinstance(name, str) or not name:
        return ToolCall("", error='the tool call has no "name" string')
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(name, error=f"the arguments of {name!r} are not valid JSON: {e.msg}")
    if not isinstance(arguments, dict):
        return ToolCall(name, error=f"the arguments of {name!r} must be a JSON object, got {arguments!r}")
    return ToolCall(name, arguments)
