"""Nothing in the repository points at a name or a document that is not in it.

- Every Sphinx-role reference (``:func:``, ``:class:``, ``:mod:``, ``:meth:``, ``:attr:``, ``:data:``, ``:exc:``,
  ``:obj:``, ``:const:``) in the Python files of ``queryrl/``, ``benchmarks/``, ``experiments/``, ``tools/`` and
  ``tests/`` names something those files define. The names are read with ``ast`` (nothing is imported): modules,
  their classes, functions and assignments, a class's members and the ``self.x`` its methods set, and every name a
  module imports (a package's re-export, e.g. ``queryrl.rag.RAGClient``, has the members of what it re-exports).
  A reference resolves as Sphinx resolves it: ``~`` only shortens what is shown; ``.name`` is any name ending in
  ``.name``; ``..x.y`` is relative to the module's package, as an import would be; a dotted name under
  ``queryrl``, ``benchmarks``, ``tools`` or ``tests`` must exist as written; a bare name is the module's own or
  one of its classes' (a name under an installed package of someone else's, ``torch.Tensor``, is not checked).
  Docstrings and comments are read; a string value in code is data (a test's example of markup).
- Every dotted ``queryrl.x.y`` in README.md and docs/*.md names a module or a name in one.
- No tracked text file cites the design notes that lived beside the repository, never in it (their file name,
  their folder, or the spec's number with a section sign): the repository's own docs are the design.
"""

from __future__ import annotations

