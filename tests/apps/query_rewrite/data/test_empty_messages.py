"""Empty messages as CRM exports have them (stickers, images, recalled messages): skipped and counted per role,
or bad rows with ``--empty-messages error``."""

from __future__ import annotations

from pathlib import Path

import openpyxl
import pandas as pd
import pytest
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.data.conversations import load_conversation_log
from queryrl.apps.query_rewrite.data.splits import prepare_conversation_data
from queryrl.cli import app
from queryrl.data.records import DataError, load_records

runner = CliRunner()
HEADER = ("会话ID", "角色", "消息内容")
ROWS = [
    ("S-1", "客户", "星辰 X3 多少钱？"),
    ("S-1", "客服", None),  # a sticker
    ("S-1", "客户", "   "),  # whitespace only
    ("S-1", "销售顾问", "售价 2999 元。"),
    ("S-1", "客户", "\u200b"),  # a zero-width space: shows as empty
    ("S-1", "客户", "它续航怎么样？"),
    ("S-2", "客户", None),  # an image: the conversation's only user message
    ("S-2", "客服", "您好，图片已收到。"),
    ("S-3", None, None),  # a recalled message: neither role nor text
    ("S-3", "系统", "客户已接入"),
    ("S-3", "客户", "有没有适合老人的手机？"),
]


def _export(path: Path) -> Path:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(HEADER)
    for row in ROWS:
        sheet.append(row)
    book.save(path)
    return path


def test_empty_messages_are_skipped_and_counted_per_role(tmp_path: Path) -> None:
    log = load_conversation_log(_export(tmp_path / "export.xlsx"))
    assert [c.id for c in log.conversations] == ["S-1", "S-3"]  # S-2 has no user message left
    assert [(m.role, m.text) for m in log.conversations[0].messages] == [
        ("user", "星辰 X3 多少钱？"),
        ("assistant", "售价 2999 元。"),
        ("user", "它续航怎么样？"),
    ]
    assert log.report.skipped == {
        "empty assistant message(s)": 1,
        "empty user message(s)": 3,
        "empty message(s) without a role": 1,
        "message(s) with role '系统'": 1,
        "conversation(s) without a user message": 1,
    }


def test_cli_summary_names_the_empty_messages_and_error_mode_stops(tmp_path: Path) -> None:
    export = _export(tmp_path / "export.xlsx")
    out = tmp_path / "qr"
    args = ["prepare", "conversations", "--input", str(export), "--out", str(out), "--val-fraction", "0"]
    result = runner.invoke(app, [*args, "--test-fraction", "0"])
    assert result.exit_code == 0, result.output
    assert (
        "skipped: 1 empty assistant message(s), 3 empty user message(s), 1 empty message(s) without a role, "
        "1 message(s) with role '系统', 1 conversation(s) without a user message (empty: stickers, images, "
        "recalled messages; --empty-messages error stops on them)"
    ) in result.output
    rows = load_records(out / "train.parquet")
    assert [r["extra_info"]["contexts"][-1]["content"] for r in rows] == [
        "星辰 X3 多少钱？",
        "它续航怎么样？",
        "有没有适合老人的手机？",
    ]

    strict = runner.invoke(
        app, [*args, "--test-fraction", "0", "--empty-messages", "error", "--out", str(tmp_path / "x")]
    )
    assert strict.exit_code == 2
    assert "Traceback" not in strict.output
    assert "row 3: column '消息内容': empty message (stickers, images and recalled messages" in strict.output
    assert not (tmp_path / "x").exists()
    bad = runner.invoke(app, [*args, "--empty-messages", "drop"])
    assert bad.exit_code == 2
    assert "--empty-messages: use skip or error, got 'drop'" in bad.output


def test_nan_and_missing_cells_from_pandas_count_as_empty(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "conversation_id": ["a", "a", "a", "a"],
            "role": ["user", "assistant", "user", "user"],
            "text": ["价格多少", float("nan"), pd.NA, "续航呢"],
        }
    ).astype({"text": "string"})
    frame.to_parquet(tmp_path / "log.parquet")
    log = load_conversation_log(tmp_path / "log.parquet")
    assert [m.text for m in log.conversations[0].messages] == ["价格多少", "续航呢"]
    assert log.report.skipped == {"empty assistant message(s)": 1, "empty user message(s)": 1}
    with pytest.raises(DataError, match=r"2 bad row\(s\)"):
        load_conversation_log(tmp_path / "log.parquet", empty_messages="error")
    result = prepare_conversation_data(tmp_path / "log.parquet", tmp_path / "out", val_fraction=0, test_fraction=0)
    assert result.counts["train"].rows == 2
