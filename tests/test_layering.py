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
        "allocator",
        "atomic",
        "padding",
        "plugins",
        "redaction",
        "service_auth",
        "service_limits",
        "tracking",
        "fonts",
        "machine",
        "report",
        "report_examples",
        "report_page",
    },
    {"algos"},
    {"data"},
    {"models"},
    {"rollout"},
    {"rewards"},
    {"testing"},  # stand-ins of outside services: only the CLI's serve-judge imports it (see below)
    {"rag"},
    {"agent"},
    {"config"},
    {"engine"},
    {"distributed"},
    {"trainer"},
    {"apps"},
    {"errors"},
    {"cli", "cli_serve", "__main__"},
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


def test_only_the_cli_imports_the_stand_ins() -> None:
    """``queryrl.testing`` (a fake OpenAI server) serves tests and ``queryrl serve-judge``; no run depends on it."""
    users = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in _modules()
        if _unit(path) not in ("testing", "cli", "cli_serve")
        for target, line in _imports(path)
        if target == "testing"
    ]
    assert not users, "the library imports queryrl.testing: " + ", ".join(users)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from queryrl.apps.query_rewrite import plugin\n", encoding="utf-8")
    assert _imports(bad) == [("apps", 2)]
    assert RANK["apps"] > RANK["trainer"]  # so this line in queryrl/trainer would fail the test above


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` in `package` reads from (relative levels resolved)."""
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*up, base] if base else up)
    return base


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of package `root` it imports, at any depth (a lazy import inside a function is an
    edge too: it is the same dependency, paid later). ``from a import b`` is an edge to ``a.b`` where that is a
    module, else to ``a``; relative imports are resolved."""
    paths = {_module_name(p, root): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_base(node, package)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    found = cycles(import_graph(PACKAGE))
    assert not found, "modules that import each other (directly or through others): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_the_cycle_checker_sees_a_lazy_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "queryrl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "sub" / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "sub" / "a.py").write_text("from queryrl.sub.b import g\n", encoding="utf-8")
    (pkg / "sub" / "b.py").write_text("def g():\n    from . import a\n", encoding="utf-8")
    (pkg / "c.py").write_text("from queryrl.sub import a\n", encoding="utf-8")
    assert cycles(import_graph(pkg)) == [["queryrl.sub.a", "queryrl.sub.b"]]


# --- the query-rewrite application: the same treatment inside queryrl/apps/query_rewrite -----------------
# its parts top to bottom (the order argued in the app's __init__ docstring and docs/architecture.md); a part
# is a subpackage or a top-level module of the application
APP = PACKAGE / "apps" / "query_rewrite"
APP_NAME = "queryrl.apps.query_rewrite"
APP_LAYERS: list[set[str]] = [
    {"config", "prompts", "metrics", "corpora", "fencing"},  # leaves: the library only
    {"intent"},
    {"reward"},
    {"policy_rewriter", "training"},
    {"data"},
    {"demo"},
    {"eval"},
    {"warmup"},
    {"preflight", "commands"},
    {"plugin"},
]
APP_RANK = {part: i for i, layer in enumerate(APP_LAYERS) for part in layer}


def _app_part(path: Path, app: Path = APP) -> str:
    """The part of the application `path` is in (``""``: the package's own ``__init__``)."""
    rel = path.relative_to(app)
    return "" if rel.parts == ("__init__.py",) else rel.parts[0].removesuffix(".py")


def app_imports(path: Path, app: Path = APP, name: str = APP_NAME) -> list[tuple[str, int]]:
    """(imported part of the application, line) of every import of it in `path`, at any depth, relative
    imports resolved; ``from queryrl.apps.query_rewrite import X`` is part X, or ``""`` where X is one of the
    package's lazily imported names (whose modules may sit anywhere in the order)."""
    module = _module_name(path, app.parents[1])  # app: queryrl/apps/<name>
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            targets = [f"{base}.{a.name}" for a in node.names] if base == name else [base]
        for target in targets:
            if target == name or target.startswith(name + "."):
                part = target[len(name) + 1 :].split(".")[0]
                out.append((part if part in APP_RANK or not part else "", node.lineno))
    return sorted(out, key=lambda x: x[1])


def _app_modules() -> list[Path]:
    return sorted(p for p in APP.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_app_part_has_a_layer() -> None:
    parts = {_app_part(p) for p in _app_modules()} - {""}
    assert parts - set(APP_RANK) == set(), "add the new part to APP_LAYERS (and to the app's __init__ docstring)"


def _later_parts(path: Path, app: Path = APP, name: str = APP_NAME) -> list[str]:
    part = _app_part(path, app)
    if not part:
        return []  # the package's __init__ names everything lazily, by string
    return [
        f"{path.relative_to(app.parent)}:{line} imports "
        + (
            f"{target}/ (layer {APP_RANK[target]}) from {part} (layer {APP_RANK[part]})"
            if target
            else f"a lazy name of the package itself from {part}: import it from its module"
        )
        for target, line in app_imports(path, app, name)
        if target != part and (not target or APP_RANK[target] > APP_RANK[part])
    ]


@pytest.mark.parametrize("path", _app_modules(), ids=lambda p: str(p.relative_to(APP)))
def test_the_application_imports_follow_its_layers(path: Path) -> None:
    wrong = _later_parts(path)
    assert not wrong, "\n".join(wrong)


def test_the_app_checker_sees_a_lazy_import_of_a_later_part(tmp_path: Path) -> None:
    app = tmp_path / "queryrl" / "apps" / "query_rewrite"
    (app / "intent").mkdir(parents=True)
    for init in (tmp_path / "queryrl", tmp_path / "queryrl" / "apps", app, app / "intent"):
        (init / "__init__.py").write_text("", encoding="utf-8")
    bad = app / "intent" / "reading.py"
    bad.write_text(
        "from ..config import X\n"  # a leaf: fine
        "def f():\n    from queryrl.apps.query_rewrite.demo.phrases import HOMOPHONES\n"
        "from ..reward import judging\n"
        "from queryrl.apps.query_rewrite import sales_demo_corpus\n",
        encoding="utf-8",
    )
    assert app_imports(bad, app) == [("config", 1), ("demo", 3), ("reward", 4), ("", 5)]
    wrong = _later_parts(bad, app)
    assert len(wrong) == 3, wrong
    assert "demo/ (layer 5) from intent (layer 1)" in wrong[0]