import ast
import bisect
import functools
import importlib.util
import io
import re
import subprocess
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("queryrl", "benchmarks", "experiments", "tools", "tests")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`([^`]+)`")
DOTTED = re.compile(r"(?<![\w./-])queryrl(?:\.[A-Za-z_]\w*)+")
REFERENCE = re.compile(r"~?\.{0,4}[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# written in two pieces so that this file does not mention them itself
OUTSIDE = (
    ("ARCHITECTURE" + ".md", False),
    ("shared" + "/design", False),
    ("seed" + " 000", True),  # the users' spec, by its number in the notes: say what it is instead
)


@dataclass
class Names:
    """Every dotted name the Python files of a tree define or import."""

    names: set[str] = field(default_factory=set)
    aliases: dict[str, str] = field(default_factory=dict)  # module.name -> what it imports
    modules: dict[Path, str] = field(default_factory=dict)

    def expand_aliases(self) -> None:
        """A re-exported name has the members of what it re-exports (a chain of re-exports too)."""
        for _ in range(4):
            ordered = sorted(self.names)
            found: set[str] = set()
            for alias, target in self.aliases.items():
                i = bisect.bisect_left(ordered, target + ".")
                while i < len(ordered) and ordered[i].startswith(target + "."):
                    found.add(alias + ordered[i][len(target) :])
                    i += 1
            if found <= self.names:
                return
            self.names |= found


def module_name(path: Path, repo: Path) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    base = node.module or ""
    if not node.level:
        return base
    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join([*up, base] if base else up)


def _self_attributes(function: ast.AST, prefix: str, out: Names) -> None:
    for node in ast.walk(function):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                out.names.add(f"{prefix}.{target.attr}")


def _define(body: Iterable[ast.stmt], prefix: str, package: str, out: Names, in_class: bool = False) -> None:
    for node in body:
        if isinstance(node, ast.ClassDef):
            out.names.add(f"{prefix}.{node.name}")
            _define(node.body, f"{prefix}.{node.name}", package, out, in_class=True)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.names.add(f"{prefix}.{node.name}")
            if in_class:
                _self_attributes(node, prefix, out)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                out.names.update(f"{prefix}.{n.id}" for n in ast.walk(target) if isinstance(n, ast.Name))
                if (
                    isinstance(target, ast.Name)
                    and target.id == "__all__"
                    and isinstance(node.value, ast.List | ast.Tuple)
                ):
                    # the names a package gives on first use (PEP 562 __getattr__) are listed here
                    out.names.update(
                        f"{prefix}.{e.value}"
                        for e in node.value.elts
                        if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    )
        elif isinstance(node, ast.ImportFrom) and not in_class:
            base = _absolute(node, package)
            for alias in node.names:
                out.names.add(f"{prefix}.{alias.asname or alias.name}")
                out.aliases[f"{prefix}.{alias.asname or alias.name}"] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import) and not in_class:
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                out.names.add(f"{prefix}.{local}")
                out.aliases[f"{prefix}.{local}"] = alias.name if alias.asname else local
        elif isinstance(node, (ast.If, ast.Try, ast.With)):  # TYPE_CHECKING blocks, optional imports
            for part in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                _define(part, prefix, package, out, in_class)
            for handler in getattr(node, "handlers", []):
                _define(handler.body, prefix, package, out, in_class)


def index(repo: Path, roots: Iterable[str] = ROOTS) -> Names:
    out = Names()
    for root in roots:
        for path in sorted((repo / root).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            name = module_name(path, repo)
            out.modules[path] = name
            out.names.add(name)
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            _define(ast.parse(path.read_text(encoding="utf-8")).body, name, package, out)
    out.expand_aliases()
    return out


def _external(first: str) -> bool:
    """`first` is a top-level package installed here that is not one of ours (torch, numpy, json)."""
    try:
        return importlib.util.find_spec(first) is not None
    except (ImportError, ValueError):
        return False


def resolves(reference: str, module: str, is_package: bool, names: Names, roots: Iterable[str] = ROOTS) -> bool:
    """Whether `reference` (a role's target) in `module` names something (see the module doc)."""
    ref = reference.strip()
    if "<" in ref and ref.endswith(">"):  # "shown text <target>"
        ref = ref[ref.index("<") + 1 : -1]
    ref = ref.lstrip("~").removesuffix("()")
    if not REFERENCE.fullmatch(ref):
        return False
    if ref.startswith(".."):
        level = len(ref) - len(ref.lstrip("."))
        package = (module if is_package else module.rpartition(".")[0]).split(".")
        return ".".join([*package[: len(package) - (level - 1)], ref.lstrip(".")]) in names.names
    if ref.startswith("."):
        return any(n.endswith(ref) for n in names.names)
    first = ref.split(".")[0]
    if first in roots:
        return ref in names.names
    if f"{module}.{ref}" in names.names:
        return True
    depth = module.count(".") + ref.count(".") + 2  # module.Class.ref
    if any(n.startswith(module + ".") and n.endswith("." + ref) and n.count(".") == depth for n in names.names):
        return True
    imported = names.aliases.get(f"{module}.{first}")  # a module the file imports: what it names there
    if imported is not None and imported.split(".")[0] not in roots:
        return _external(imported.split(".")[0])
    return imported is None and _external(first)


def documentation(path: Path) -> Iterator[tuple[int, str]]:
    """(first line, text) of every docstring of `path` (a string standing as a statement: a module's, a class's,
    a function's or an attribute's) and of every comment; string values in code are data, not references."""
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def broken_references(names: Names, repo: Path = REPO) -> list[str]:
    out = []
    for path, module in names.modules.items():
        for line, text in documentation(path):
            for m in ROLE.finditer(text):
                if not resolves(m.group(1), module, path.name == "__init__.py", names):
                    out.append(f"{path.relative_to(repo)}:{line + text[: m.start()].count(chr(10))}: {m.group(0)}")
    return sorted(out, key=lambda x: (x.split(":")[0], int(x.split(":")[1])))


@functools.cache
def repository_names() -> Names:
    return index(REPO)


def test_every_docstring_reference_names_something_that_exists() -> None:
    broken = broken_references(repository_names())
    assert not broken, f"{len(broken)} references to names that do not exist:\n" + "\n".join(broken)


def test_every_queryrl_name_in_the_docs_exists() -> None:
    names = repository_names().names
    broken = [
        f"{page.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}"
        for page in PAGES
        for text in [page.read_text(encoding="utf-8")]
        for m in DOTTED.finditer(text)
        if m.group(0) not in names
    ]
    assert not broken, "names in README/docs that do not exist:\n" + "\n".join(broken)


def tracked_text_files(repo: Path = REPO) -> Iterator[tuple[Path, str]]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
        paths = [repo / p for p in listed.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but the usual clutter
        skip = {".git", ".venv", "runs", "__pycache__", "site", "node_modules"}
        paths = [p for p in repo.rglob("*") if p.is_file() and not skip & set(p.relative_to(repo).parts)]
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue  # listed but gone (deleted in the working tree)
        if b"\0" in data[:8192]:
            continue
        try:
            yield path, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def outside_mentions(text: str) -> list[str]:
    found = []
    for phrase, any_case in OUTSIDE:
        hay, needle = (text.lower(), phrase.lower()) if any_case else (text, phrase)
        if needle in hay:
            found.append(phrase)
    return found


def test_no_file_cites_notes_outside_the_repository() -> None:
    cited = [
        f"{path.relative_to(REPO)}: {', '.join(found)}"
        for path, text in tracked_text_files()
        if (found := outside_mentions(text))
    ]
    assert not cited, "say what is meant (the repository's docs are the design):\n" + "\n".join(cited)


# --- the checkers themselves ------------------------------------------------------------------------------


def test_the_reference_checker_tells_broken_from_sound(tmp_path: Path) -> None:
    pkg = tmp_path / "queryrl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "sub" / "__init__.py").write_text("from .impl import Client as Client\n", encoding="utf-8")
    role = ":" + "func:"  # kept in pieces so that this file's own text has no such reference
    (pkg / "sub" / "impl.py").write_text(
        "class Client:\n"
        "    limit = 3\n"
        "    def __init__(self):\n        self.calls = 0\n"
        "    def both(self):\n        pass\n"
        "def helper():\n    pass\n",
        encoding="utf-8",
    )
    (pkg / "other").mkdir()
    (pkg / "other" / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "other" / "user.py").write_text(
        f'"""{role}`~.impl.helper` {role}`..sub.impl.helper` {role}`queryrl.sub.Client.both` '
        f"{role}`Client.calls` {role}`json.dumps` {role}`~.gone_module.helper` "
        f'{role}`queryrl.sub.Client.missing` {role}`Trainer` {role}`.sub.helper` {role}`Client.gone`"""\n'
        "import json\n"
        "from queryrl.sub.impl import Client\n"
        f'EXAMPLE = "{role}`Nowhere`"  # a value in code is data; {role}`Missing` in a comment is a reference\n',
        encoding="utf-8",
    )
    names = index(tmp_path, ("queryrl",))
    broken = [line.rsplit(": ", 1)[1] for line in broken_references(names, tmp_path)]
    assert broken == [
        f"{role}`~.gone_module.helper`",
        f"{role}`queryrl.sub.Client.missing`",
        f"{role}`Trainer`",
        f"{role}`.sub.helper`",
        f"{role}`Client.gone`",
        f"{role}`Missing`",
    ]
    assert resolves("queryrl.sub.Client.limit", "queryrl.other.user", False, names)  # a re-export has its members


def test_outside_mentions_are_seen_in_any_case_where_asked() -> None:
    assert outside_mentions("see docs/architecture.md") == []  # the repository's own page
    assert outside_mentions("(" + "ARCHITECTURE" + ".md §6)") == ["ARCHITECTURE" + ".md"]
    assert outside_mentions("Seed" + " 000's launch keys") == ["seed" + " 000"]
    assert outside_mentions("../" + "shared" + "/design/x") == ["shared" + "/design"]


def test_the_docs_checker_sees_a_missing_name() -> None:
    text = "`queryrl.rag.RAGClient`, queryrl.rag.nowhere_at_all; not queryrl/rag/client.py nor my.queryrl.x"
    assert DOTTED.findall(text) == ["queryrl.rag.RAGClient", "queryrl.rag.nowhere_at_all"]
    names = repository_names().names
    assert "queryrl.rag.RAGClient" in names
    assert "queryrl.rag.nowhere_at_all" not in names
