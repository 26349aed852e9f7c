"""The built-in tools: ``calculator`` (parsed with ``ast``, never ``eval``), ``python`` (the
sandbox of :mod:`queryrl.rewards.scorers.code`), ``rag_search`` (the RAG service's ``/rag/chat_8b``).

Each is ``fn(arguments: dict, **config) -> str`` and raises :class:`ToolError` for a bad input;
the message is what the model reads.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from queryrl.agent.errors import ToolError


@dataclass(frozen=True)
class BuiltinTool:
    """A built-in implementation with its default description and parameter schema."""

    fn: Callable[..., Any]
    description: str
    parameters: dict[str, Any]


# --- calculator -----------------------------------------------------------------------------------

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}
MAX_EXPRESSION_CHARS = 500
MAX_MAGNITUDE = 1e100  # every intermediate result stays below this (no huge-integer hangs)
MAX_DEPTH = 100


def _check_size(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolError(f"not a number: {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is not finite")
    if abs(value) > MAX_MAGNITUDE:
        raise ToolError(f"a number in the calculation exceeds {MAX_MAGNITUDE:g}")
    return value


def _power(base: Any, exponent: Any) -> Any:
    """``base ** exponent``, refused before computing when the result would be too large."""
    if base != 0 and exponent > 0 and abs(base) != 1 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise ToolError(f"{base} ** {exponent} is too large")
    if base == 0 and exponent < 0:
        raise ToolError("division by zero")
    result = base**exponent
    if isinstance(result, complex):
        raise ToolError("the result is a complex number")
    return result


def _eval(node: ast.AST, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ToolError("the expression is nested too deeply")
    if isinstance(node, ast.Expression):
        return _eval(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        return _check_size(node.value)
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise ToolError(f"unknown name {node.id!r}; constants: pi, e")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check_size(_UNARY[type(node.op)](_eval(node.operand, depth + 1)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        try:
            return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords:
            raise ToolError("keyword arguments are not supported")
        args = [_eval(a, depth + 1) for a in node.args]
        try:
            return _check_size(_FUNCTIONS[node.func.id](*args))
        except (ValueError, TypeError, OverflowError) as e:
            raise ToolError(f"{node.func.id}: {e}") from None
    raise ToolError(f"unsupported syntax: {type(node).__name__} (numbers, + - * / // % **, parentheses, "
                    f"{', '.join(_FUNCTIONS)} only)")  # fmt: skip


def format_number(value: float | int) -> str:
    """An integer-valued result without ``.0``; otherwise up to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def evaluate(expression: str) -> str:
    """The value of an arithmetic `expression`, as text; :class:`ToolError` for anything else.

    The expression is parsed with :mod:`ast` and walked node by node: numbers, ``+ - * / // %
    **``, unary signs, parentheses, a few math functions and ``pi``/``e``. Names, attributes,
    subscripts, lambdas, comprehensions are refused; every intermediate value stays under
    :data:`MAX_MAGNITUDE` and a power is refused before it is computed when it would exceed it,
    so no input can hang the trainer.
    """
    if not isinstance(expression, str):
        raise ToolError("the expression must be a string")
    expression = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if not expression:
        raise ToolError("the expression is empty")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as e:
        raise ToolError(f"cannot parse the expression: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, pathological nesting
        raise ToolError(f"cannot parse the expression: {type(e).__name__}") from None
    return format_number(_eval(tree))


def calculator(arguments: dict[str, Any]) -> str:
    """The ``calculator`` tool: ``{"expression": "17 * 23"}`` -> ``"391"``."""
    return evaluate(arguments.get("expression", ""))


# --- python ---------------------------------------------------------------------------------------


def python(arguments: dict[str, Any], timeout_s: float = 5.0, memory_mb: int = 512, isolation: str = "auto") -> str:
    """The ``python`` tool: run ``{"code": ...}`` in the sandbox of :func:`queryrl.rewards.scorers.code.run_code`
    (a subprocess with time and memory limits, no network, a temporary directory); returns what
    it printed, and its error output when it failed."""
    from queryrl.rewards.scorers.code import run_code

    code = arguments.get("code", "")
    if not isinstance(code, str) or not code.strip():
        raise ToolError("no code given")
    result = run_code(code, timeout_s=timeout_s, memory_mb=memory_mb, isolation=isolation)  # type: ignore[arg-type]
    if result.status == "ok":
        return result.stdout
    tail = result.stderr.strip().splitlines()[-3:]
    raise ToolError(f"{result.status}: " + ("\n".join(tail) if tail else f"exit code {result.returncode}"))


# --- rag_search -----------------------------------------------------------------------------------


@functools.cache
def _in_process_rag(corpus: str, top_k: int) -> Any:
    from queryrl.rag.index import BM25Index, load_corpus
    from queryrl.rag.service import InProcessRAG

    return InProcessRAG(BM25Index(load_corpus(corpus)), top_k=top_k)


async def rag_search(
    arguments: dict[str, Any],
    base_url: str = "",
    corpus: str = "",
    top_k: int = 3,
    timeout_s: float = 10.0,
    max_content_chars: int = 300,
    tenant_id: str = "agent",
    score_threshold: float = 0.0,
    token_env: str | None = None,
) -> str:
    """The ``rag_search`` tool: ``{"query": ...}`` sent as ``rewritten_query`` to ``POST /rag/chat_8b``
    of the RAG service at `base_url` (with the bearer token in the variable `token_env`, if given), or
    to an in-process service over the `corpus` file; returns the top documents as ``[doc_id] title:
    content`` lines."""
    from queryrl.rag.client import RAGClient, RAGError

    query = arguments.get("query", "")
    if not isinstance(query, str) or not query.strip():
        raise ToolError("the query is empty")
    if not base_url and not corpus:
        raise ToolError("rag_search is not configured: set config.base_url or config.corpus in the tools file")
    client = RAGClient(base_url or _in_process_rag(corpus, top_k), timeout_s=timeout_s, token_env=token_env or None)
    fields = {
        "tenant_id": tenant_id,
        "contact_id": "agent",
        "account_id": "agent",
        "message_id": "agent",
        "contexts": [{"role": "user", "content": query}],
        "score_threshold": score_threshold,
        "rewritten_query": query,
    }
    try:
        result = await client.chat_8b(**fields)
    except RAGError as e:
        raise ToolError(f"the search failed: {e}") from None
    finally:
        await client.aclose()
    docs = result.get("response") or []
    if not docs:
        return "No documents found."
    lines = [
        f"[{d.get('doc_id', '')}] {d.get('title', '')}: {str(d.get('content', ''))[:max_content_chars]}"
        for d in docs[:top_k]
    ]
    return "\n".join(lines)


BUILTIN_TOOLS: dict[str, BuiltinTool] = {
    "calculator": BuiltinTool(
        calculator,
        "Evaluate an arithmetic expression (numbers, + - * / // % **, parentheses, sqrt, log, ...).",
        {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (17 + 5) * 3"}},
            "required": ["expression"],
        },
    ),
    "python": BuiltinTool(
        python,
        "Run a Python program in a sandbox (no network, time and memory limits) and return what it printed.",
        {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program; print the result"}},
            "required": ["code"],
        },
    ),
    "rag_search": BuiltinTool(
        rag_search,
        "Search the knowledge base with a standalone query; returns the top documents.",
        {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "a standalone search query"}},
            "required": ["query"],
        },
    ),
}
