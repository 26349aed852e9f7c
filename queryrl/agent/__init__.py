"""Multi-turn agent rollouts with tool calling (a layer between ``rag`` and ``trainer``).

``rollout.multi_turn.enable=true`` wraps the rollout backend in :class:`AgentRollout`: the
policy writes a turn, the row's agent loop (``single_turn``, ``tool_agent`` or a registered
one) answers it, e.g. with tool results, until a final answer or a limit. Tool outputs are in
the context with ``response_mask`` 0. See :mod:`queryrl.agent.loop` and :mod:`queryrl.agent.tools`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from queryrl.agent.builtin_tools import BUILTIN_TOOLS, calculator, evaluate
from queryrl.agent.loop import (
    AGENT_LOOPS,
    AgentLoop,
    AgentRollout,
    AgentSettings,
    ChatContinuation,
    Episode,
    SingleTurnAgent,
    ToolAgent,
    episode_metrics,
)
from queryrl.agent.parsing import ToolCall, parse_tool_calls
from queryrl.agent.tools import (
    Tool,
    ToolConfigError,
    ToolError,
    ToolResult,
    ToolSet,
    load_tools,
    tool_from_entry,
    truncate_text,
)


def import_plugin(spec: str) -> None:
    """Import a module (dotted name) or a ``.py`` file, so that it registers agent loops."""
    if spec.endswith(".py"):
        from queryrl.plugins import import_file

        import_file(Path(spec).resolve(), "agent plugin file")
    else:
        importlib.import_module(spec)


def build_tool_set(cfg: Any) -> ToolSet:
    """The tools of ``rollout.multi_turn``: built-ins named in ``tools`` plus the ``tools_config`` file."""
    tools = [tool_from_entry({"name": name}) for name in cfg.tools]
    if cfg.tools_config:
        tools += load_tools(cfg.tools_config)
    return ToolSet(
        tools,
        timeout_s=cfg.tool_timeout_s,
        max_response_chars=cfg.max_tool_response_length,
        truncate_side=cfg.truncate_side,
    )


def build_agent_rollout(inner: Any, tokenizer: Any, cfg: Any, micro_batch_size: int) -> AgentRollout:
    """Wrap the rollout backend `inner` in the agent loop described by ``rollout.multi_turn`` (`cfg`)."""
    for spec in cfg.plugins:
        import_plugin(str(spec))
    settings = AgentSettings(
        max_turns=cfg.max_turns,
        max_tool_calls=cfg.max_tool_calls,
        agent_key=cfg.agent_key,
        default_agent=cfg.default_agent,
        prefix_key=cfg.prefix_key,
    )
    return AgentRollout(inner, tokenizer, settings, build_tool_set(cfg), micro_batch_size)


__all__ = [
    "AGENT_LOOPS",
    "BUILTIN_TOOLS",
    "AgentLoop",
    "AgentRollout",
    "AgentSettings",
    "ChatContinuation",
    "Episode",
    "SingleTurnAgent",
    "Tool",
    "ToolAgent",
    "ToolCall",
    "ToolConfigError",
    "ToolError",
    "ToolResult",
    "ToolSet",
    "build_agent_rollout",
    "build_tool_set",
    "calculator",
    "episode_metrics",
    "evaluate",
    "import_plugin",
    "load_tools",
    "parse_tool_calls",
    "tool_from_entry",
    "truncate_text",
]
