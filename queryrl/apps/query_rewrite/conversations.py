"""Conversation logs -> verl-format rows for the query rewriter, one row per user turn.

Input: one row per message (Excel ``.xlsx``, every sheet or a named one; ``.csv``; ``.jsonl``;
``.parquet``), with these fields (the file's column names are mapped through ``columns``)::

    conversation_id  required; messages with the same id form one conversation (across sheets too)
    role             required; see ROLE_ALIASES (user: 用户/客户/customer/..., assistant: 客服/销售/agent/...)
    text             required, non-blank
    turn             optional integer; orders the messages of a conversation (file order without it)
    user_profile, history_summary            optional text
    tenant_id, contact_id, account_id, message_id   optional ids (kept as strings)
    gold_doc_ids     optional, on user messages: a list, or a string split on ``;`` / ``,``
                     (full-width too), or a JSON list string

Output: every user turn gives one row (the first turn too: its history is empty, which is the
no-rewrite-needed case the policy must also learn). The prompt is :func:`build_messages` of the
conversation up to and including that turn; ``reward_model.ground_truth`` is
``{"gold_doc_ids": [...]}`` (empty without gold); ``extra_info`` carries the ids, the turn, the
raw ``contexts`` (the history as role/content messages, current turn included), the user
profile and the history summary -- what the RAG service's ``/rag/chat_8b`` needs. The profile and
summary of a turn are the ones on its own row, else the latest non-blank earlier ones.

Errors: all bad rows of a file are reported in one :class:`DataError`, each as
``file: sheet 'S': row R: column 'C': problem``; rows are numbered as a spreadsheet shows them
(header = row 1) for xlsx/csv, by line for jsonl, and 0-based for parquet.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.prompts import build_messages
from queryrl.data.records import DataError, iter_json_lines

FIELDS = (
    "conversation_id",
    "turn",
    "role",
    "text",
    "user_profile",
    "history_summary",
    "tenant_id",
    "contact_id",
    "account_id",
    "message_id",
    "gold_doc_ids",
)
REQUIRED = ("conversation_id", "role", "text")
ID_FIELDS = ("tenant_id", "contact_id", "account_id", "message_id")
ROLE_ALIASES = {
    "user": "user",
    "human": "user",
    "customer": "user",
    "client": "user",
    "用户": "user",
    "客户": "user",
    "顾客": "user",
    "assistant": "assistant",
    "agent": "assistant",
    "bot": "assistant",
    "sales": "assistant",
    "客服": "assistant",
    "销售": "assistant",
    "助手": "assistant",
    "机器人": "assistant",
}
SUFFIXES = (".xlsx", ".csv", ".jsonl", ".parquet")
MAX_REPORTED = 20
_SPLIT_IDS = re.compile(r"[;,；，]")


@dataclass
class Message:
    """One message of a conversation."""

    role: str  # "user" | "assistant"
    text: str
    turn: int | None = None
    user_profile: str = ""
    history_summary: str = ""
    ids: dict[str, str] = field(default_factory=dict)  # tenant_id, contact_id, account_id, message_id
    gold_doc_ids: list[str] = field(default_factory=list)
    kind: str = ""  # what the turn tests (demo data: explicit, pronoun, ellipsis, ...)


@dataclass
class Conversation:
    """A conversation: its id and its messages in order."""

    id: str
    messages: list[Message]


def _blank(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _as_str(value: Any) -> str:
    """A cell as text; Excel's ``12.0`` for an id typed 12 becomes ``"12"``."""
    if _blank(value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def normalise_role(value: Any) -> str | None:
    """``"user"`` / ``"assistant"`` for a known alias (case-insensitive), else None."""
    return ROLE_ALIASES.get(_as_str(value).lower())


def parse_doc_ids(value: Any) -> list[str]:
    """Gold document ids from a list, a JSON list string, or a ``;``/``,``-separated string.

    Raises:
        ValueError: anything else (a number, a dict, a list of non-scalars).
    """
    if _blank(value):
        return []
    if hasattr(value, "tolist"):  # numpy arrays from parquet via pandas
        value = value.tolist()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise ValueError(f"not a JSON list: {text[:40]!r}") from None
        else:
            return [part.strip() for part in _SPLIT_IDS.split(text) if part.strip()]
    if isinstance(value, list | tuple):
        if not all(isinstance(v, str | int) for v in value):
            raise ValueError("a list of ids must hold strings")
        return [str(v).strip() for v in value if str(v).strip()]
    raise ValueError(f"expected a list or a separated string of ids, got {type(value).__name__}")


def _read_rows(path: Path, sheet: str | None) -> list[tuple[str | None, str, dict[str, Any]]]:
    """``(sheet, row label, row)`` for every row of the file."""
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        out: list[tuple[str | None, str, dict[str, Any]]] = []
        for line, value in iter_json_lines(path):
            if not isinstance(value, dict):
                raise DataError(f"{path}: line {line}: a row must be a JSON object, got {type(value).__name__}")
            out.append((None, f"line {line}", value))
        return out
    try:
        if suffix == ".xlsx":
            frames = pd.read_excel(path, sheet_name=sheet if sheet is not None else None, dtype=object)
            tables = frames if isinstance(frames, dict) else {sheet: frames}
        elif suffix == ".csv":
            tables = {None: pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")}
        else:
            tables = {None: pd.read_parquet(path)}
    except Exception as exc:
        raise DataError(f"{path}: cannot read {suffix} file: {exc}") from None
    first = 2 if suffix in (".xlsx", ".csv") else 0  # spreadsheet numbering: the header is row 1
    rows = []
    for name, frame in tables.items():
        for i, record in enumerate(frame.to_dict(orient="records")):
            rows.append((None if name is None else str(name), f"row {i + first}", record))
    return rows


def _parse_message(raw: dict[str, Any], columns: dict[str, str]) -> tuple[str, Message, list[tuple[str, str]]]:
    """The conversation id and the message of one row, and its problems as (column, what)."""
    problems: list[tuple[str, str]] = []

    def get(name: str) -> Any:
        return raw.get(columns[name])

    for name in REQUIRED:
        if _blank(get(name)):
            problems.append((columns[name], "missing value"))
    role = normalise_role(get("role"))
    if role is None and not _blank(get("role")):
        problems.append((columns["role"], f"unknown role {_as_str(get('role'))!r}; known: {sorted(ROLE_ALIASES)}"))
    turn: int | None = None
    if not _blank(get("turn")):
        try:
            number = float(get("turn"))
            if not number.is_integer():
                raise ValueError
            turn = int(number)
        except (TypeError, ValueError):
            problems.append((columns["turn"], f"not an integer turn: {get('turn')!r}"))
    gold: list[str] = []
    try:
        gold = parse_doc_ids(get("gold_doc_ids"))
    except ValueError as exc:
        problems.append((columns["gold_doc_ids"], str(exc)))
    message = Message(
        role=role or "user",
        text=_as_str(get("text")),
        turn=turn,
        user_profile=_as_str(get("user_profile")),
        history_summary=_as_str(get("history_summary")),
        ids={k: _as_str(get(k)) for k in ID_FIELDS},
        gold_doc_ids=gold,
    )
    return _as_str(get("conversation_id")), message, problems


def load_conversations(
    path: str | Path, columns: dict[str, str] | None = None, sheet: str | None = None
) -> list[Conversation]:
    """Read a message log into conversations (in order of first appearance).

    Args:
        path: ``.xlsx``, ``.csv``, ``.jsonl`` or ``.parquet``.
        columns: field -> column name in the file, for the fields that differ from FIELDS.
        sheet: one Excel sheet (default: all sheets).

    Raises:
        ValueError: a key of `columns` that is not a field.
        DataError: an unreadable file, a missing required column, or bad rows (all reported).
    """
    path = Path(path)
    unknown = sorted(set(columns or {}) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown conversation fields {unknown}; known: {list(FIELDS)}")
    mapping = {name: (columns or {}).get(name, name) for name in FIELDS}
    if path.suffix.lower() not in SUFFIXES:
        raise DataError(f"{path}: unsupported file type {path.suffix or '(none)'!r}; use one of {SUFFIXES}")
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows = _read_rows(path, sheet)
    errors: list[str] = []
    by_id: dict[str, list[Message]] = {}
    for sheet_name, label, raw in rows:
        where = f"{path}: " + (f"sheet {sheet_name!r}: " if sheet_name is not None else "") + label
        missing = [mapping[n] for n in REQUIRED if mapping[n] not in raw]
        if missing:
            errors.append(f"{where}: column {missing[0]!r}: missing column (have {sorted(map(str, raw))})")
            continue
        conv_id, message, problems = _parse_message(raw, mapping)
        errors += [f"{where}: column {col!r}: {what}" for col, what in problems]
        if not problems:
            by_id.setdefault(conv_id, []).append(message)
    if errors:
        more = f"\n... and {len(errors) - MAX_REPORTED} more" if len(errors) > MAX_REPORTED else ""
        raise DataError(f"{len(errors)} bad row(s):\n" + "\n".join(errors[:MAX_REPORTED]) + more)
    out = []
    for conv_id, messages in by_id.items():
        if all(m.turn is not None for m in messages):
            messages = sorted(messages, key=lambda m: m.turn or 0)  # stable: ties keep file order
        out.append(Conversation(conv_id, messages))
    return out


def conversation_rows(conversation: Conversation, name: str, lang: str = "zh") -> list[dict[str, Any]]:
    """One verl row per user turn of `conversation` (see the module docstring)."""
    rows = []
    contexts: list[dict[str, str]] = []
    profile = summary = ""
    for index, message in enumerate(conversation.messages):
        contexts.append({"role": message.role, "content": message.text})
        profile = message.user_profile or profile
        summary = message.history_summary or summary
        if message.role != "user":
            continue
        rows.append(
            {
                "data_source": f"query_rewrite/{name}",
                "prompt": build_messages(contexts, profile, summary, lang=lang),
                "ability": "query_rewrite",
                "reward_model": {"style": "rule", "ground_truth": {"gold_doc_ids": list(message.gold_doc_ids)}},
                "extra_info": {
                    "conversation_id": conversation.id,
                    "turn": message.turn if message.turn is not None else index,
                    "turn_index": index,
                    **{k: message.ids.get(k, "") for k in ID_FIELDS},
                    "contexts": [dict(c) for c in contexts],
                    "user_profile": profile,
                    "history_summary": summary,
                    "turn_type": message.kind,
                },
            }
        )
    return rows


def conversations_to_rows(conversations: Iterable[Conversation], name: str, lang: str = "zh") -> list[dict[str, Any]]:
    """:func:`conversation_rows` of every conversation, in order."""
    return [row for conv in conversations for row in conversation_rows(conv, name, lang)]


def split_conversations(
    conversations: Sequence[Conversation], val_fraction: float = 0.1, test_fraction: float = 0.1, seed: int = 0
) -> dict[str, list[Conversation]]:
    """Train/val/test by conversation (no conversation is in two splits); seeded, order-independent."""
    if val_fraction < 0 or test_fraction < 0 or val_fraction + test_fraction >= 1:
        raise ValueError(f"need 0 <= val_fraction, test_fraction and a sum < 1, got {val_fraction}, {test_fraction}")
    ordered = sorted(conversations, key=lambda c: c.id)
    random.Random(seed).shuffle(ordered)
    n_val, n_test = round(len(ordered) * val_fraction), round(len(ordered) * test_fraction)
    return {
        "val": ordered[:n_val],
        "test": ordered[n_val : n_val + n_test],
        "train": ordered[n_val + n_test :],
    }


def write_parquet(rows: list[dict[str, Any]], out: Path) -> Path:
    """Write `rows` as parquet atomically (a temporary name in the same folder, then a rename)."""
    import pandas as pd

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
        Path(tmp).replace(out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def prepare_conversations(
    input_path: str | Path,
    out_dir: str | Path,
    columns: dict[str, str] | None = None,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
    name: str | None = None,
    sheet: str | None = None,
    lang: str = "zh",
) -> dict[str, Path]:
    """Read a conversation log and write ``train/val/test.parquet`` into `out_dir`.

    Every row carries the reference rewriter's answer as ``extra_info.sft_target`` (the
    ``queryrl sft`` warm start; :mod:`queryrl.apps.query_rewrite.sft_targets`).

    Args:
        input_path: the log (see :func:`load_conversations`).
        out_dir: created if needed.
        columns: field -> column name overrides.
        val_fraction, test_fraction: shares of conversations (rounded).
        seed: the split's shuffle seed.
        name: ``data_source`` is ``query_rewrite/<name>`` (default: the input file's stem).
        sheet: one Excel sheet (default: all).
        lang: the prompt language.

    Returns:
        split -> the written parquet file.
    """
    input_path = Path(input_path)
    conversations = load_conversations(input_path, columns, sheet)
    splits = split_conversations(conversations, val_fraction, test_fraction, seed)
    source = name or input_path.stem
    from queryrl.apps.query_rewrite.sft_targets import add_sft_targets

    return {
        split: write_parquet(
            add_sft_targets(conversations_to_rows(convs, source, lang)), Path(out_dir) / f"{split}.parquet"
        )
        for split, convs in splits.items()
    }
