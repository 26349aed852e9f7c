"""docs/your-data.md's minimal RAG service, taken from the page and served as a real process on 127.0.0.1.

    source = minimal_service_source()                 # the page's block, as written
    with serve_minimal_service(tmp_path, documents) as service:
        ...  # service.url: the root (POST /rag/chat_8b, /rag/chat); service.requests("chat_8b"): count so far

The block sits between ``<!-- rag-service:minimal -->`` and ``<!-- /rag-service:minimal -->``; it is written
to ``rag_service.py`` and run with ``uvicorn rag_service:app`` as the page says, its documents in a JSONL file
named by ``DOCS``. :func:`variant` makes a broken copy of it (a test's way to break the contract).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.loopback import wait_until_up

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "your-data.md"
BLOCK = re.compile(r"<!-- rag-service:minimal -->\n```python\n(.*?)```\n<!-- /rag-service:minimal -->", re.S)


def minimal_service_source(page: Path = PAGE) -> str:
    """The minimal service's Python source as the page shows it."""
    found = BLOCK.search(page.read_text(encoding="utf-8"))
    assert found, f"{page} lost its minimal service (<!-- rag-service:minimal --> ... <!-- /rag-service:minimal -->)"
    return found.group(1)


def variant(source: str, old: str, new: str) -> str:
    """`source` with `old` replaced by `new` (which must be there: a test that breaks nothing proves nothing)."""
    assert old in source, f"the minimal service no longer contains {old!r}"
    return source.replace(old, new)


@dataclass
class MinimalService:
    url: str  # the service's root, for app.query_rewrite.rag.url
    log: Path  # uvicorn's output, its access log included

    def requests(self, endpoint: str) -> int:
        """``POST /rag/<endpoint>`` requests the service has answered so far."""
        text = self.log.read_text(encoding="utf-8", errors="replace")
        return len(re.findall(rf'"POST /rag/{endpoint} HTTP/1\.1"', text))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_minimal_service(
    folder: Path, documents: Sequence[Mapping[str, Any]], source: str | None = None, startup_s: float = 60.0
) -> Iterator[MinimalService]:
    """The service (`source`, default the page's) as ``uvicorn rag_service:app`` in `folder`, over
    `documents` (``doc_id``, ``title``, ``content``); yields it once ``GET /health`` answers."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rag_service.py").write_text(source if source is not None else minimal_service_source())
    docs = folder / "docs.jsonl"
    docs.write_text("".join(json.dumps(dict(d), ensure_ascii=False) + "\n" for d in documents), encoding="utf-8")
    port = _free_port()
    log = folder / "uvicorn.log"
    cmd = [sys.executable, "-m", "uvicorn", "rag_service:app", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=folder, env={**os.environ, "DOCS": str(docs)}, stdout=out, stderr=out)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/health", proc, startup_s, "the minimal service", log)
        yield MinimalService(f"http://127.0.0.1:{port}", log)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
