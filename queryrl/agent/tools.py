"""Tools: declared in YAML, run with a per-call timeout; every failure becomes a message to the model.

A tools file (``rollout.multi_turn.tools_config``)::

    tools:
      - name: calculator                 # what the model calls it
        description: Evaluate an arithmetic expression.
        parameters:                      # JSON schema of the arguments object
          type: object
          properties: {expression: {type: string}}
          required: [expression]
        implementation: calculator       # a built-in (calculator, python, rag_search),
                                         # "pkg.module:function" or "path/to/file.py:function"
        config: {}                       # keyword arguments for the implementation

``description`` and ``parameters`` default to the built-in's; ``implementation`` defaults to
``name``. verl's layout (``tool_schema: {type: function, function: {name, description,
parameters}}`` plus ``config``) is read too.

An implementation is ``fn(arguments: dict, **config) -> str`` (or ``async def``; a non-string
result is sent as JSON). It runs in a worker thread; past ``timeout_s`` the model gets a
timeout message and the episode goes on (a Python thread cannot be killed: a tool that can
hang must bound itself, as ``python`` does with its subprocess and ``calculator`` with its
size limits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from queryrl.agent.errors import ToolConfigError, ToolError
from queryrl.agent.parsing import ToolCall
from queryrl.plugins import PluginError, load_callable
from queryrl.rewards.json_extract import validate

ToolFn = Callable[..., Any]

TRUNCATE_SIDES = ("left", "right", "middle")


@dataclass
class Tool:
    """One declared tool.

    Attributes:
        name: what the model calls.
        description: what it does (for the model's system prompt).
        parameters: JSON schema of the arguments object.
        fn: the implementation.
        config: keyword arguments for ``fn``.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: ToolFn
    config: dict[str, Any] = field(default_factory=dict)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (``tools=`` of a chat template)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class ToolResult:
    """What one call returned: the text the model reads, and whether it is an error."""

    text: str
    error: bool


def truncate_text(text: str, max_chars: int, side: str) -> str:
    """`text` cut to `max_chars` characters (0 = no limit), with a marker; verl's sides.

    ``left`` keeps the beginning, ``right`` keeps the end, ``middle`` keeps both ends.
    """
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"truncate side must be one of {TRUNCATE_SIDES}, got {side!r}")
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + "...(truncated)..." + text[len(text) - (max_chars - half) :]


class ToolSet:
    """The tools of a run, and the calls to them.

    Args:
        tools: the declared tools.
        timeout_s: the limit on one call (wall clock).
        max_response_chars: the longest tool response the model reads (0 = no limit).
        truncate_side: which part of a longer response is kept (see :func:`truncate_text`).
        max_workers: threads running calls at once.
    """

    def __init__(
        self,
        tools: list[Tool],
        timeout_s: float = 10.0,
        max_response_chars: int = 0,
        truncate_side: str = "left",
        max_workers: int = 8,
    ) -> None:
        if truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"truncate_side must be one of {TRUNCATE_SIDES}, got {truncate_side!r}")
        self.tools = {t.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise ToolConfigError(f"tool names must be unique, got {[t.name for t in tools]}")
        self.timeout_s = timeout_s
        self.max_response_chars = max_response_chars
        self.truncate_side = truncate_side
        self._pool = cf.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="queryrl-tool")

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of every tool."""
        return [t.schema() for t in self.tools.values()]

    def submit(self, call: ToolCall) -> cf.Future[ToolResult]:
        """Start `call`; the future's result is always a :class:`ToolResult` (never an exception)."""
        done: cf.Future[ToolResult] = cf.Future()
        problem = self._check(call)
        if problem is not None:
            done.set_result(ToolResult(f"Error: {problem}", True))
            return done
        tool = self.tools[call.name]
        return self._pool.submit(_run, tool, call.arguments)

    def results(self, futures: list[cf.Future[ToolResult]]) -> list[ToolResult]:
        """Wait for `futures` (started together) within the per-call timeout; truncate the texts."""
        waited = cf.wait(futures, timeout=self.timeout_s)
        out = []
        for f in futures:
            if f in waited.done:
                r = f.result()
            else:
                f.cancel()
                r = ToolResult(f"Error: the tool call timed out after {self.timeout_s:g} s", True)
            out.append(ToolResult(truncate_text(r.text, self.max_response_chars, self.truncate_side), r.error))
        return out

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call and wait for it (see :meth:`results`)."""
        return self.results([self.submit(call)])[0]

    def _check(self, call: ToolCall) -> str | None:
        if call.error is not None:
            return call.error
        if call.name not in self.tools:
            return f"unknown tool {call.name!r}; available tools: {', '.join(sorted(self.tools)) or '(none)'}"
        problems = validate(call.arguments, self.tools[call.name].parameters)
        if problems:
            return f"invalid arguments for {call.name!r}: {'; '.join(problems)}"
        return None

    def close(self) -> None:
        """Stop the worker threads (without waiting for calls that timed out)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _run(tool: Tool, arguments: dict[str, Any]) -> ToolResult:
    """Call the implementation; a ToolError or any exception is an error message, not a crash."""
    try:
        value = tool.fn(arguments, **tool.config)
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
    except ToolError as e:
        return ToolResult(f"Error: {e}", True)
    except Exception as e:  # the tool's bug: the model reads it, the run goes on
        return ToolResult(f"Error: {tool.name} failed: {type(e).__name__}: {e}", True)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return ToolResult(text, False)


