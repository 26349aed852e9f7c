"""mkdocs hooks (mkdocs.yml ``hooks``): the site's home page is README.md, so the two never drift apart.

``docs/index.md`` is a placeholder; at build time its Markdown is README's, with README's links into
``docs/`` made relative to the site (``docs/gpus.md`` -> ``gpus.md``) and links to files outside the
site (``benchmarks/...``) kept as code paths.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_for_site(text: str) -> str:
    """README's Markdown with its links rewritten for a page at the site's root."""
    text = re.sub(r"\]\(docs/([^)]+)\)", r"](\1)", text)
    return re.sub(r"\[([^\]]+)\]\((?!https?://)([^)]+)\)", lambda m: _outside(m), text)


def _outside(m: re.Match[str]) -> str:
    label, target = m.group(1), m.group(2)
    if target.split("#")[0].endswith(".md") and "/" not in target.split("#")[0]:
        return m.group(0)  # a page of the site
    return f"`{target}`" if label == target else f"{label} (`{target}`)"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == "index.md":
        return readme_for_site(README.read_text(encoding="utf-8"))
    return markdown
