"""The package's layering (docs/architecture.md): a module imports only its own layer and the layers above.

Every ``import queryrl.X`` / ``from queryrl.X import`` in the package counts, also the ones inside a
function (a lazy import is still a dependency). Nothing outside ``queryrl/apps`` imports an
application: the library finds applications as plugins (``queryrl.application``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "queryrl"

# top to bottom; a unit is a subpackage or a top-level module of queryrl
LAYERS: list[set[str]] = [
    # utilities: the standard library (padding: torch), nothing else of queryrl but each other
    {
        "registry",
        "application",
        "atomic",
        "padding",
        "plugins",
        "redaction",
        "service_auth",
        "tracking",
        "fonts",
        "report",
        "report_examples",
        "report_page",
    },
    {"algos"},
    {"data"},
    {"models"},
    {"rollout"},
    {"rewards"},
    {"rag"},
    {"agent"},
    {"config"},
    {"engine"},
    {"distributed"},
    {"trainer"},
    {"apps"},
    {"errors"},
    {"cli", "__main__"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _unit(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.name != "__init__.py" else "queryrl"


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported queryrl unit, line) of every absolute queryrl import in `path`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "queryrl" and len(parts) > 1:
                out.append((parts[1], node.lineno))
    return out


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_unit_has_a_layer() -> None:
    units = {_unit(p) for p in _modules()} - {"queryrl"}
    assert units - set(RANK) == set(), "add the new package or module to LAYERS (and to docs/architecture.md)"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path: Path) -> None:
    unit = _unit(path)
    if unit == "queryrl":
        return
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports queryrl.{target} (layer {RANK[target]}) "
        f"from {unit} (layer {RANK[unit]})"
        for target, line in _imports(path)
        if target in RANK and target != unit and RANK[target] > RANK[unit]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from queryrl.apps.query_rewrite import plugin\n", encoding="utf-8")
    assert _imports(bad) == [("apps", 2)]
    assert RANK["apps"] > RANK["trainer"]  # so this line in queryrl/trainer would fail the test above