async def _awaited(value: Any) -> Any:
    return await value


def _resolve(spec: str, base: Path | None) -> ToolFn:
    """A built-in tool by name, ``pkg.module:function``, or ``file.py:function`` (relative to `base` first)."""
    from queryrl.agent.builtin_tools import BUILTIN_TOOLS

    builtins = {name: tool.fn for name, tool in BUILTIN_TOOLS.items()}
    try:
        return load_callable(spec, what="tool implementation", builtins=builtins, base=base)
    except PluginError as e:
        raise ToolConfigError(str(e)) from e


def tool_from_entry(entry: Mapping[str, Any], base: Path | None = None) -> Tool:
    """One entry of a tools file (see the module docstring) -> :class:`Tool`."""
    from queryrl.agent.builtin_tools import BUILTIN_TOOLS

    entry = dict(entry)
    schema = entry.pop("tool_schema", None)
    if isinstance(schema, Mapping):  # verl's layout
        fn_schema = schema.get("function", schema)
        entry = {**{k: fn_schema[k] for k in ("name", "description", "parameters") if k in fn_schema}, **entry}
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ToolConfigError(f"a tool needs a 'name', got {dict(entry)!r}")
    impl = str(entry.get("implementation") or entry.get("class_name") or name)
    builtin = BUILTIN_TOOLS.get(impl)
    description = entry.get("description", builtin.description if builtin else "")
    parameters = entry.get("parameters", builtin.parameters if builtin else None)
    if not isinstance(parameters, Mapping):
        raise ToolConfigError(f"tool {name!r} needs a JSON-schema 'parameters' object")
    config = entry.get("config") or {}
    if not isinstance(config, Mapping):
        raise ToolConfigError(f"tool {name!r}: 'config' must be a mapping")
    unknown = set(entry) - {"name", "description", "parameters", "implementation", "class_name", "config"}
    if unknown:
        raise ToolConfigError(f"tool {name!r}: unknown keys {sorted(unknown)}")
    return Tool(name, str(description), dict(parameters), _resolve(impl, base), dict(config))


def load_tools(path: str | Path) -> list[Tool]:
    """The tools declared in a YAML file ``{tools: [...]}`` (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ToolConfigError(f"tools file {str(path)!r} not found")
    data = yaml.safe_load(path.read_text())
    entries = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ToolConfigError(f"{path}: expected a mapping with a 'tools' list")
    return [tool_from_entry(e, path.parent) for e in entries]
