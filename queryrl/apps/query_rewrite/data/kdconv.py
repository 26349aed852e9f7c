"""KdConv (Zhou et al., ACL 2020; arXiv:2004.04100) as a conversational query-rewrite benchmark.

A KdConv file is a JSON list of conversations ``{"name": topic entity, "messages": [{"message":
str, "attrs": [{"name", "attrname", "attrvalue"}]?}]}``; its knowledge base is a JSON object
``entity -> [[name, attrname, attrvalue], ...]``. Messages alternate between the two speakers;
the one who opens is the user (even positions), the other the assistant (odd positions). Both
speakers know the knowledge base and both ask questions, so ``both_speakers=True`` also makes
the second speaker the user (every message followed by a reply becomes a query turn once).

Gold for the user turn at position i = the distinct ``(name, attrname)`` pairs used by reply
i+1, as document ids :func:`doc_id` (empty when the reply uses no knowledge or there is none).
The corpus is one document per ``(entity, attribute)`` of the knowledge base.

The prompt's domain line names KdConv's domain (:data:`KDCONV_DOMAINS`: travel is Beijing's
attractions), found in the file's path (``travel/dev.json``, ``kb_travel.json``) by :func:`kdconv_domain`.

KdConv is not shipped with queryrl: :func:`kdconv_missing` is the one message, for every command, bench and test
that finds it absent, saying where it comes from (:data:`KDCONV_SOURCE`) and what points to it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.data.conversations import Conversation, Message, conversations_to_rows
from queryrl.apps.query_rewrite.prompts import DEFAULT_ANSWER_FIELDS, DEFAULT_DOMAINS
from queryrl.data.records import DataError

KDCONV_SOURCE = "https://github.com/thu-coai/KdConv (Zhou et al., ACL 2020; licence Apache-2.0)"
KDCONV_VARIABLE = "KDCONV_DIR"  # the benches' and tests' variable: the travel folder (dev.json, kb_travel.json)


def kdconv_missing(path: str | Path, pointer: str | None = KDCONV_VARIABLE) -> str:
    """The one line saying KdConv data is absent at `path`: where it comes from and what names its place.

    Args:
        path: the file or folder looked for.
        pointer: what gives that path: an environment variable (``KDCONV_DIR``, the travel folder, by default;
            ``KDCONV_TEST``, a file), an option (``--input``, ``--kb``), or None where the caller's own argument
            named it.
    """
    where = ""
    if pointer == KDCONV_VARIABLE:
        where = f"; set {pointer} to its travel folder"
    elif pointer and pointer.isupper():
        where = f"; set {pointer} to the file"
    elif pointer:
        where = f"; give its path as {pointer}"
    return (
        f"KdConv data not found at {path}: it is not part of queryrl; get it from {KDCONV_SOURCE}, "
        f"whose travel folder holds dev.json and kb_travel.json{where}"
    )


# KdConv's three domains (its folders travel/, film/, music/) -> the prompt's domain line per language
KDCONV_DOMAINS: dict[str, dict[str, str]] = {
    "travel": {"zh": "旅游咨询（北京的景点）", "en": "travel (attractions in Beijing)"},
    "film": {"zh": "电影知识问答", "en": "films, actors and directors"},
    "music": {"zh": "音乐知识问答", "en": "music, songs and singers"},
}


def kdconv_domain(*paths: str | Path, lang: str = "zh") -> str:
    """The domain line of KdConv data at `paths` (the first of travel / film / music in a file name or a
    folder name: ``travel/dev.json``, ``kb_travel.json``); the neutral default when none names one."""
    for path in paths:
        for part in reversed(Path(path).parts):
            for name, lines in KDCONV_DOMAINS.items():
                if name in part.lower():
                    return lines.get(lang, lines["zh"])
    return DEFAULT_DOMAINS.get(lang, DEFAULT_DOMAINS["zh"])


def doc_id(entity: str, attribute: str) -> str:
    """The stable id of the ``(entity, attribute)`` document."""
    return f"{entity}::{attribute}"


def doc_entity(document_id: str) -> str:
    """The entity of a :func:`doc_id` (its title in the knowledge base)."""
    return document_id.split("::", 1)[0]


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise DataError(kdconv_missing(path, None)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a JSON file: {exc}") from None


def _reply_gold(message: dict[str, Any]) -> list[str]:
    ids = [doc_id(str(a["name"]), str(a["attrname"])) for a in message.get("attrs") or []]
    return list(dict.fromkeys(ids))  # distinct, in order of use


def load_kdconv_conversations(path: str | Path, both_speakers: bool = False) -> list[Conversation]:
    """The conversations of a KdConv dialogue file, with gold on the user turns.

    Args:
        path: a KdConv dialogue file (``dev.json``, ...).
        both_speakers: KdConv's two speakers both ask and answer; with True each conversation
            also appears a second time (same id) with the roles swapped, so that every message
            followed by a reply is a user turn once.

    Raises:
        DataError: not a list of conversations with messages, naming the file and conversation.
    """
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of conversations, got {type(data).__name__}")
    out = []
    for c, conv in enumerate(data):
        messages = conv.get("messages") if isinstance(conv, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "message" in m for m in messages):
            raise DataError(f"{path}: conversation {c}: field 'messages': expected a list of {{'message': ...}}")
        for user_parity in (0, 1) if both_speakers else (0,):
            parsed = []
            for i, m in enumerate(messages):
                role = "user" if i % 2 == user_parity else "assistant"
                gold = _reply_gold(messages[i + 1]) if role == "user" and i + 1 < len(messages) else []
                titles = list(dict.fromkeys(doc_entity(doc) for doc in gold))
                parsed.append(Message(role=role, text=str(m["message"]), turn=i, gold_doc_ids=gold, gold_titles=titles))
            out.append(Conversation(f"{path.stem}-{c:04d}", parsed))
    return out


def kdconv_rows(
    path: str | Path,
    name: str = "kdconv",
    lang: str = "zh",
    both_speakers: bool = False,
    require_gold: bool = False,
    *,
    domain: str | None = None,
    answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS,
    answer_format: str = "json",
) -> list[dict[str, Any]]:
    """verl rows (one per user turn) of a KdConv dialogue file; ``data_source`` ``query_rewrite/<name>``.

    With `require_gold`, only the turns whose reply uses the knowledge base (the benchmark's turns).
    `domain`: the prompt's domain line (default :func:`kdconv_domain` of `path`); `answer_fields`: the
    keys the policy answers with (default only ``rewritten_query``); `answer_format`: ``json`` or ``text``.
    """
    domain = domain or kdconv_domain(path, lang=lang)
    conversations = load_kdconv_conversations(path, both_speakers)
    options: dict[str, Any] = {"domain": domain, "answer_fields": answer_fields, "answer_format": answer_format}
    rows = conversations_to_rows(conversations, name, lang, **options)
    if require_gold:
        rows = [r for r in rows if r["reward_model"]["ground_truth"]["gold_doc_ids"]]
    return rows


def kdconv_corpus(kb_path: str | Path) -> list[dict[str, str]]:
    """One document per ``(entity, attribute)`` of a KdConv knowledge base, in file order.

    ``content`` is ``"entity attribute: v1；v2"`` with the attribute's distinct values in order
    (an attribute such as 周边景点 has several).

    Raises:
        DataError: not an object of entity -> list of ``[name, attrname, attrvalue]`` triples.
    """
    path = Path(kb_path)
    kb = _load_json(path)
    if not isinstance(kb, dict):
        raise DataError(f"{path}: expected a JSON object entity -> triples, got {type(kb).__name__}")
    values: dict[tuple[str, str], list[str]] = {}
    for entity, triples in kb.items():
        for t, triple in enumerate(triples if isinstance(triples, list) else [None]):
            if not (isinstance(triple, list) and len(triple) == 3):
                raise DataError(f"{path}: entity {entity!r}: triple {t}: expected [name, attrname, attrvalue]")
            name, attr, value = (str(x) for x in triple)
            bucket = values.setdefault((name, attr), [])
            if value not in bucket:
                bucket.append(value)
    return [
        {"doc_id": doc_id(name, attr), "title": name, "content": f"{name} {attr}: {'；'.join(vals)}"}
        for (name, attr), vals in values.items()
    ]
