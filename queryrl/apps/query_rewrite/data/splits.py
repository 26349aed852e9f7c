"""A conversation log -> ``train/val/test.parquet`` (``queryrl prepare conversations``): read it
(:func:`~.conversations.load_conversation_log`), split by conversation, one row per user turn
(:func:`~.conversations.conversations_to_rows`) with the reference rewriter's SFT target, counts and
warnings for splits too small to learn from or to measure with."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.data.conversations import (
    Conversation,
    conversations_to_rows,
    load_conversation_log,
    write_parquet,
)
from queryrl.apps.query_rewrite.data.log_import import LogReport
from queryrl.apps.query_rewrite.prompts import check_answer_fields, check_answer_format

MIN_SPLIT_ROWS = 20  # below this a split's metrics are noise: warn
MIN_SPLIT_CONVERSATIONS = 3


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


@dataclass
class SplitCounts:
    """What one split holds."""

    conversations: int
    messages: int
    rows: int  # user turns = prompts


@dataclass
class PreparedConversations:
    """The written splits, their counts, the read report and warnings (tiny splits)."""

    paths: dict[str, Path]
    counts: dict[str, SplitCounts]
    report: LogReport
    warnings: list[str]
    targets: str = ""  # where the SFT targets came from (:func:`~.sft_targets.sources_line`)

    def summary(self) -> str:
        """Report lines, where the SFT targets came from, then one line per split: counts and the file."""
        lines = self.report.lines() + ([self.targets] if self.targets else [])
        for split, path in sorted(self.paths.items(), key=lambda item: ("train", "val", "test").index(item[0])):
            c = self.counts[split]
            lines.append(
                f"{split}: {c.conversations} conversations, {c.messages} messages, {c.rows} user turns (rows) -> {path}"
            )
        return "\n".join(lines)


def _split_warnings(counts: Mapping[str, SplitCounts], fractions: Mapping[str, float]) -> list[str]:
    """A warning for each split asked for that is too small to train on or to measure with."""
    out = []
    held_out = fractions.get("val", 0) + fractions.get("test", 0)
    for split, c in counts.items():
        if split != "train" and fractions.get(split, 0) == 0:
            continue  # an empty split was asked for
        if c.rows >= MIN_SPLIT_ROWS and c.conversations >= MIN_SPLIT_CONVERSATIONS:
            continue
        if split == "train":
            why = "too little to learn from; add data" + (
                " or lower --val-fraction/--test-fraction" if held_out else ""
            )
        else:
            why = f"its metrics will be noise; raise --{split}-fraction or add data"
        out.append(
            f"{split} has {c.rows} rows from {c.conversations} conversation(s), fewer than {MIN_SPLIT_ROWS} rows "
            f"or {MIN_SPLIT_CONVERSATIONS} conversations: {why}"
        )
    return out


def prepare_conversation_data(
    input_path: str | Path,
    out_dir: str | Path,
    columns: Mapping[str, str] | None = None,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
    name: str | None = None,
    sheet: str | None = None,
    lang: str = "zh",
    *,
    roles: Mapping[str, str] | None = None,
    header_row: int | None = None,
    order_by: str | None = None,
    fill_down: bool = True,
    empty_messages: str = "skip",
    rewrite_column: str | None = None,
    domain: str | None = None,
    answer_fields: str | Sequence[str] | None = None,
    answer_format: str = "json",
) -> PreparedConversations:
    """Read a conversation log and write ``train/val/test.parquet`` into `out_dir`, with counts.

    Every row carries the reference rewriter's answer as ``extra_info.sft_target`` (the
    ``queryrl sft`` warm start; :mod:`queryrl.apps.query_rewrite.data.sft_targets`).

    Args:
        input_path: the log (see :func:`load_conversation_log`).
        out_dir: created if needed.
        columns: field -> column name overrides.
        val_fraction, test_fraction: shares of conversations (rounded).
        seed: the split's shuffle seed.
        name: ``data_source`` is ``query_rewrite/<name>`` (default: the input file's stem).
        sheet: one Excel sheet (default: all that have the columns).
        lang: the prompt language.
        roles, header_row, order_by, fill_down, empty_messages, rewrite_column: as in
            :func:`load_conversation_log`; the rewrite column's rewrites are the SFT targets where given.
        domain: the prompt's domain line, e.g. ``"电子产品销售客服"`` (default neutral: ``"客服对话"``).
        answer_fields: the keys the policy answers with, a sequence or ``"rewritten_query,user_profile"``
            (default only ``rewritten_query``; :func:`~.prompts.check_answer_fields`).
        answer_format: ``json`` (default) or ``text`` (:mod:`~.prompts`).

    Raises:
        ValueError: bad `answer_fields` or `answer_format` (before the log is read), and as
            :func:`load_conversation_log`.
        DataError: as :func:`load_conversation_log`.
    """
    fields = check_answer_fields(answer_fields)
    fmt = check_answer_format(answer_format, fields)
    input_path = Path(input_path)
    options: dict[str, Any] = {"header_row": header_row, "order_by": order_by, "fill_down": fill_down}
    options["rewrite_column"] = rewrite_column
    log = load_conversation_log(input_path, columns, sheet, roles=roles, empty_messages=empty_messages, **options)
    splits = split_conversations(log.conversations, val_fraction, test_fraction, seed)
    source = name or input_path.stem
    from queryrl.apps.query_rewrite.data.sft_targets import add_sft_targets, sources_line

    column = log.report.columns.get("reference_rewrite")
    rewrite_source = f"column {column!r} of the export" if column else ""
    paths: dict[str, Path] = {}
    counts: dict[str, SplitCounts] = {}
    train: list[dict[str, Any]] = []
    for split, convs in splits.items():
        rows = conversations_to_rows(convs, source, lang, domain=domain, answer_fields=fields, answer_format=fmt)
        rows = add_sft_targets(rows, rewrite_source=rewrite_source)
        train = rows if split == "train" else train
        paths[split] = write_parquet(rows, Path(out_dir) / f"{split}.parquet")
        counts[split] = SplitCounts(len(convs), sum(len(c.messages) for c in convs), len(rows))
    fractions = {"val": val_fraction, "test": test_fraction}
    warnings = _split_warnings(counts, fractions)
    return PreparedConversations(paths, counts, log.report, warnings, sources_line(train).replace(":", " (train):", 1))


def prepare_conversations(
    input_path: str | Path,
    out_dir: str | Path,
    columns: Mapping[str, str] | None = None,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
    name: str | None = None,
    sheet: str | None = None,
    lang: str = "zh",
    **options: Any,
) -> dict[str, Path]:
    """:func:`prepare_conversation_data`'s written files: split -> parquet path (same arguments)."""
    return prepare_conversation_data(
        input_path, out_dir, columns, val_fraction, test_fraction, seed, name, sheet, lang, **options
    ).paths
