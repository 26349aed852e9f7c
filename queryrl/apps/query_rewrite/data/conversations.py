"""Conversation logs -> verl-format rows for the query rewriter, one row per user turn.

Input: one row per message (Excel ``.xlsx`` / ``.xls``, every sheet that has the columns or a
named one; ``.csv``; ``.jsonl``; ``.parquet``). Reading the file -- recognised English and
Chinese header names, the header row under a title row, sheets without the columns skipped,
merged (blank) conversation-level cells filled down -- is
:mod:`~queryrl.apps.query_rewrite.data.log_import`; its ``FIELD_SPECS`` lists the fields::

    conversation_id  required; messages with the same id form one conversation (across sheets too)
    role             required; user / assistant / skip (see ROLE_ALIASES; ``roles`` adds values)
    text             required, non-blank (on the messages kept)
    turn             optional integer; orders the messages of a conversation
    time             optional date/time; orders them when there is no turn, or always with ``order_by``
    user_profile, history_summary            optional text
    tenant_id, contact_id, account_id, message_id   optional ids (kept as strings)
    gold_doc_ids     optional, on user messages: a list, or a string split on ``;`` / ``,``
                     (full-width too), or a JSON list string

Messages whose role maps to ``skip`` (系统 / system: notices, not dialogue) are dropped and
counted. So are empty messages (``empty_messages="skip"``, the default): stickers, images and recalled
messages export as an empty text cell (None, NaN, whitespace); they are counted per role (an empty user
message gives no prompt, an empty assistant message is left out of the history), and a conversation left
without a user message is dropped and counted too. ``empty_messages="error"`` reports them as bad rows.
Without turn or time the file order is kept; sorting is stable, so ties keep it too.

Output: every user turn gives one row (the first turn too: its history is empty, which is the
no-rewrite-needed case the policy must also learn). The prompt is :func:`build_messages` of the conversation
up to and including that turn, with the data's domain line and the answer fields asked for (default only
``rewritten_query``); ``reward_model.ground_truth`` is ``{"gold_doc_ids": [...]}`` (empty without gold), with
``gold_titles`` where the source names the gold documents' titles (KdConv: each document's entity; what the
``retrieval_entity`` reward reads); ``extra_info`` carries the ids, the turn, the raw ``contexts`` (the
history as role/content messages, current turn included), the user profile and the history summary -- what the
RAG service's ``/rag/chat_8b`` needs -- and ``answer_fields`` / ``domain`` (what the prompt asked for: the SFT
target has exactly those fields, and the reward sends the row's own profile and summary when the answer has
none). The profile and summary of a turn are the ones on its own row, else the latest non-blank earlier ones.
A user turn with a rewrite in the export's ``reference_rewrite`` column (``--rewrite-column``) keeps it as
``extra_info.reference_rewrite``: the SFT target of that turn (:mod:`~.sft_targets`).

Errors: all bad rows of a file are reported in one :class:`DataError`, each as
``file: sheet 'S': row R: column 'C': problem``; rows are numbered as a spreadsheet shows them
for xlsx/xls/csv, by line for jsonl, and 0-based for parquet. Unknown role values are one
message with their counts; a missing column is one line per field (see ``log_import``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.data.log_files import UNCOMPUTED_HELP, Uncomputed, parse_time
from queryrl.apps.query_rewrite.data.log_import import (
    FIELDS,
    REQUIRED,
    ROLE_ALIASES,
    SUFFIXES,
    LogReport,
    Row,
    Table,
    blank,
    check_columns,
    read_tables,
    role_table,
    roles_text,
)
from queryrl.apps.query_rewrite.prompts import (
    DEFAULT_ANSWER_FIELDS,
    DEFAULT_DOMAINS,
    build_messages,
    check_answer_fields,
    check_answer_format,
)
from queryrl.atomic import atomic_path
from queryrl.data.records import DataError

__all__ = ["FIELDS", "REQUIRED", "ROLE_ALIASES", "SUFFIXES"]  # re-exported: the field list lives in log_import
ID_FIELDS = ("tenant_id", "contact_id", "account_id", "message_id")
MAX_REPORTED = 20
MAX_ROLES_LISTED = 10
EMPTY_MESSAGES = ("skip", "error")  # what an empty message is: dropped and counted, or a bad row
EMPTY_HELP = (
    "empty message (stickers, images and recalled messages export as empty text; --empty-messages skip "
    "drops and counts them)"
)
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
    gold_titles: list[str] = field(default_factory=list)  # the gold documents' titles, where the source knows them
    kind: str = ""  # what the turn tests (demo data: explicit, pronoun, ellipsis, ...)
    time: datetime | None = None  # when it was sent (orders the conversation without a turn)
    reference_rewrite: str = ""  # the export's own rewrite of a user turn (the SFT target where given)


@dataclass
class Conversation:
    """A conversation: its id and its messages in order."""

    id: str
    messages: list[Message]


@dataclass
class ConversationLog:
    """The conversations of a log and what reading it did."""

    conversations: list[Conversation]
    report: LogReport


def _as_str(value: Any) -> str:
    """A cell as text; Excel's ``12.0`` for an id typed 12 becomes ``"12"``."""
    if blank(value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def normalise_role(value: Any, roles: Mapping[str, str] = ROLE_ALIASES) -> str | None:
    """``"user"`` / ``"assistant"`` / ``"skip"`` for a known value (case-insensitive), else None."""
    return roles.get(_as_str(value).lower())


def parse_doc_ids(value: Any) -> list[str]:
    """Gold document ids from a list, a JSON list string, or a ``;``/``,``-separated string.

    Raises:
        ValueError: anything else (a number, a dict, a list of non-scalars).
    """
    if blank(value):
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


def _missing(value: Any, name: str = "") -> str:
    """What a blank required cell is: a formula without a saved result (with the way out), an empty message
    (`name` ``text``), or a missing value."""
    if isinstance(value, Uncomputed):
        return UNCOMPUTED_HELP.format(formula=value.formula)
    return EMPTY_HELP if name == "text" else "missing value"


def check_empty_messages(value: str, option: str = "empty_messages") -> str:
    """`value` if it is one of :data:`EMPTY_MESSAGES`.

    Raises:
        ValueError: anything else, naming `option`.
    """
    if value not in EMPTY_MESSAGES:
        raise ValueError(f"{option}: use {' or '.join(EMPTY_MESSAGES)}, got {value!r}")
    return value


def _parse_message(
    values: Mapping[str, Any], columns: Mapping[str, str], role: str, time_required: bool
) -> tuple[str, Message, list[tuple[str, str]]]:
    """The conversation id and the message of one row, and its problems as (column, what)."""
    problems: list[tuple[str, str]] = []
    get = values.get
    for name in REQUIRED:
        if blank(get(name)):
            problems.append((columns[name], _missing(get(name), name)))
    turn: int | None = None
    if not blank(get("turn")):
        try:
            number = float(values["turn"])
            if not number.is_integer():
                raise ValueError
            turn = int(number)
        except (TypeError, ValueError):
            problems.append((columns["turn"], f"not an integer turn: {get('turn')!r}"))
    moment: datetime | None = None
    if not blank(get("time")):
        try:
            moment = parse_time(get("time"))
        except ValueError as exc:
            problems.append((columns["time"], str(exc)))
    elif time_required:
        problems.append((columns["time"], _missing(get("time")) + " (the messages are ordered by it)"))
    gold: list[str] = []
    try:
        gold = parse_doc_ids(get("gold_doc_ids"))
    except ValueError as exc:
        problems.append((columns["gold_doc_ids"], str(exc)))
    message = Message(
        role=role,
        text=_as_str(get("text")),
        turn=turn,
        user_profile=_as_str(get("user_profile")),
        history_summary=_as_str(get("history_summary")),
        ids={k: _as_str(get(k)) for k in ID_FIELDS},
        gold_doc_ids=gold,
        time=moment,
        reference_rewrite=_as_str(get("reference_rewrite")),
    )
    return _as_str(get("conversation_id")), message, problems


def _unknown_roles_message(path: Path, unknown: Counter[str], first: Mapping[str, Row], column: str) -> str:
    """All unknown role values in one message: counts, first row, the known values, the ``--roles`` hint."""
    listed = ", ".join(
        f"{value!r} x{n} (first at {first[value].where.removeprefix(f'{path}: ')})"
        for value, n in unknown.most_common(MAX_ROLES_LISTED)
    )
    if len(unknown) > MAX_ROLES_LISTED:  # many distinct values: more likely the wrong column than many roles
        listed += f", ... and {len(unknown) - MAX_ROLES_LISTED} more (is {column!r} the role column?)"
    example = json.dumps({value: "assistant" for value, _ in unknown.most_common(2)}, ensure_ascii=False)
    return (
        f"{path}: column {column!r}: {len(unknown)} unknown role value(s): {listed}\n"
        f"  known: {roles_text()}\n"
        f"  map them with --roles, e.g. --roles '{example}' (user, assistant, or skip to drop the message)"
    )


def _order(messages: list[Message], by_time: bool) -> tuple[list[Message], str]:
    """The messages in conversation order, and how (sorting is stable: ties keep the file order)."""
    have_time = all(m.time is not None for m in messages)
    if have_time and (by_time or any(m.turn is None for m in messages)):
        return sorted(messages, key=lambda m: m.time or datetime.min), "time"
    if all(m.turn is not None for m in messages):
        return sorted(messages, key=lambda m: m.turn or 0), "turn"
    return messages, "file order"


def load_conversation_log(
    path: str | Path,
    columns: Mapping[str, str] | None = None,
    sheet: str | None = None,
    *,
    roles: Mapping[str, str] | None = None,
    header_row: int | None = None,
    order_by: str | None = None,
    fill_down: bool = True,
    empty_messages: str = "skip",
    rewrite_column: str | None = None,
) -> ConversationLog:
    """Read a message log into conversations (in order of first appearance) and a report.

    Args:
        path: ``.xlsx``, ``.xls``, ``.csv``, ``.jsonl`` or ``.parquet``.
        columns: field -> column name in the file, for columns whose header is not recognised.
        sheet: one Excel sheet (default: every sheet that has the required columns).
        roles: role value -> ``user`` / ``assistant`` / ``skip``, over the built-in ROLE_ALIASES.
        header_row: the header's 1-based row (default: found in the first 10 rows).
        order_by: a date/time column that orders each conversation (overrides the turn column).
        fill_down: fill blank conversation-level cells (merged cells) from the row above.
        empty_messages: ``skip`` (drop and count messages with an empty text, and conversations left without a
            user message) or ``error`` (each one a bad row).
        rewrite_column: the column with your reference pipeline's rewrite of each user turn (required when
            given; default: a recognised ``reference_rewrite`` header, if any); a row keeps it as
            ``extra_info.reference_rewrite``.

    Raises:
        ValueError: a key of `columns` that is not a field, a role that is not user/assistant/skip, or a bad
            `empty_messages`.
        DataError: an unreadable file, missing required columns, or bad rows (all reported).
    """
    path = Path(path)
    skip_empty = check_empty_messages(empty_messages) == "skip"
    overrides = check_columns(columns)
    if order_by is not None:
        overrides["time"] = order_by
    if rewrite_column is not None:
        overrides["reference_rewrite"] = rewrite_column
    role_map = role_table(roles)
    if path.suffix.lower() not in SUFFIXES:
        raise DataError(f"{path}: unsupported file type {path.suffix or '(none)'!r}; use one of {SUFFIXES}")
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    required = (*REQUIRED, *(["time"] if order_by is not None else []))
    required += ("reference_rewrite",) if rewrite_column is not None else ()
    tables, report = read_tables(path, overrides, sheet=sheet, header_row=header_row, required=required, fill=fill_down)
    by_id = _collect(path, tables, role_map, (order_by is not None, skip_empty), report)
    out = []
    for conv_id, messages in by_id.items():
        if not any(m.role == "user" for m in messages):  # no prompt to make: e.g. every user message was empty
            report.skipped["conversation(s) without a user message"] += 1
            continue
        ordered, how = _order(messages, order_by is not None)
        report.order[f"by {report.columns.get(how, how)}" if how != "file order" else "in file order"] += 1
        out.append(Conversation(conv_id, ordered))
    return ConversationLog(out, report)


def _collect(
    path: Path, tables: list[Table], role_map: Mapping[str, str], how: tuple[bool, bool], report: LogReport
) -> dict[str, list[Message]]:
    """Messages by conversation id, in file order; skipped ones (`how`'s second: empty ones too) counted; every
    problem in one DataError. `how`'s first: the time column orders the messages (a blank one is a problem)."""
    time_required, skip_empty = how
    errors: list[str] = []
    unknown: Counter[str] = Counter()
    first_unknown: dict[str, Row] = {}
    by_id: dict[str, list[Message]] = {}
    for table in tables:
        for row in table.rows:
            raw_role = _as_str(row.values.get("role"))
            role = role_map.get(raw_role.lower())
            if role == "skip":
                report.skipped[f"message(s) with role {raw_role!r}"] += 1
                continue
            text = row.values.get("text")
            if skip_empty and (role is not None or not raw_role) and blank(text) and not isinstance(text, Uncomputed):
                report.skipped[f"empty {role} message(s)" if role else "empty message(s) without a role"] += 1
                continue
            if role is None and raw_role:
                unknown[raw_role] += 1
                first_unknown.setdefault(raw_role, row)
            conv_id, message, problems = _parse_message(row.values, table.columns, role or "user", time_required)
            errors += [f"{row.where}: column {col!r}: {what}" for col, what in problems]
            if not problems and role is not None:
                by_id.setdefault(conv_id, []).append(message)
    blocks = [_unknown_roles_message(path, unknown, first_unknown, tables[0].columns["role"])] if unknown else []
    if errors:
        more = f"\n... and {len(errors) - MAX_REPORTED} more" if len(errors) > MAX_REPORTED else ""
        blocks.append(f"{len(errors)} bad row(s):\n" + "\n".join(errors[:MAX_REPORTED]) + more)
    if blocks:
        raise DataError("\n".join(blocks))
    return by_id


def load_conversations(
    path: str | Path,
    columns: Mapping[str, str] | None = None,
    sheet: str | None = None,
    *,
    roles: Mapping[str, str] | None = None,
    header_row: int | None = None,
    order_by: str | None = None,
    fill_down: bool = True,
    empty_messages: str = "skip",
    rewrite_column: str | None = None,
) -> list[Conversation]:
    """:func:`load_conversation_log`'s conversations (the same arguments)."""
    options: dict[str, Any] = {"header_row": header_row, "order_by": order_by, "fill_down": fill_down}
    options["rewrite_column"] = rewrite_column
    log = load_conversation_log(path, columns, sheet, roles=roles, empty_messages=empty_messages, **options)
    return log.conversations


def ground_truth(message: Message) -> dict[str, list[str]]:
    """A turn's ``reward_model.ground_truth``: its gold document ids, and their titles where known."""
    truth = {"gold_doc_ids": list(message.gold_doc_ids)}
    if message.gold_titles:
        truth["gold_titles"] = list(message.gold_titles)
    return truth


def conversation_rows(
    conversation: Conversation,
    name: str,
    lang: str = "zh",
    *,
    domain: str | None = None,
    answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS,
    answer_format: str = "json",
) -> list[dict[str, Any]]:
    """One verl row per user turn of `conversation` (see the module docstring); ``data_source`` is
    ``query_rewrite/<name>``; `domain` (default neutral), `answer_fields` and `answer_format` go to
    :func:`build_messages` (and into ``extra_info``)."""
    fields = list(check_answer_fields(answer_fields))
    fmt = check_answer_format(answer_format, fields)
    domain = (domain or "").strip() or DEFAULT_DOMAINS.get(lang, "")
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
                "prompt": build_messages(
                    contexts, profile, summary, lang, domain=domain, answer_fields=fields, answer_format=fmt
                ),
                "ability": "query_rewrite",
                "reward_model": {"style": "rule", "ground_truth": ground_truth(message)},
                "extra_info": {
                    "conversation_id": conversation.id,
                    "turn": message.turn if message.turn is not None else index,
                    "turn_index": index,
                    **{k: message.ids.get(k, "") for k in ID_FIELDS},
                    "contexts": [dict(c) for c in contexts],
                    "user_profile": profile,
                    "history_summary": summary,
                    "turn_type": message.kind,
                    "answer_fields": list(fields),
                    "answer_format": fmt,
                    "lang": lang,
                    "domain": domain,
                    **({"reference_rewrite": message.reference_rewrite} if message.reference_rewrite else {}),
                },
            }
        )
    return rows


def conversations_to_rows(
    conversations: Iterable[Conversation],
    name: str,
    lang: str = "zh",
    *,
    domain: str | None = None,
    answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS,
    answer_format: str = "json",
) -> list[dict[str, Any]]:
    """:func:`conversation_rows` of every conversation, in order (the same options)."""
    options: dict[str, Any] = {"domain": domain, "answer_fields": answer_fields, "answer_format": answer_format}
    return [row for conv in conversations for row in conversation_rows(conv, name, lang, **options)]


def write_parquet(rows: list[dict[str, Any]], out: Path) -> Path:
    """Write `rows` as parquet atomically (a temporary name in the same folder, then a rename)."""
    import pandas as pd

    with atomic_path(out) as tmp:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
    return out
