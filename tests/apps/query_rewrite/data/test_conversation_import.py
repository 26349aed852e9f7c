"""Real CRM exports -> conversations: title rows, merged cells, notes sheets, roles, send times, .xls.

The export is built here the way a CRM writes it (openpyxl, merged 会话ID cells over each
conversation's rows, a 说明 sheet, rows out of time order), then read back through the library
and through ``queryrl prepare conversations``.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import openpyxl
import pandas as pd
import pytest
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.data.conversations import load_conversation_log, load_conversations
from queryrl.apps.query_rewrite.data.log_files import parse_time
from queryrl.apps.query_rewrite.data.log_import import FIELD_SPECS, ROLE_ALIASES, parse_json_option
from queryrl.apps.query_rewrite.data.splits import prepare_conversation_data
from queryrl.cli import app
from queryrl.data.records import DataError, load_records

runner = CliRunner()
TITLE = "2026年11月 CRM 会话导出"
HEADER = ["会话ID", "发送时间", "角色", "消息内容", "用户画像", "租户ID", "客户ID"]
Msg = tuple[Any, str, str]  # (发送时间, 角色, 消息内容), in FILE order: the times are deliberately out of order
CONVERSATIONS: dict[str, tuple[str, str, list[Msg]]] = {  # id -> (用户画像, 客户ID, messages)
    "S-1001": (
        "28岁，预算三千，关注拍照",
        "C-88",
        [
            (datetime(2026, 11, 3, 14, 5, 40), "销售顾问", "售价 2999 元，现在下单送耳机。"),
            (datetime(2026, 11, 3, 14, 5, 9), "客户", "星辰 X3 多少钱？"),
            (datetime(2026, 11, 3, 14, 5, 0), "系统", "客户已接入"),
            ("2026/11/3 14:06:30", "客户", "它续航怎么样？"),
            ("2026年11月3日 14:07:02", "销售顾问", "5000 毫安，正常用一天半。"),
            ("2026-11-03 14:08", "客户", "黑色的有货吗？"),
        ],
    ),
    "S-1002": (
        "老客户，买过云帆 Pro2",
        "C-90",
        [
            (datetime(2026, 11, 3, 14, 20, 0), "客户", "在吗？"),
            (datetime(2026, 11, 3, 14, 20, 30), "销售顾问", "在的，您请说。"),
            (datetime(2026, 11, 3, 14, 21, 10), "系统", "会话已转接至 销售顾问 王五"),
            (datetime(2026, 11, 3, 14, 22, 0), "客户", "云帆 Pro2 能以旧换新吗？"),
            (datetime(2026, 11, 3, 14, 22, 0), "销售顾问", "可以，旧机估价后抵扣。"),  # a tie: file order stays
        ],
    ),
    "S-1003": (
        "",  # no profile: the one above must not leak into this conversation
        "C-91",
        [
            ("2026-11-04 09:00:05", "顾客", "有没有适合老人的手机？"),
            ("2026-11-04 09:01:00", "客服", "推荐星辰 Lite，大字体大音量。"),
            ("2026-11-04 09:00:30", "客户", "要屏幕大一点的"),
        ],
    ),
    "S-1004": (
        "企业采购，20台",
        "C-92",
        [
            (datetime(2026, 11, 5, 10, 0), "客户", "批量买 20 台有优惠吗？"),
            (datetime(2026, 11, 5, 10, 1), "销售顾问", "20 台以上打九折。"),
            (datetime(2026, 11, 5, 10, 2), "客户", "那开专票呢？"),
        ],
    ),
}
CONVERSATION_LEVEL = ("会话ID", "用户画像", "客户ID")  # merged over a conversation's rows, value in the top cell


def _time_order(messages: Sequence[Msg]) -> list[Msg]:
    return sorted(messages, key=lambda m: parse_time(m[0]))  # stable, like the importer


def build_export(
    path: Path,
    conversations: dict[str, tuple[str, str, list[Msg]]] = CONVERSATIONS,
    header: Sequence[str] = HEADER,
    title_rows: int = 1,
) -> Path:
    """A CRM-style export: title row(s), Chinese header, merged cells, blank lines, a 说明 sheet."""
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.title = "会话记录"
    for r in range(1, title_rows + 1):
        sheet.cell(r, 1, TITLE if r == 1 else f"导出人：张三（第 {r} 行）")
        sheet.merge_cells(start_row=r, start_column=1, end_row=r, end_column=len(header))
    column = {name: col for col, name in enumerate(header, start=1)}
    for name, col in column.items():
        sheet.cell(title_rows + 1, col, name)
    row = title_rows + 2
    for conv_id, (profile, contact, messages) in conversations.items():
        first = row
        for when, role, text in messages:
            for name, value in (("发送时间", when), ("角色", role), ("消息内容", text), ("租户ID", "T01")):
                sheet.cell(row, column[name], value)
            row += 1
        for name, value in zip(CONVERSATION_LEVEL, (conv_id, profile, contact), strict=True):
            if name in column:
                sheet.cell(first, column[name], value or None)
                sheet.merge_cells(start_row=first, start_column=column[name], end_row=row - 1, end_column=column[name])
        row += 1  # a blank line between conversations
    notes = book.create_sheet("说明")
    notes.append(["字段说明"])
    notes.append(["会话ID：同一会话的消息共用一个编号；系统消息为自动通知"])
    book.save(path)
    return path


def test_a_realistic_export_gives_one_prompt_per_user_turn_in_time_order(tmp_path: Path) -> None:
    log = load_conversation_log(build_export(tmp_path / "logs.xlsx"))
    convs = {c.id: c for c in log.conversations}
    assert list(convs) == list(CONVERSATIONS)
    for conv_id, (profile, contact, messages) in CONVERSATIONS.items():
        expected = [(text, ROLE_ALIASES[role]) for _, role, text in _time_order(messages) if role != "系统"]
        assert [(m.text, m.role) for m in convs[conv_id].messages] == expected
        assert all(m.user_profile == profile for m in convs[conv_id].messages)  # filled down, never leaked
        assert all(m.ids["contact_id"] == contact and m.ids["tenant_id"] == "T01" for m in convs[conv_id].messages)
    report = log.report
    assert report.tables == [("会话记录", 2, 17)]  # header under the title row; 说明 skipped
    assert report.notes[0].startswith("skipped sheet '说明': no column for conversation_id, role, text")
    assert report.skipped == {"message(s) with role '系统'": 2}
    assert report.blank_rows == 3
    assert report.filled == {"会话ID": 13, "用户画像": 11, "客户ID": 13}
    assert report.order == {"by 发送时间": 4}
    assert report.columns["text"] == "消息内容"


def test_prepare_writes_the_rows_and_the_cli_prints_counts_and_warnings(tmp_path: Path) -> None:
    export = build_export(tmp_path / "logs.xlsx")
    result = prepare_conversation_data(export, tmp_path / "lib", val_fraction=0, test_fraction=0)
    rows = load_records(result.paths["train"])
    assert len(rows) == 9  # user turns: 3 + 2 + 2 + 2
    last = next(r for r in rows if r["extra_info"]["conversation_id"] == "S-1001" and r["extra_info"]["turn"] == 4)
    assert last["extra_info"]["contexts"] == [
        {"role": "user", "content": "星辰 X3 多少钱？"},
        {"role": "assistant", "content": "售价 2999 元，现在下单送耳机。"},
        {"role": "user", "content": "它续航怎么样？"},
        {"role": "assistant", "content": "5000 毫安，正常用一天半。"},
        {"role": "user", "content": "黑色的有货吗？"},
    ]
    assert last["extra_info"]["user_profile"] == "28岁，预算三千，关注拍照"
    assert "28岁，预算三千，关注拍照" in last["prompt"][1]["content"]
    for row in rows:  # the 系统 notices are in no history
        assert "接入" not in row["prompt"][1]["content"]
        assert "转接" not in str(row["extra_info"]["contexts"])
    (warning,) = result.warnings  # no warning for the empty val/test that were asked for
    assert warning.startswith("train has 9 rows from 4 conversation(s), fewer than 20 rows or 3 conversations")
    assert (result.counts["train"].messages, result.counts["train"].conversations) == (15, 4)

    out = tmp_path / "cli"
    cli = runner.invoke(
        app,
        [
            "prepare",
            "conversations",
            "--input",
            str(export),
            "--out",
            str(out),
            *("--val-fraction", "0.25"),
            "--test-fraction",
            "0.25",
        ],
    )
    assert cli.exit_code == 0, cli.output
    text = cli.output
    assert "17 rows (sheet '会话记录', header row 2)" in text
    assert "skipped sheet '说明'" in text
    assert "filled down 37 blank cell(s): 会话ID 13, 用户画像 11, 客户ID 13" in text
    assert "skipped: 2 message(s) with role '系统', 3 blank row(s)" in text
    assert "order: 4 conversation(s) by 发送时间" in text
    counts = {s: len(load_records(out / f"{s}.parquet")) for s in ("train", "val", "test")}
    assert sum(counts.values()) == 9
    for split in ("train", "val", "test"):
        assert f"{split}: " in text
        assert f"{counts[split]} user turns (rows) -> {out / split}.parquet" in text
    assert "warning: val has" in text
    assert "warning: test has" in text
    assert "--val-fraction/--test-fraction" in text


def test_message_text_never_fills_down_and_no_fill_down_turns_it_off(tmp_path: Path) -> None:
    export = build_export(tmp_path / "logs.xlsx")
    with pytest.raises(DataError) as info:
        load_conversations(export, fill_down=False)
    assert "11 bad row(s)" in str(info.value)  # the 13 merged 会话ID cells below the top ones, less 2 系统 rows
    assert "sheet '会话记录': row 4: column '会话ID': missing value" in str(info.value)
    book = openpyxl.load_workbook(export)
    book["会话记录"].cell(4, 4).value = None  # S-1001's first user message loses its text
    book.save(export)
    assert "星辰 X3 多少钱？" not in [m.text for c in load_conversations(export) for m in c.messages]  # not filled
    with pytest.raises(DataError, match=r"1 bad row\(s\):\n.*row 4: column '消息内容': empty message"):
        load_conversations(export, empty_messages="error")


def test_a_formula_without_a_saved_result_is_named_with_the_way_out(tmp_path: Path) -> None:
    """openpyxl (and other scripts) write formulas without computing them: the cell is not just "missing"."""
    export = build_export(tmp_path / "logs.xlsx")
    book = openpyxl.load_workbook(export)
    book["会话记录"].cell(4, 4).value = '=CONCAT("星辰 X3 ", "多少钱？")'  # S-1001's first user message
    book.save(export)
    with pytest.raises(DataError) as info:
        load_conversations(export)
    message = str(info.value)
    assert "1 bad row(s)" in message
    assert "row 4: column '消息内容': a formula without a saved result (=CONCAT(" in message
    assert "open the file in Excel or LibreOffice and save it, or export it as CSV" in message
    assert "missing value" not in message


def test_header_row_option_and_header_detection_limits(tmp_path: Path) -> None:
    export = build_export(tmp_path / "logs.xlsx")
    assert len(load_conversations(export, header_row=2)) == 4
    with pytest.raises(DataError, match=r"no sheet with the required columns") as info:
        load_conversations(export, header_row=1)
    assert "columns found in sheet '会话记录' row 1: 2026年11月 CRM 会话导出" in str(info.value)
    export = build_export(tmp_path / "deep.xlsx", title_rows=11)  # the header on row 12, past the scan
    with pytest.raises(DataError, match="no sheet with the required columns"):
        load_conversations(export)
    assert len(load_conversations(export, header_row=12)) == 4
    assert len(load_conversations(export, sheet="会话记录", header_row=12)) == 4
    with pytest.raises(DataError, match=r"no sheet '会话'; sheets: '会话记录', '说明'"):
        load_conversations(export, sheet="会话")


def test_order_by_a_time_column_overrides_the_turn_column(tmp_path: Path) -> None:
    header = [*HEADER[:-1], "序号"]  # a 序号 column (recognised as turn) that counts in file order
    export = build_export(tmp_path / "logs.xlsx", header=header)
    book = openpyxl.load_workbook(export)
    sheet = book["会话记录"]
    for r in range(3, sheet.max_row + 1):
        sheet.cell(r, 7, r if sheet.cell(r, 3).value else None)
    book.save(export)
    by_turn = {c.id: [m.text for m in c.messages] for c in load_conversations(export)}
    by_time = {c.id: [m.text for m in c.messages] for c in load_conversations(export, order_by="发送时间")}
    assert by_turn["S-1001"][0] == "售价 2999 元，现在下单送耳机。"  # file order via 序号
    assert by_time["S-1001"][0] == "星辰 X3 多少钱？"
    assert by_time["S-1002"][-2:] == ["云帆 Pro2 能以旧换新吗？", "可以，旧机估价后抵扣。"]  # tie: file order
    sheet.cell(4, 2, "昨天下午")
    book.save(export)
    with pytest.raises(DataError, match=r"row 4: column '发送时间': not a date/time: '昨天下午'"):
        load_conversations(export, order_by="发送时间")
    with pytest.raises(DataError, match=r"missing column for 'time' in sheet '会话记录' \(looked for: 下单时间\)"):
        load_conversations(export, order_by="下单时间")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (datetime(2026, 11, 3, 14, 5), datetime(2026, 11, 3, 14, 5)),
        ("2026-11-03 14:05:09", datetime(2026, 11, 3, 14, 5, 9)),
        ("2026/11/3 9:05", datetime(2026, 11, 3, 9, 5)),
        ("2026.11.03", datetime(2026, 11, 3)),
        ("2026年11月3日 14时05分09秒", datetime(2026, 11, 3, 14, 5, 9)),
        ("2026年11月3日 14:05", datetime(2026, 11, 3, 14, 5)),
        ("2026-11-03T14:05:09+08:00", datetime(2026, 11, 3, 6, 5, 9)),
        ("2026-11-03 14:05:09.250", datetime(2026, 11, 3, 14, 5, 9, 250000)),
        (46329.5, datetime(2026, 11, 3, 12, 0)),  # an Excel serial number
        (1_793_714_400, datetime(2026, 11, 3, 14, 0)),  # Unix seconds (UTC)
        (1_793_714_400_000, datetime(2026, 11, 3, 14, 0)),  # Unix milliseconds
    ],
)  # fmt: skip
def test_parse_time_formats(value: Any, expected: datetime) -> None:
    assert parse_time(value) == expected


def test_parse_time_rejects_other_text() -> None:
    assert parse_time("14:05") < parse_time("14:06:01")  # a time alone sorts on one fixed day
    for bad in ("昨天", "11/03/2026", True):
        with pytest.raises(ValueError, match="not a date/time"):
            parse_time(bad)


def test_unknown_roles_are_one_message_and_roles_maps_them(tmp_path: Path) -> None:
    convs = {
        k: (p, c, [(t, {"销售顾问": "主管"}.get(r, r), x) for t, r, x in m]) for k, (p, c, m) in CONVERSATIONS.items()
    }
    convs["S-1004"][2][1] = (datetime(2026, 11, 5, 10, 1), "店长", "20 台以上打九折。")
    export = build_export(tmp_path / "logs.xlsx", convs)
    with pytest.raises(DataError) as info:
        load_conversations(export)
    message = str(info.value)
    assert message.startswith(
        f"{export}: column '角色': 2 unknown role value(s): '主管' x4 (first at sheet '会话记录': row 3), "
        "'店长' x1 (first at sheet '会话记录': row 21)"
    )
    assert "bad row" not in message
    assert '--roles \'{"主管": "assistant", "店长": "assistant"}\'' in message
    assert message.count("\n") == 2  # the values, the known ones, the hint
    convs_ok = load_conversations(export, roles={"主管": "assistant", "店长": "assistant", "客户": "user"})
    assert [m.role for m in convs_ok[0].messages] == ["user", "assistant", "user", "assistant", "user"]
    skipped = load_conversation_log(export, roles={"主管": "skip", "店长": "skip"})
    assert skipped.report.skipped["message(s) with role '主管'"] == 4
    with pytest.raises(ValueError, match="roles: role value '主管' maps to 'boss'; use one of user, assistant, skip"):
        load_conversations(export, roles={"主管": "boss"})


def _rename_header(path: Path, old: str, new: str) -> None:
    book = openpyxl.load_workbook(path)
    for cell in book["会话记录"][2]:
        if cell.value == old:
            cell.value = new
    book.save(path)


def test_a_missing_column_is_one_message_with_the_columns_found_and_a_hint(tmp_path: Path) -> None:
    many = {f"S-{i:04d}": CONVERSATIONS["S-1001"] for i in range(18)}  # 108 rows: one message, not one per row
    export = build_export(tmp_path / "logs.xlsx", many)
    _rename_header(export, "消息内容", "正文")
    with pytest.raises(DataError) as info:
        load_conversations(export)
    message = str(info.value)
    assert message.count("missing column") == 1
    assert "missing column for 'text' in sheet '会话记录' (looked for: text, 消息内容, 内容" in message
    assert "columns found in sheet '会话记录' row 2: 会话ID, 发送时间, 角色, 正文, 用户画像, 租户ID, 客户ID" in message
    assert "columns found in sheet '说明' row 1: 字段说明" in message
    assert '--columns \'{"text": "正文"}\'' in message
    assert len(message.splitlines()) == 5
    assert len(load_conversations(export, {"text": "正文"})) == 18
    cli = runner.invoke(app, ["prepare", "conversations", "--input", str(export), "--out", str(tmp_path / "o")])
    assert cli.exit_code == 2
    assert cli.output.count("missing column") == 1
    assert not (tmp_path / "o").exists()  # nothing written


def test_cli_json_options_fail_with_the_option_and_position(tmp_path: Path) -> None:
    export = build_export(tmp_path / "logs.xlsx")
    base = ["prepare", "conversations", "--input", str(export), "--out", str(tmp_path / "o")]
    cli = runner.invoke(app, [*base, "--columns", "{text: 正文}"])
    assert cli.exit_code == 2
    assert "--columns: not valid JSON at line 1 column 2 (char 1): Expecting property name" in cli.output
    cli = runner.invoke(app, [*base, "--roles", '{"主管": "assistant",}'])
    assert cli.exit_code == 2
    assert "--roles: not valid JSON at line 1 column 20" in cli.output
    cli = runner.invoke(app, [*base, "--roles", '{"主管": "boss"}'])
    assert cli.exit_code == 2
    assert "--roles: role value '主管' maps to 'boss'" in cli.output
    cli = runner.invoke(app, [*base, "--columns", '{"txt": "正文"}'])
    assert cli.exit_code == 2
    assert "--columns: unknown conversation field 'txt' (did you mean 'text'?)" in cli.output
    cli = runner.invoke(app, [*base, "--columns", '["text"]'])
    assert cli.exit_code == 2
    assert "--columns: expected a JSON object of strings" in cli.output
    assert not (tmp_path / "o").exists()
    assert parse_json_option("--columns", " ") == {}


def test_help_lists_every_field_and_recognised_header() -> None:
    cli = runner.invoke(app, ["prepare", "conversations", "--help"], env={"COLUMNS": "400"})
    assert cli.exit_code == 0
    for spec in FIELD_SPECS:
        assert spec.name in cli.output
        assert ", ".join(spec.headers) in cli.output
    for value in ("销售顾问", "系统", "--no-fill-down", "--header-row", "--order-by", "--roles", ".xls"):
        assert value in cli.output


def test_no_sheet_with_the_columns_names_every_sheet(tmp_path: Path) -> None:
    book = openpyxl.Workbook()
    first = book.active
    assert first is not None
    first.title = "统计"
    first.append(["日期", "会话数"])
    book.create_sheet("说明").append(["字段说明"])
    book.create_sheet("空白")
    book.save(tmp_path / "stats.xlsx")
    with pytest.raises(DataError) as info:
        load_conversations(tmp_path / "stats.xlsx")
    message = str(info.value)
    for line in (
        "no sheet with the required columns",
        "missing column for 'conversation_id'",
        "missing column for 'role'",
        "missing column for 'text'",
        "columns found in sheet '统计' row 1: 日期, 会话数",
        "columns found in sheet '说明' row 1: 字段说明",
        "columns found in sheet '空白': (none)",
    ):
        assert line in message


def test_xls_files_read_like_xlsx(tmp_path: Path) -> None:
    xlwt = pytest.importorskip("xlwt", reason="xlwt (an .xls writer) builds the test file: pip install xlwt")
    book = xlwt.Workbook()
    sheet = book.add_sheet("会话记录")
    dates = xlwt.easyxf(num_format_str="yyyy-mm-dd hh:mm:ss")
    sheet.write_merge(0, 0, 0, 3, TITLE)
    for col, name in enumerate(["会话ID", "发送时间", "角色", "消息内容"]):
        sheet.write(1, col, name)
    messages = _time_order(CONVERSATIONS["S-1002"][2])[::-1]  # newest first, as some CRMs export
    for i, (when, role, text) in enumerate(messages, start=2):
        sheet.write(i, 1, when, dates)
        sheet.write(i, 2, role)
        sheet.write(i, 3, text)
    sheet.write_merge(2, 1 + len(messages), 0, 0, "S-1002")  # merged 会话ID
    book.save(str(tmp_path / "logs.xls"))
    log = load_conversation_log(tmp_path / "logs.xls")
    (conv,) = log.conversations
    assert conv.id == "S-1002"
    # newest-first rows come back in time order; the tie at 14:22 keeps file order (here reversed)
    assert [m.text for m in conv.messages] == [
        "在吗？",
        "在的，您请说。",
        "可以，旧机估价后抵扣。",
        "云帆 Pro2 能以旧换新吗？",
    ]
    assert log.report.filled == {"会话ID": 4}
    assert log.report.tables == [("会话记录", 2, 5)]


def test_an_xlsx_saved_as_xls_and_an_html_xls(tmp_path: Path) -> None:
    renamed = tmp_path / "export.xls"
    renamed.write_bytes(build_export(tmp_path / "logs.xlsx").read_bytes())
    assert len(load_conversations(renamed)) == 4
    html = tmp_path / "html.xls"
    html.write_text("<table><tr><td>会话ID</td></tr></table>", encoding="utf-8")
    with pytest.raises(DataError, match=r"an HTML table saved as \.xls"):
        load_conversations(html)


def test_a_gbk_csv_with_a_title_row_and_blank_conversation_cells(tmp_path: Path) -> None:
    lines = [TITLE, "会话ID,角色,消息内容,发送时间", "A1,客户,在吗,2026-11-03 10:00", ",客服,在的,2026-11-03 10:01"]
    lines += ["", "A2,用户,多少钱,2026-11-03 11:00"]
    path = tmp_path / "logs.csv"
    path.write_bytes("\n".join(lines).encode("gb18030"))
    log = load_conversation_log(path)
    assert [(c.id, [m.text for m in c.messages]) for c in log.conversations] == [
        ("A1", ["在吗", "在的"]),
        ("A2", ["多少钱"]),
    ]
    assert log.report.tables == [(None, 2, 3)]
    assert log.report.filled == {"会话ID": 1}
    assert log.report.blank_rows == 1


def test_a_sheet_with_some_of_the_columns_is_an_error_not_skipped(tmp_path: Path) -> None:
    export = build_export(tmp_path / "logs.xlsx")
    book = openpyxl.load_workbook(export)
    december = book.create_sheet("12月")
    december.append(["会话ID", "角色", "正文"])  # 消息内容 renamed: this is data, not notes
    december.append(["D-1", "客户", "还有货吗？"])
    book.save(export)
    with pytest.raises(DataError) as info:
        load_conversations(export)
    message = str(info.value)
    assert message.startswith(f"{export}: sheet '12月' has some of the required columns but not all")
    assert "missing column for 'text' (looked for: text, 消息内容" in message
    assert "columns found in sheet '12月' row 1: 会话ID, 角色, 正文" in message
    assert '--columns \'{"text": "正文"}\' or read one sheet with --sheet' in message
    assert [c.id for c in load_conversations(export, {"text": "正文"}, sheet="12月")] == ["D-1"]
    assert len(load_conversations(export, sheet="会话记录")) == 4


def test_a_wrong_role_column_lists_ten_values_and_asks(tmp_path: Path) -> None:
    export = build_export(tmp_path / "logs.xlsx")
    with pytest.raises(DataError) as info:
        load_conversations(export, {"role": "消息内容", "text": "角色"})  # swapped by mistake
    first_line = str(info.value).splitlines()[0]
    assert "column '消息内容': 17 unknown role value(s): " in first_line  # the system rows too
    assert first_line.endswith(", ... and 7 more (is '消息内容' the role column?)")
    assert first_line.count(" x1 (first at ") == 10


def test_chinese_keys_in_jsonl_and_parquet(tmp_path: Path) -> None:
    records = [
        {"会话ID": "J1", "角色": "客户", "消息内容": "星辰 X3 多少钱？", "发送时间": "2026-11-03 14:05:09"},
        {"会话ID": "J1", "角色": "系统", "消息内容": "已接入", "发送时间": "2026-11-03 14:05:00"},
        {"会话ID": "J1", "角色": "销售顾问", "消息内容": "2999 元。", "发送时间": "2026-11-03 14:04:00"},
    ]
    jsonl = tmp_path / "logs.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    pd.DataFrame(records).to_parquet(tmp_path / "logs.parquet", index=False)
    for path in (jsonl, tmp_path / "logs.parquet"):
        log = load_conversation_log(path)
        assert [(m.role, m.text) for m in log.conversations[0].messages] == [
            ("assistant", "2999 元。"),
            ("user", "星辰 X3 多少钱？"),
        ]
        assert log.report.columns == {
            "conversation_id": "会话ID",
            "role": "角色",
            "text": "消息内容",
            "time": "发送时间",
        }
        assert log.report.skipped == {"message(s) with role '系统'": 1}


def test_cli_passes_every_import_option(tmp_path: Path) -> None:
    export = build_export(tmp_path / "logs.xlsx")
    _rename_header(export, "消息内容", "正文")
    base = ["prepare", "conversations", "--input", str(export), "--out", str(tmp_path / "o"), "--sheet", "会话记录"]
    base += ["--columns", '{"text": "正文"}', "--header-row", "2", "--order-by", "发送时间"]
    cli = runner.invoke(app, [*base, "--no-fill-down"])
    assert cli.exit_code == 2
    assert "11 bad row(s)" in cli.output
    cli = runner.invoke(app, [*base, "--roles", '{"客户": "skip", "顾客": "skip"}'])  # the sales side only: no prompts
    assert cli.exit_code == 0, cli.output
    for skipped in ("8 message(s) with role '客户'", "1 message(s) with role '顾客'", "2 message(s) with role '系统'"):
        assert skipped in cli.output
    assert "4 conversation(s) without a user message" in cli.output  # dropped: they give no prompt
    assert "train: 0 conversations, 0 messages, 0 user turns (rows)" in cli.output
    assert "warning: train has 0 rows" in cli.output


def test_an_xlsx_with_a_wrong_dimension_tag_is_read_whole(tmp_path: Path) -> None:
    export = build_export(tmp_path / "logs.xlsx")
    broken = tmp_path / "broken.xlsx"
    with zipfile.ZipFile(export) as src, zipfile.ZipFile(broken, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "xl/worksheets/sheet1.xml":  # as some exporters write it: the sheet claims A1 only
                data = data.replace(b'<dimension ref="A1:G22" />', b'<dimension ref="A1" />')
                assert b'<dimension ref="A1" />' in data
            dst.writestr(item, data)
    assert len(load_conversations(broken)) == 4
