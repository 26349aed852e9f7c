"""Records: rows of verl's parquet layout, read from parquet or JSON lines and checked.

A row (verl's layout, one prompt per row)::

    data_source   str, required: routes the row to its reward function
    prompt        list of chat messages {"role": str, "content": str}, non-empty, required
                  (the column is ``prompt_key``; a plain string becomes one user message)
    ability       str, optional
    reward_model  dict, optional (``ground_truth`` may be any JSON value); required, with a ground_truth
                  that is not null, where the row's reward compares against one (``needs_truth``)
    extra_info    dict, optional

Other columns are kept untouched. Every problem is one :class:`DataError` whose message names
the file, the row (0-based; plus the 1-based line for JSON lines) and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json")


class DataError(ValueError):
    """A data file or row that does not fit the expected layout; the message says where."""


def _where(path: Path | str, row: int | None = None, line: int | None = None, field: str | None = None) -> str:
    """``file: row 3 (line 5): field 'prompt'`` — the location prefix of every message."""
    parts = [str(path)]
    if row is not None:
        parts.append(f"row {row}" + (f" (line {line})" if line is not None else ""))
    elif line is not None:
        parts.append(f"line {line}")
    if field is not None:
        parts.append(f"field {field!r}")
    return ": ".join(parts)


MIN_LINE_BYTES = 1 << 20  # the line limit's floor: 1 MiB
BYTES_PER_PROMPT_TOKEN = 64  # far above any tokenizer's bytes per token, room for the row's other fields


def line_byte_limit(max_prompt_length: int) -> int:
    """The longest JSON line read for a prompt of at most `max_prompt_length` tokens: 64 bytes a token, 1 MiB at
    least. A longer line is skipped while it is read (in bounded memory), never parsed or tokenized: a 50 MB
    line took minutes and gigabytes before its prompt was filtered as overlong."""
    return max(MIN_LINE_BYTES, BYTES_PER_PROMPT_TOKEN * max_prompt_length)


def _lines(f: Any, limit: int | None) -> Iterator[tuple[bytes, int]]:
    """``(line, size)`` of each line of the binary file `f`; a line over `limit` bytes comes back empty with its
    size, read in chunks and dropped (at most `limit` bytes held)."""
    if limit is None:
        for raw in f:
            yield raw, len(raw)
        return
    while raw := f.readline(limit + 1):
        if len(raw) <= limit:  # the newline counts
            yield raw, len(raw)
            continue
        size = len(raw)
        while not raw.endswith(b"\n") and (raw := f.readline(limit + 1)):
            size += len(raw)
        yield b"", size


def iter_json_lines(
    path: Path, max_line_bytes: int | None = None, on_overlong: Callable[[int, int], None] | None = None
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, value)`` for each non-blank line of a JSON-lines file.

    A line over `max_line_bytes` (None: no limit) is read in chunks and dropped: ``on_overlong(line, bytes)`` is
    called for it, or without `on_overlong` it is a :class:`DataError`.

    Raises:
        DataError: a line that is not UTF-8 or not valid JSON, naming the file, the row
            (0-based, blank lines not counted) and the 1-based line; an overlong line (see above).
    """
    row = 0
    with path.open("rb") as f:
        for line_no, (raw, size) in enumerate(_lines(f, max_line_bytes), start=1):
            if size and not raw:
                if on_overlong is None:
                    raise DataError(f"{_where(path, None, line_no)}: a line of {size} bytes, over {max_line_bytes}")
                on_overlong(line_no, size)
                continue
            try:
                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{_where(path, row, line_no)}: not UTF-8 text: {exc.reason}") from None
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                msg = f"invalid JSON: {exc.msg} (column {exc.colno})"
                raise DataError(f"{_where(path, row, line_no)}: {msg}") from None
            yield line_no, value
            row += 1


