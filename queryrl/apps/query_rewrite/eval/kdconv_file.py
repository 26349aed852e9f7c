"""``queryrl eval --data FILE.json`` on a KdConv dialogue file: its rows prepared on the fly.

A KdConv dialogue file (``travel/dev.json``: a JSON list of conversations, each with ``messages``) becomes
the rows ``benchmarks/real_model.py`` evaluates its ``KDCONV_TEST`` file on: both speakers asking, only the
turns whose reply uses the knowledge base (gold = the ``(entity, attribute)`` documents it used), the prompt
showing the last `history_chars` characters of history (:func:`~.kdconv_prep.history_window`) and asking
for `answer_format`. The defaults are the bench's recipe (320 characters, ``text``), the prompt its
published adapters were trained on.

The knowledge base: ``--kb``, else the file of the ``kdconv:PATH`` corpus (``--corpus``), else the
``kb_*.json`` beside the file. With the embedded RAG service and another corpus, the corpus becomes
``kdconv:KB`` (retrieval must search the documents the gold ids name).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from queryrl.apps.query_rewrite.eval.samples import EvalError

KDCONV_PREFIX = "kdconv:"


@dataclass(frozen=True)
class KdConvSettings:
    """How a KdConv dialogue file's rows are made: the knowledge base (None: found as the module doc says),
    the history characters in the prompt, the answer format it asks for and the knowledge base's names the
    history summary lists (0: no summary; :mod:`~queryrl.apps.query_rewrite.data.mentions`)."""

    kb: Path | None = None
    history_chars: int = 320
    answer_format: str = "text"
    mentions: int = 0


def is_kdconv_file(data: str) -> bool:
    """`data` is a ``.json`` file holding a list of conversations with ``messages`` (KdConv's layout)."""
    path = Path(data).expanduser()
    if path.suffix.lower() != ".json" or not path.is_file():
        return False
    try:
        loaded = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return False
    return isinstance(loaded, list) and bool(loaded) and isinstance(loaded[0], dict) and "messages" in loaded[0]


def kdconv_kb(data: Path, corpus: str | None, kb: Path | None) -> Path:
    """The knowledge base of the KdConv file `data` (see the module doc).

    Raises:
        EvalError: the one named does not exist, or none is named and none lies beside the file.
    """
    if kb is None and corpus and corpus.startswith(KDCONV_PREFIX):
        kb = Path(corpus.removeprefix(KDCONV_PREFIX))
    if kb is not None:
        kb = kb.expanduser()
        if not kb.is_file():
            raise EvalError(f"data {str(data)!r}: knowledge base {str(kb)!r} does not exist")
        return kb
    found = sorted(data.parent.glob("kb_*.json"))
    if not found:
        raise EvalError(
            f"data {str(data)!r} is a KdConv dialogue file with no knowledge base (kb_*.json) beside it: "
            "name it with --kb KB.json or --corpus kdconv:KB.json"
        )
    return found[0]


def kdconv_file_rows(data: Path, kb: Path, settings: KdConvSettings) -> list[dict[str, Any]]:
    """The query-rewrite rows of the KdConv dialogue file `data` with knowledge base `kb` (the module doc).

    Raises:
        EvalError: a file that is not KdConv's layout, a bad setting, or no turn with gold documents.
    """
    from queryrl.apps.query_rewrite.data.conversations import conversations_to_rows
    from queryrl.apps.query_rewrite.data.kdconv import kdconv_corpus, kdconv_domain, load_kdconv_conversations
    from queryrl.apps.query_rewrite.data.kdconv_prep import windowed_rows
    from queryrl.apps.query_rewrite.prompts import check_answer_format
    from queryrl.data import DataError
    from queryrl.rag import Document, HeuristicRewriter
    from queryrl.rag.index import title_entities

    if settings.history_chars < 0:
        raise EvalError(f"--history-chars must be >= 0, got {settings.history_chars}")
    if settings.mentions < 0:
        raise EvalError(f"--mentions must be >= 0, got {settings.mentions}")
    try:
        fmt = check_answer_format(settings.answer_format, ("rewritten_query",), "--answer-format")
        docs = [Document(d["doc_id"], d["title"], d["content"]) for d in kdconv_corpus(kb)]
        conversations = load_kdconv_conversations(data, both_speakers=True)
    except (DataError, ValueError) as exc:
        raise EvalError(f"data {str(data)!r}: {exc}") from None
    rows = conversations_to_rows(conversations, "kdconv", domain=kdconv_domain(data, kb), answer_format=fmt)
    rows = [r for r in rows if r["reward_model"]["ground_truth"]["gold_doc_ids"]]
    if not rows:
        raise EvalError(f"data {str(data)!r}: no turn whose reply uses the knowledge base (no gold documents)")
    if settings.mentions:
        from queryrl.apps.query_rewrite.data.kdconv_prep import entity_pattern
        from queryrl.apps.query_rewrite.data.mentions import add_mentions, mention_names

        add_mentions(rows, entity_pattern(mention_names(d.title for d in docs)), settings.mentions)
    windowed_rows(rows, HeuristicRewriter(title_entities(docs), latin_entities=False), settings.history_chars)
    return rows


def prepare_kdconv(
    data: str, cfg: DictConfig, settings: KdConvSettings | None, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    """The rows of the KdConv file `data`, with the embedded service's corpus of `cfg` pointed at its knowledge
    base where it is another (``app.query_rewrite.rag.corpus``, changed in place; said on `say`)."""
    settings = settings or KdConvSettings()
    rag = cfg.app.query_rewrite.rag
    path = Path(data).expanduser()
    kb = kdconv_kb(path, str(rag.corpus) if rag.corpus else None, settings.kb)
    rows = kdconv_file_rows(path, kb, settings)
    if rag.url is None and not str(rag.corpus).startswith(KDCONV_PREFIX):
        rag.corpus = f"{KDCONV_PREFIX}{kb}"
        say(f"corpus: {rag.corpus} (the knowledge base of the KdConv file {data})")
    fmt, chars = settings.answer_format, settings.history_chars
    summary = f", the latest {settings.mentions} names mentioned as the history summary" if settings.mentions else ""
    say(f"{data}: KdConv dialogues -> {len(rows)} turns with gold (history {chars} characters, {fmt} answers{summary})")
    return rows
