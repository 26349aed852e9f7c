"""The agent's two errors, here so that the tool contract (:mod:`.tools`) and the built-in tools
(:mod:`.builtin_tools`) both import them without importing each other."""

from __future__ import annotations


class ToolError(Exception):
    """Raised by a tool for a bad input; its message is what the model reads."""


class ToolConfigError(ValueError):
    """A tools file that cannot be loaded."""
