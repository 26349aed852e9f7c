"""Sizes a reader can hold: no module of ``queryrl/`` over 500 lines and no function over 60.

A function's size is its body without its docstring: a command's signature (typer's declarative list of
options, one ``Annotated`` line each) and its documentation are not counted; every statement is.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "queryrl"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def function_sizes(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(name, first line, body lines without the docstring) of every function and method in `tree`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                body = body[1:]
            if body:
                out.append((node.name, node.lineno, int(node.end_lineno or 0) - body[0].lineno + 1))
    return out


def test_no_module_over_500_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these modules (lines): {long}"


def test_no_function_over_60_lines() -> None:
    long = [
        f"{p.relative_to(PACKAGE)}:{line} {name} ({size} lines)"
        for p in sorted(PACKAGE.rglob("*.py"))
        for name, line, size in function_sizes(ast.parse(p.read_text(encoding="utf-8")))
        if size > MAX_FUNCTION_LINES
    ]
    assert not long, "split these functions:\n" + "\n".join(long)


def test_the_size_counts_bodies_without_docstrings() -> None:
    source = (
        'def f(\n    a: int,\n    b: int,\n) -> int:\n    """Doc.\n\n    More.\n    """\n    x = a\n    return x + b\n'
    )
    assert function_sizes(ast.parse(source)) == [("f", 1, 2)]
