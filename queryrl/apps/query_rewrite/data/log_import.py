"""Reading a conversation log as exported by a CRM: which columns are which, where the header is.

A log is one row per message. This module turns a file (``.xlsx``, ``.xls``, ``.csv``,
``.jsonl``, ``.parquet``) into :class:`Table` objects whose rows are keyed by field name
(:data:`FIELD_SPECS`), so :mod:`~queryrl.apps.query_rewrite.data.conversations` never sees the
user's column names except in messages. What real exports need, and what is done here:

- Header names: every field has recognised header names, English and Chinese (``会话ID``,
  ``角色``, ``消息内容``, ...), compared without case, spaces, ``_`` or ``-``; ``columns`` maps a
  field to any other name.
- Header row: a title row above the header is common (``2026年11月 CRM 会话导出``), so the header
  is the first of the first :data:`HEADER_SCAN_ROWS` rows that holds the required columns, or
  the 1-based ``header_row``.
- Sheets: a sheet without the required columns (a ``说明`` notes sheet) is skipped with a note;
  only when no sheet has them is it an error, one line per missing field, naming the columns
  found and the ``--columns`` hint. A sheet with two or more of them (not all) is an error too:
  it is data under a renamed header, and skipping it would lose its rows.
- Merged cells: Excel keeps a merged cell's value in its top cell only, so blank
  conversation-level cells (:attr:`FieldSpec.fill_down`) are filled from the row above:
  the conversation id within the sheet, the others only within the same conversation.
  The message text never is. Spreadsheets only (xlsx, xls, csv); counted per column.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.data.log_files import Uncomputed, read_grids
from queryrl.data.records import DataError, iter_json_lines


@dataclass(frozen=True)
class FieldSpec:
    """One field of a message row."""

    name: str
    headers: tuple[str, ...]  # recognised header names, in order of preference
    meaning: str
    required: bool = False
    fill_down: bool = False  # a conversation-level value: a blank (merged) cell takes the one above


FIELD_SPECS = (
    FieldSpec(
        "conversation_id",
        ("conversation_id", "会话ID", "会话编号", "对话ID", "会话", "session_id", "conversation"),
        "messages with the same id form one conversation",
        required=True,
        fill_down=True,
    ),
    FieldSpec(
        "role",
        ("role", "角色", "发送方", "发送者", "发送人", "发言人", "speaker", "sender"),
        "see the roles below",
        True,
    ),
    FieldSpec(
        "text", ("text", "消息内容", "内容", "消息", "文本", "聊天内容", "content", "message"), "the message", True
    ),
    FieldSpec("turn", ("turn", "轮次", "序号", "消息序号", "seq"), "integer order of the messages in a conversation"),
    FieldSpec(
        "time",
        ("time", "发送时间", "消息时间", "时间", "timestamp", "send_time", "created_at"),
        "date/time; orders the messages when there is no turn column",
    ),
    FieldSpec("user_profile", ("user_profile", "用户画像", "客户画像", "画像", "profile"), "", fill_down=True),
    FieldSpec("history_summary", ("history_summary", "历史摘要", "摘要", "summary"), "", fill_down=True),
    FieldSpec("tenant_id", ("tenant_id", "租户ID", "tenant"), "", fill_down=True),
    FieldSpec("contact_id", ("contact_id", "联系人ID", "客户ID", "contact"), "", fill_down=True),
    FieldSpec("account_id", ("account_id", "账号ID", "账户ID", "account"), "", fill_down=True),
    FieldSpec("message_id", ("message_id", "消息ID", "msg_id"), ""),
    FieldSpec(
        "gold_doc_ids",
        ("gold_doc_ids", "金标文档", "相关文档ID", "gold"),
        "on user messages: ids separated by ; or , (or a JSON list)",
    ),
    FieldSpec(
        "reference_rewrite",
        ("reference_rewrite", "改写query", "改写后query", "改写问题", "改写查询"),
        "on user messages: your reference pipeline's rewrite of the turn, the SFT target (--rewrite-column)",
    ),
)
FIELDS = tuple(spec.name for spec in FIELD_SPECS)
REQUIRED = tuple(spec.name for spec in FIELD_SPECS if spec.required)
FILL_DOWN = tuple(spec.name for spec in FIELD_SPECS if spec.fill_down)
_ROLE_NAMES = {  # value -> role; compared in lower case
    "user": "user human customer client visitor 用户 客户 顾客 访客 买家",
    "assistant": "assistant agent bot sales 销售 销售顾问 客服 人工客服 顾问 坐席 助手 机器人",
    "skip": "system 系统 系统消息",  # notices, not dialogue
}
ROLE_ALIASES = {name: role for role, names in _ROLE_NAMES.items() for name in names.split()}
ROLES = ("user", "assistant", "skip")
SUFFIXES = (".xlsx", ".xls", ".csv", ".jsonl", ".parquet")
HEADER_SCAN_ROWS = 10
NEAR_MISS = 2  # a sheet with this many required columns but not all is an error, not skipped
COLUMNS_EXAMPLE = '--columns \'{"text": "消息内容", "role": "角色"}\''
ROLES_EXAMPLE = '--roles \'{"销售顾问": "assistant", "系统": "skip"}\''


def _norm(name: Any) -> str:
    """Header names compare without case, spaces, ``_`` or ``-`` (``Conversation ID`` = ``conversation_id``)."""
    return re.sub(r"[\s_\-]+", "", str(name)).lower()


_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff"  # zero-width characters: a cell of only these shows as empty


def blank(value: Any) -> bool:
    """None, NaN (pandas' ``NA`` / ``NaT`` too), whitespace or zero-width characters only, or a formula without
    a saved result (:class:`~.log_files.Uncomputed`)."""
    if value is None or isinstance(value, Uncomputed):
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    if type(value).__name__ in ("NAType", "NaTType"):  # pandas' missing values, without importing pandas
        return True
    return isinstance(value, str) and not value.strip().strip(_INVISIBLE).strip()


def fields_help() -> str:
    """The mappable fields, their recognised headers and the roles, for ``--help`` (generated, never stale)."""
    width = max(len(spec.name) for spec in FIELD_SPECS) + 1
    lines = [
        "Fields (one row per message). A column is found by any of the names listed (case, spaces and _ "
        f"ignored); map other names with {COLUMNS_EXAMPLE}. * = required; ↓ = a blank cell takes "
        "the value above (merged cells; --no-fill-down turns it off).",
        "",
    ]
    for spec in FIELD_SPECS:
        mark = ("*" if spec.required else "") + ("↓" if spec.fill_down else "")
        meaning = f"  ({spec.meaning})" if spec.meaning else ""
        lines.append(f"  {(spec.name + mark).ljust(width + 1)} {', '.join(spec.headers)}{meaning}")
    lines += ["", f"Roles: {roles_text()}"]
    lines.append(f"Other role values: {ROLES_EXAMPLE} (skip drops the message).")
    return "\n".join(lines)


def roles_text(table: Mapping[str, str] = ROLE_ALIASES) -> str:
    """``user = 用户, 客户, ...; assistant = ...; skip = ...``: the role values `table` knows."""
    by_role = {role: [k for k, v in table.items() if v == role] for role in ROLES}
    return "; ".join(f"{role} = {', '.join(names)}" for role, names in by_role.items() if names)


def parse_json_option(option: str, text: str | None) -> dict[str, str]:
    """A ``--columns`` / ``--roles`` JSON object of strings; errors name the option and the position."""
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{option}: not valid JSON at line {exc.lineno} column {exc.colno} (char {exc.pos}): {exc.msg}; "
            f"got {text!r}. Quote it for the shell, e.g. "
            + (COLUMNS_EXAMPLE if option == "--columns" else ROLES_EXAMPLE)
        ) from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError(f"{option}: expected a JSON object of strings, got {text!r}")
    return value


def check_columns(columns: Mapping[str, str] | None, option: str = "columns") -> dict[str, str]:
    """Field -> column overrides, with unknown fields rejected (a suggestion where one is close)."""
    import difflib

    columns = dict(columns or {})
    for key in columns:
        if key not in FIELDS:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{option}: unknown conversation field {key!r}{hint}; fields: {', '.join(FIELDS)}")
    return columns


def role_table(roles: Mapping[str, str] | None, option: str = "roles") -> dict[str, str]:
    """Role value (lower case) -> user | assistant | skip: the built-in aliases, then `roles` over them."""
    table = dict(ROLE_ALIASES)
    for value, role in (roles or {}).items():
        if role not in ROLES:
            raise ValueError(f"{option}: role value {value!r} maps to {role!r}; use one of {', '.join(ROLES)}")
        table[str(value).strip().lower()] = role
    return table


def resolve_columns(header: Sequence[str], overrides: Mapping[str, str]) -> dict[str, str]:
    """Field -> the column of `header` that holds it, for every field found.

    An override names the column exactly or up to :func:`_norm`; the other fields take the first
    recognised header name present that no override claimed.
    """
    by_norm: dict[str, str] = {}
    for column in header:
        by_norm.setdefault(_norm(column), column)
    found: dict[str, str] = {}
    for name, wanted in overrides.items():
        match = wanted if wanted in header else by_norm.get(_norm(wanted))
        if match is not None:
            found[name] = match
    taken = set(found.values())
    for spec in FIELD_SPECS:
        if spec.name in overrides:
            continue
        for alias in spec.headers:
            match = by_norm.get(_norm(alias))
            if match is not None and match not in taken:
                found[spec.name] = match
                taken.add(match)
                break
    return found


@dataclass
class Row:
    """One data row: where it is (``file: sheet 'S': row R``) and its values by field."""

    where: str
    values: dict[str, Any]


@dataclass
class Table:
    """The rows of one sheet (or file) under one header, keyed by field."""

    sheet: str | None
    header_row: int | None  # 1-based, spreadsheets only
    columns: dict[str, str]  # field -> the file's column name
    rows: list[Row]
    blank_rows: int = 0


@dataclass
class LogReport:
    """What reading a log did, for the summary a user reads before training on it."""

    path: Path
    tables: list[tuple[str | None, int | None, int]] = field(default_factory=list)  # sheet, header row, data rows
    columns: dict[str, str] = field(default_factory=dict)  # field -> column (of the first table)
    notes: list[str] = field(default_factory=list)  # skipped sheets, mapped columns not found
    filled: Counter[str] = field(default_factory=Counter)  # column -> blank cells filled down
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> messages dropped (filled by the caller)
    blank_rows: int = 0
    order: Counter[str] = field(default_factory=Counter)  # how conversations were ordered -> count (the caller)

    def lines(self) -> list[str]:
        """The report as short lines (sheets, columns, order, fill-down, skipped, notes)."""
        where = []
        for sheet, header, n in self.tables:
            at = ([f"sheet {sheet!r}"] if sheet is not None else []) + ([f"header row {header}"] if header else [])
            where.append(f"{n} rows" + (f" ({', '.join(at)})" if at else ""))
        out = [f"read {self.path}: " + "; ".join(where)]
        out.append("columns: " + ", ".join(f"{f}={c}" for f, c in self.columns.items()))
        absent = [f for f in FIELDS if f not in self.columns]
        if absent:
            out.append(f"no column for: {', '.join(absent)} (map with --columns if the file has them)")
        out.append("order: " + ", ".join(f"{n} conversation(s) {how}" for how, n in self.order.items()))
        if self.filled:
            cells = ", ".join(f"{c} {n}" for c, n in self.filled.items())
            out.append(f"filled down {sum(self.filled.values())} blank cell(s): {cells} (--no-fill-down to turn off)")
        dropped = [f"{n} {why}" for why, n in self.skipped.items()]
        if self.blank_rows:
            dropped.append(f"{self.blank_rows} blank row(s)")
        if dropped:
            empty = any(why.startswith("empty ") for why in self.skipped)
            hint = " (empty: stickers, images, recalled messages; --empty-messages error stops on them)"
            out.append("skipped: " + ", ".join(dropped) + (hint if empty else ""))
        return out + self.notes


def _cell(value: Any) -> Any:
    """Strings stripped; everything else as read."""
    return value.strip() if isinstance(value, str) else value


def _header_names(cells: Sequence[Any]) -> list[str]:
    """The header cells as names; a repeated name gets ``.1``, ``.2`` (as pandas does)."""
    names: list[str] = []
    seen: Counter[str] = Counter()
    for cell in cells:
        name = "" if blank(cell) else str(_cell(cell))
        if name:
            seen[name] += 1
            if seen[name] > 1:
                name = f"{name}.{seen[name] - 1}"
        names.append(name)
    return names


@dataclass
class _HeaderMiss:
    """A sheet without the required columns: the best header candidate, for the message."""

    sheet: str | None
    row: int | None
    found: list[str]
    missing: list[str]
    mapped: list[str] = field(default_factory=list)  # the found columns that some field took


def _find_header(
    grid: list[tuple[Any, ...]], overrides: Mapping[str, str], required: Sequence[str], header_row: int | None
) -> tuple[int, list[str], dict[str, str]] | _HeaderMiss:
    """The header's 0-based index, names and field mapping, or the closest miss."""
    if header_row is not None:
        candidates = [header_row - 1] if header_row - 1 < len(grid) else []
    else:
        candidates = [i for i in range(min(HEADER_SCAN_ROWS, len(grid))) if not all(blank(c) for c in grid[i])]
    best: _HeaderMiss | None = None
    for index in candidates:
        names = _header_names(grid[index])
        mapping = resolve_columns([n for n in names if n], overrides)
        missing = [f for f in required if f not in mapping]
        if not missing:
            return index, names, mapping
        if best is None or len(missing) < len(best.missing):
            best = _HeaderMiss(None, index + 1, [n for n in names if n], missing, list(mapping.values()))
    return best or _HeaderMiss(None, header_row, [], list(required))


def _grid_table(
    where: str, sheet: str | None, grid: list[tuple[Any, ...]], header: tuple[int, list[str], dict[str, str]]
) -> Table:
    index, names, mapping = header
    position = {name: i for i, name in enumerate(names) if name}
    table = Table(sheet, index + 1, mapping, [])
    for r in range(index + 1, len(grid)):
        cells = grid[r]
        if all(blank(c) for c in cells):
            table.blank_rows += 1
            continue
        values = {}
        for name, column in mapping.items():
            i = position[column]
            values[name] = _cell(cells[i]) if i < len(cells) else None
        table.rows.append(Row(f"{where}row {r + 1}", values))
    return table


def fill_down(table: Table) -> Counter[str]:
    """Fill blank conversation-level cells from the row above; returns column -> cells filled.

    The conversation id fills within the table; the other :data:`FILL_DOWN` fields only from a
    row of the same conversation, so one conversation's profile never leaks into the next.
    """
    filled: Counter[str] = Counter()
    fields = [f for f in FILL_DOWN if f in table.columns]
    previous: dict[str, Any] | None = None
    for row in table.rows:
        values = row.values
        if previous is not None:
            same = blank(values.get("conversation_id")) or values.get("conversation_id") == previous.get(
                "conversation_id"
            )
            for name in fields:
                if isinstance(values.get(name), Uncomputed):  # a formula's missing result is reported, not filled
                    continue
                if blank(values.get(name)) and not blank(previous.get(name)) and (same or name == "conversation_id"):
                    values[name] = previous[name]
                    filled[table.columns[name]] += 1
        previous = values
    return filled


def _records_table(path: Path, overrides: Mapping[str, str], required: Sequence[str]) -> Table | _HeaderMiss:
    """A JSON-lines or parquet file: rows are records, the header is the union of their keys."""
    records: list[tuple[str, Any]]
    if path.suffix.lower() == ".jsonl":
        records = [(f"{path}: line {line}", value) for line, value in iter_json_lines(path)]
    else:
        import pandas as pd

        frame = pd.read_parquet(path)
        records = [(f"{path}: row {i}", r) for i, r in enumerate(frame.to_dict(orient="records"))]
    keys: dict[str, None] = {}
    for where, value in records:
        if not isinstance(value, dict):
            raise DataError(f"{where}: a row must be a JSON object, got {type(value).__name__}")
        keys.update(dict.fromkeys(map(str, value)))
    mapping = resolve_columns(list(keys), overrides)
    missing = [f for f in required if f not in mapping]
    if missing:
        return _HeaderMiss(None, None, list(keys), missing, list(mapping.values()))
    table = Table(None, None, mapping, [])
    for where, value in records:
        if not value or all(blank(v) for v in value.values()):
            table.blank_rows += 1
            continue
        table.rows.append(Row(where, {name: _cell(value.get(column)) for name, column in mapping.items()}))
    return table


def read_tables(
    path: Path,
    overrides: Mapping[str, str],
    *,
    sheet: str | None = None,
    header_row: int | None = None,
    required: Sequence[str] = REQUIRED,
    fill: bool = True,
) -> tuple[list[Table], LogReport]:
    """Every table of the file that has the `required` fields (see the module docstring).

    Raises:
        DataError: an unreadable file, a missing sheet, or no table with the required columns
            (one line per missing field, the columns found per sheet, the ``--columns`` hint).
    """
    if header_row is not None and header_row < 1:
        raise ValueError(f"header_row is 1-based, got {header_row}")
    suffix = path.suffix.lower()
    report = LogReport(path)
    tables: list[Table] = []
    misses: list[_HeaderMiss] = []
    if suffix in (".jsonl", ".parquet"):
        try:
            found = _records_table(path, overrides, required)
        except DataError:
            raise
        except Exception as exc:
            raise DataError(f"{path}: cannot read {suffix} file: {exc}") from None
        if isinstance(found, Table):
            tables.append(found)
        else:
            misses.append(found)
    else:
        for name, grid in read_grids(path, sheet):
            where = f"{path}: " + (f"sheet {name!r}: " if name is not None else "")
            header = _find_header(grid, overrides, required, header_row)
            if isinstance(header, _HeaderMiss):
                header.sheet = name
                misses.append(header)
                continue
            table = _grid_table(where, name, grid, header)
            if fill:
                report.filled.update(fill_down(table))
            tables.append(table)
    _check_misses(path, tables, misses, overrides, required)
    report.notes += [
        f"skipped sheet {miss.sheet!r}: no column for {', '.join(miss.missing)}"
        + (f" (row {miss.row} has: {', '.join(miss.found)})" if miss.found else " (empty)")
        for miss in misses
    ]
    for name, column in overrides.items():
        if all(name not in t.columns for t in tables):
            report.notes.append(f"column {column!r} (for {name}) not found; {name} left empty")
    report.blank_rows = sum(t.blank_rows for t in tables)
    report.tables = [(t.sheet, t.header_row, len(t.rows)) for t in tables]
    report.columns = dict(tables[0].columns)
    return tables, report


def _check_misses(
    path: Path, tables: list[Table], misses: list[_HeaderMiss], overrides: Mapping[str, str], required: Sequence[str]
) -> None:
    """Raise when no table has the columns, or when a skipped sheet looks like data (it would be lost)."""
    if not tables:
        title = f"no {'sheet' if len(misses) > 1 else 'header'} with the required columns"
        raise DataError(_missing_columns_message(path, misses, overrides, title))
    near = [m for m in misses if len(required) - len(m.missing) >= NEAR_MISS]
    if near:
        names = ", ".join(repr(m.sheet) for m in near)
        title = f"sheet {names} has some of the required columns but not all; skipping it would lose its rows"
        raise DataError(_missing_columns_message(path, near, overrides, title, " or read one sheet with --sheet"))


def _missing_columns_message(
    path: Path, misses: list[_HeaderMiss], overrides: Mapping[str, str], title: str, also: str = ""
) -> str:
    """One line per field missing from the closest sheet, the columns found per sheet, the ``--columns`` hint."""
    specs = {spec.name: spec for spec in FIELD_SPECS}
    closest = min(misses, key=lambda m: len(m.missing))  # the data sheet, not the notes beside it
    at = f" in sheet {closest.sheet!r}" if closest.sheet is not None and len(misses) > 1 else ""
    lines = [f"{path}: {title}"]
    for name in closest.missing:
        tried = [overrides[name]] if name in overrides else list(specs[name].headers)
        lines.append(f"  missing column for {name!r}{at} (looked for: {', '.join(tried)})")
    for miss in misses:
        where = (f" sheet {miss.sheet!r}" if miss.sheet is not None else "") + (f" row {miss.row}" if miss.row else "")
        lines.append(f"  columns found{' in' if where else ''}{where}: {', '.join(miss.found) or '(none)'}")
    # a column no field took is the likely one when there is exactly one per missing field
    unused = [c for c in closest.found if c not in closest.mapped]
    guess = len(unused) == len(closest.missing)
    example = {name: unused[i] if guess else "<column>" for i, name in enumerate(closest.missing)}
    lines.append(
        "Map your column names with --columns, e.g. --columns '"
        + json.dumps(example, ensure_ascii=False)
        + f"'{also} (queryrl prepare conversations --help lists the fields)"
    )
    return "\n".join(lines)
