"""What a GGUF model's source says about its licence, gathered and quoted, never guessed.

Read, in this order:

- the GGUF file's ``general.license`` (llama.cpp's converter copies the model card's ``license:``);
- the ``License`` and ``License-Expression`` fields and the ``License ::`` classifiers of the installed
  distribution's metadata;
- the ``license:`` (and ``license_name:``, ``license_link:``) keys of the YAML front matter of the
  README files in the source's folders (Hugging Face model cards, e.g. ``README.upstream.md``);
- lines that mention a licence or terms in the source's NOTICE files and in the distribution's
  description, quoted as written (e.g. "upstream Gemma terms apply");
- the licence-like files shipped (LICENSE*, LICENCE*, COPYING*, NOTICE*, *TERMS*).

``stated`` lists the distinct values of the first three; it is empty when the source states none.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

MENTION = re.compile(r"\blicen[cs]\w*|\bterms\b", re.IGNORECASE)
LICENCE_FILE = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE)|TERMS", re.IGNORECASE)
FRONT_MATTER_KEYS = ("license", "license_name", "license_link")
MAX_NOTES = 8
MAX_SCANNED = 200_000  # characters of a README or NOTICE file read


def licence_record(general_license: str | None, folders: Iterable[Path], distribution: str | None) -> dict[str, Any]:
    """``{"stated": [...], "sources": [{"from", "value"}], "notes": [...], "files": [...]}`` for a source
    whose GGUF file says `general_license` (or nothing), found in `folders`, from `distribution`."""
    folders = list(folders)
    sources: list[dict[str, str]] = []
    notes: list[str] = []
    files: list[str] = []
    if general_license:
        sources.append({"from": "GGUF general.license", "value": general_license})
    if distribution is not None:
        meta, dist_files = _distribution_facts(distribution)
        sources += meta["sources"]
        notes += _mentions(meta["description"])
        files += dist_files
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix.lower() == ".md" and path.name.upper().startswith("README"):
                for key, value in _front_matter(path).items():
                    sources.append({"from": f"{path.name} front matter {key}", "value": value})
            if LICENCE_FILE.search(path.name):
                files.append(str(path))
                if path.name.upper().startswith("NOTICE"):
                    notes += _mentions(path.read_text(encoding="utf-8", errors="replace")[:MAX_SCANNED])
    stated = _distinct(s["value"] for s in sources if not s["from"].endswith("license_link"))
    return {
        "stated": [s for s in stated if not s.startswith("License ::")],
        "sources": sources,
        "notes": _distinct(notes)[:MAX_NOTES],
        "files": _distinct(files),
    }


def licence_summary(record: dict[str, Any]) -> str:
    """One line for the terminal: the stated licence(s) and where they come from, or that none is stated."""
    stated = record.get("stated") or []
    if not stated:
        return "licence: not stated by the source (check before use)"
    named = {s.casefold() for s in stated}
    where = "; ".join(s["from"] for s in record["sources"] if s["value"].casefold() in named)
    notes = record.get("notes") or []
    return f"licence: {', '.join(stated)} ({where})" + (f"; {notes[0]}" if notes else "")


def _distribution_facts(name: str) -> tuple[dict[str, Any], list[str]]:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return {"sources": [], "description": ""}, []
    meta = dist.metadata
    sources = [
        {"from": f"{meta['Name']} metadata {field}", "value": str(value).strip()}
        for field in ("License-Expression", "License")
        for value in meta.get_all(field) or []
        if str(value).strip() and str(value).strip().upper() != "UNKNOWN"
    ]
    sources += [
        {"from": f"{meta['Name']} classifier", "value": c}
        for c in meta.get_all("Classifier") or []
        if c.startswith("License ::")
    ]
    files = [str(dist.locate_file(f)) for f in dist.files or [] if LICENCE_FILE.search(Path(str(f)).name)]
    description = meta["Description"] or ""  # importlib.metadata gives the METADATA body under this name
    return {"sources": sources, "description": str(description)}, files


def _front_matter(readme: Path) -> dict[str, str]:
    """The licence keys of `readme`'s YAML front matter (between two ``---`` lines at the top), if any."""
    text = readme.read_text(encoding="utf-8", errors="replace")[:MAX_SCANNED]
    m = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if not m:
        return {}
    try:
        data = yaml.safe_load(m[1])
    except yaml.YAMLError:
        return {}  # a card we cannot read states nothing we could quote
    if not isinstance(data, dict):
        return {}
    return {k: str(data[k]) for k in FRONT_MATTER_KEYS if data.get(k) not in (None, "")}


def _mentions(text: str) -> list[str]:
    """The lines of `text` that mention a licence or terms, list markers stripped; badges (images) skipped."""
    found = []
    for line in text.splitlines():
        line = re.sub(r"^\s*(?:[-*+>#]+\s*)+", "", line).strip()
        if line and "![" not in line and MENTION.search(line):
            found.append(line)
    return found


def _distinct(values: Iterable[str]) -> list[str]:
    seen: dict[str, str] = {}
    for v in values:
        seen.setdefault(v.casefold(), v)
    return list(seen.values())