def _read_parquet(path: Path) -> list[tuple[int | None, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise DataError(f"{path}: cannot read parquet file: {exc}") from None
    # A DataFrame index that pandas stored as a column is not part of the data.
    meta = table.schema.pandas_metadata or {}
    index_columns = [c for c in meta.get("index_columns", []) if isinstance(c, str)]
    if index_columns:
        table = table.drop_columns(index_columns)
    # to_pylist gives plain Python lists and dicts (no numpy arrays, unlike to_pandas).
    return [(None, row) for row in table.to_pylist()]


def _read_json(path: Path) -> list[tuple[int | None, Any]]:
    """A ``.json`` file holds either one JSON list of rows or JSON lines."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text: {exc}") from None
    if not text.lstrip().startswith("["):
        return [(line, row) for line, row in iter_json_lines(path)]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{_where(path, line=exc.lineno)}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    return [(None, row) for row in value]


class TextPrompt(list[dict[str, Any]]):
    """A prompt that was a plain string in the data (TRL's "standard" format): the one user message the
    policy is prompted with, and in :attr:`text` the string itself, which a TRL-style reward function gets
    back as it was (:mod:`queryrl.rewards.trl_style`). It pickles and JSON-encodes as the message list."""

    def __init__(self, text: str) -> None:
        super().__init__([{"role": "user", "content": text}])
        self.text = text

    def __reduce__(self) -> tuple[Any, ...]:
        return (TextPrompt, (self.text,))


def _check_prompt(value: Any, path: Path, row: int, line: int | None, key: str) -> list[dict[str, Any]]:
    where = _where(path, row, line, key)
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: the prompt is an empty string")
        return TextPrompt(value)
    if not isinstance(value, list):
        raise DataError(f"{where}: expected a list of chat messages or a string, got {type(value).__name__}")
    if not value:
        raise DataError(f"{where}: the prompt is an empty list of messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise DataError(f"{where}: message {i} is a {type(message).__name__}, not a dict with role and content")
        for part in ("role", "content"):
            if not isinstance(message.get(part), str):
                got = "missing" if message.get(part) is None else f"a {type(message[part]).__name__}"
                raise DataError(f"{where}: message {i} needs a string {part!r}, got {got}")
    return value


def check_record(
    row: Any,
    path: Path | str,
    index: int,
    line: int | None = None,
    prompt_key: str = "prompt",
    needs_truth: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """Check one row of verl's layout and return it (a string prompt becomes one user message).

    Args:
        row: the decoded row.
        path: the file it came from (for messages).
        index: its 0-based row index in the file.
        line: its 1-based line number, for JSON lines.
        prompt_key: the column holding the chat messages.
        needs_truth: whether the reward of a ``data_source`` compares against ``reward_model.ground_truth``
            (a row without one would be scored against the string ``"None"``); None: no row needs one.

    Raises:
        DataError: naming the file, the row and the field.
    """
    path = Path(path)
    if not isinstance(row, dict):
        raise DataError(f"{_where(path, index, line)}: a row must be a JSON object, got {type(row).__name__}")
    if prompt_key not in row or row[prompt_key] is None:
        raise DataError(f"{_where(path, index, line, prompt_key)}: missing (the prompt column)")
    checked: dict[str, Any] = {str(k): v for k, v in row.items()}
    checked[prompt_key] = _check_prompt(row[prompt_key], path, index, line, prompt_key)
    source = checked.get("data_source")
    if not isinstance(source, str) or not source:
        got = "missing" if source is None else repr(source)
        raise DataError(f"{_where(path, index, line, 'data_source')}: a non-empty string is required, got {got}")
    checks = (("ability", str), ("reward_model", dict), ("extra_info", dict))
    for field, kind in checks:
        value = checked.get(field)
        if value is not None and not isinstance(value, kind):
            got = type(value).__name__
            raise DataError(f"{_where(path, index, line, field)}: expected a {kind.__name__} (or nothing), got {got}")
    if needs_truth is not None and needs_truth(source):
        _check_truth(checked.get("reward_model"), source, _where(path, index, line, "reward_model"))
    return checked


def _check_truth(reward_model: dict[str, Any] | None, source: str, where: str) -> None:
    """A :class:`DataError` at `where` unless `reward_model` holds a ``ground_truth`` that is not null."""
    if reward_model is not None and reward_model.get("ground_truth") is not None:
        return
    if reward_model is None:
        got = "missing or null"
    else:
        got = "without ground_truth" if "ground_truth" not in reward_model else "with ground_truth null"
    raise DataError(
        f"{where}: {got}, but data_source {source!r} is scored against reward_model.ground_truth (give the row "
        "its answer, or score it with a reward of your own: reward.function.path)"
    )


def load_records(
    path: str | Path,
    prompt_key: str = "prompt",
    max_line_bytes: int | None = None,
    on_overlong: Callable[[int, int], None] | None = None,
    needs_truth: Callable[[str], bool] | None = None,
) -> list[dict[str, Any]]:
    """Read and check every row of a verl-layout data file.

    Args:
        path: a ``.parquet`` file, or a ``.jsonl`` / ``.json`` file (JSON lines or one JSON list).
        prompt_key: the column holding the chat messages.
        max_line_bytes, on_overlong: a JSON-lines file's longest line, and what to do with a longer one
            (:func:`iter_json_lines`; :func:`line_byte_limit` derives the limit from ``data.max_prompt_length``).
        needs_truth: the data sources whose rows need a ``reward_model.ground_truth`` (:func:`check_record`).

    Returns:
        The rows as plain Python dicts, in file order; a string prompt is turned into
        ``[{"role": "user", "content": prompt}]``.

    Raises:
        DataError: missing file, unsupported extension, unreadable file or a bad row; the
            message names the file, the row (and line) and the field.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise DataError(f"{path}: unsupported file type {suffix or '(none)'!r}; use one of {SUPPORTED_SUFFIXES}")
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    if suffix == ".parquet":
        raw = _read_parquet(path)
    elif suffix == ".jsonl":
        raw = [(line, row) for line, row in iter_json_lines(path, max_line_bytes, on_overlong)]
    else:
        raw = _read_json(path)
    return [check_record(row, path, i, line, prompt_key, needs_truth) for i, (line, row) in enumerate(raw)]
