"""docs/configuration.md, written from the config schema itself: every key, its type, default and comment.

    python tools/config_reference.py           # writes docs/configuration.md
    python tools/config_reference.py --check   # exit 1 when the page differs from what the schema gives

Each node is a dataclass (:mod:`queryrl.config.schema`, and each installed application's node under
``app.<name>``); a key's meaning is the comment beside it or the comment lines just above it in the source.
``tests/test_docs.py`` runs ``--check``, so a key added to the schema without a page update fails the suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "configuration.md"
HEADER = """# Configuration reference

Every key `queryrl train` and `queryrl sft` accept, with its type, default and meaning, generated from the
schema's dataclasses by `python tools/config_reference.py` (the test suite fails when this page falls behind
the schema). Set a key in a YAML file (`--config`) or on the command line as `key.sub=value`; verl's
spellings of many keys are accepted too (`queryrl/config/aliases.py`) and mapped to these names. A key that
is not here is refused with the closest names.

"""


def field_comments(cls: type) -> dict[str, str]:
    """Each field of dataclass `cls` -> its comment: the one on its line, else the comment lines just above."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[str, str] = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        name = stripped.split(":", 1)[0].strip()
        if name not in names or name in out or not line.startswith("    ") or line.startswith("     "):
            continue
        if number in comments and not stripped.startswith("#"):
            out[name] = comments[number]
            continue
        above: list[str] = []
        k = number - 1
        while k >= 1 and lines[k - 1].strip().startswith("#"):
            above.insert(0, comments[k])
            k -= 1
        out[name] = " ".join(above)
    return out


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


def _cell(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        return ""
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
    if isinstance(value, str):
        text = value if value else '""'
    return f"`{text}`".replace("|", "\\|")


def verl_names() -> dict[str, str]:
    """queryrl key -> the verl key accepted for it (the first, where several map to one; a subtree alias
    ``a.*`` -> ``b.*`` names each key under it)."""
    from queryrl.config.aliases import VERL_ALIASES

    out: dict[str, str] = {}
    for verl, ours in VERL_ALIASES.items():
        out.setdefault(ours, verl)
    return out


def _verl_cell(key: str, names: dict[str, str]) -> str:
    if key in names:
        return f"`{names[key]}`"
    for ours, verl in names.items():
        if ours.endswith(".*") and key.startswith(ours[:-1]):
            return f"`{verl[:-1]}{key[len(ours) - 1 :]}`"
    return ""


def node_tables(prefix: str, cls: type, out: list[str]) -> None:
    """Append the table of node `prefix` (dataclass `cls`), then its sub-nodes' tables, to `out`."""
    comments = field_comments(cls)
    verl = verl_names()
    doc = inspect.getdoc(cls) or ""
    rows, children = [], []
    for f in dataclasses.fields(cls):
        value = _default(f)
        if dataclasses.is_dataclass(value):
            children.append((f"{prefix}.{f.name}", type(value)))
            continue
        kind = str(f.type).replace("|", "\\|")
        meaning = comments.get(f.name, "").replace("|", "\\|")
        key = f"{prefix}.{f.name}"
        rows.append(f"| `{key}` | `{kind}` | {_cell(value)} | {meaning} | {_verl_cell(key, verl)} |")
    if rows:
        out.append(f"## `{prefix}`\n")
        own = doc.split("\n\n")[0].replace("\n", " ") if doc and not doc.startswith(cls.__name__ + "(") else ""
        if own:
            out.append(own + "\n")
        out.append("| key | type | default | meaning | verl's key |\n| --- | --- | --- | --- | --- |")
        out.extend(rows)
        out.append("")
    for child_prefix, child in children:
        node_tables(child_prefix, child, out)


def render() -> str:
    from queryrl.application import load_apps
    from queryrl.config.schema import QueryRLConfig

    out = [HEADER]
    for f in dataclasses.fields(QueryRLConfig):
        value = _default(f)
        if f.name == "app":
            for app in sorted(load_apps(), key=lambda a: a.name):
                node_tables(f"app.{app.name}", app.config, out)
        elif dataclasses.is_dataclass(value):
            node_tables(f.name, type(value), out)
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    sys.path.insert(0, str(REPO))  # this checkout's queryrl, whichever one is installed
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with docs/configuration.md; write nothing")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(REPO)} is behind the config schema: run python tools/config_reference.py")
            return 1
        return 0
    tmp = PAGE.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(PAGE)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
