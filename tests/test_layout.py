"""The test tree's layout: it mirrors ``queryrl/`` (and ``benchmarks/``), and no test module imports from
another test module or from a ``conftest.py``.

Shared helpers live in ``tests/helpers.py`` or ``tests/<package>/helpers.py`` (plain functions) and in
``conftest.py`` files (fixtures, which pytest injects by name and nothing imports).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _is_test_or_conftest(module: str, root: Path) -> bool:
    """Whether dotted `module` names a ``test_*.py`` file or a ``conftest.py`` under `root` (named ``tests``)."""
    parts = module.split(".")
    if parts[0] != root.name or len(parts) < 2:
        return False
    stem = parts[-1]
    if not (stem.startswith("test_") or stem == "conftest"):
        return False
    return root.joinpath(*parts[1:-1], stem + ".py").is_file()


def _imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """Every module an import in `tree` may load, with its line: ``from a import b`` yields ``a`` and ``a.b``.

    Relative imports are resolved against `package` (the dotted package of the file). Python code inside
    string literals (a driver script a test runs in a subprocess) is searched too.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                inner = ast.parse(node.value)
            except SyntaxError:
                continue
            found += [(node.lineno, name) for _, name in _imported_modules(inner, package)]
    return found


def cross_test_imports(root: Path) -> list[str]:
    """``path:line: module`` for every import, in any ``.py`` file under `root`, of a test module or a conftest.

    Args:
        root: The test tree (its folder name is the top-level package, ``tests``).

    Returns:
        The offending imports, sorted; empty when the layout is clean.
    """
    bad: set[tuple[str, int, str]] = set()
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent)
        package = ".".join(rel.parent.parts)
        for line, module in _imported_modules(ast.parse(path.read_text(encoding="utf-8")), package):
            if _is_test_or_conftest(module, root):
                bad.add((rel.as_posix(), line, module))
    return [f"{rel}:{line}: {module}" for rel, line, module in sorted(bad)]


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    assert cross_test_imports(TESTS) == [], "move the shared code to tests/helpers.py or tests/<package>/helpers.py"


@pytest.mark.parametrize(
    ("source", "offender"),
    [
        ("from tests.pkg.test_a import helper\n", "tests.pkg.test_a"),
        ("from tests.pkg import test_a\n", "tests.pkg.test_a"),
        ("import tests.pkg.test_a\n", "tests.pkg.test_a"),
        ("from .test_a import helper\n", "tests.pkg.test_a"),
        ("from . import test_a\n", "tests.pkg.test_a"),
        ("from ..pkg.test_a import helper\n", "tests.pkg.test_a"),
        ("from tests.pkg.conftest import DATA\n", "tests.pkg.conftest"),
        ('DRIVER = """\nfrom tests.pkg.test_a import helper\n"""\n', "tests.pkg.test_a"),
        ("from tests.pkg.helpers import helper\n", None),
        ("from tests.helpers import make_cfg\n", None),
        ("from tests.pkg.test_missing import helper\n", None),  # no such file: not a test module
        ("from queryrl.test_a import helper\n", None),
        ('TEXT = "import is a word here"\n', None),
    ],
)
def test_the_check_finds_each_form_of_import(tmp_path: Path, source: str, offender: str | None) -> None:
    root = tmp_path / "tests"
    (root / "pkg").mkdir(parents=True)
    for name in ("__init__.py", "pkg/__init__.py", "pkg/test_a.py", "pkg/conftest.py", "pkg/helpers.py", "helpers.py"):
        (root / name).write_text('"""A module."""\n')
    (root / "pkg" / "test_b.py").write_text(source)
    assert cross_test_imports(root) == ([f"tests/pkg/test_b.py:1: {offender}"] if offender else [])


def unmirrored(tests: Path, sources: dict[str, Path]) -> list[str]:
    """Folders of test modules under `tests` that name no package of the `sources` (``{"": queryrl/,
    "benchmarks": benchmarks/}``: a folder ``tests/a/b`` mirrors ``queryrl/a/b`` or, under ``tests/benchmarks``,
    the scripts' folder), and packages of ``queryrl/`` with modules of their own but no such test folder."""
    problems = []
    test_dirs = {p.parent.relative_to(tests).as_posix() for p in tests.rglob("test_*.py")} - {"."}
    for rel in sorted(test_dirs):
        top, _, rest = rel.partition("/")
        prefix, inner = (top, rest) if top in sources else ("", rel)
        source = sources[prefix] / inner
        if not source.is_dir():
            shown = "/".join(part for part in (sources[prefix].name, inner) if part)
            problems.append(f"tests/{rel}: no {shown} to mirror")
    package_root = sources[""]
    for init in sorted(package_root.rglob("__init__.py")):
        folder = init.parent
        rel = folder.relative_to(package_root).as_posix()
        has_modules = any(p.name != "__init__.py" for p in folder.glob("*.py"))
        if rel != "." and has_modules and rel not in test_dirs:
            problems.append(f"{package_root.name}/{rel}: no tests/{rel}")
    return problems


def test_the_test_tree_mirrors_the_package() -> None:
    repo = TESTS.parent
    assert unmirrored(TESTS, {"": repo / "queryrl", "benchmarks": repo / "benchmarks"}) == []


def test_the_mirror_check_names_what_is_off(tmp_path: Path) -> None:
    pkg, tests = tmp_path / "pkg", tmp_path / "tests"
    for name in ("__init__.py", "a/__init__.py", "a/mod.py", "b/__init__.py", "b/mod.py", "c/__init__.py"):
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text("")
    for name in ("test_top.py", "a/test_mod.py", "x/test_stray.py"):
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text("")
    assert unmirrored(tests, {"": pkg}) == ["tests/x: no pkg/x to mirror", "pkg/b: no tests/b"]
