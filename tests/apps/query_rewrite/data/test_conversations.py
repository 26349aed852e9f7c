"""Conversation logs (xlsx, csv, jsonl, parquet) -> verl rows, errors, and splits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from queryrl.apps.query_rewrite.data.conversations import (
    conversations_to_rows as to_rows,
)
from queryrl.apps.query_rewrite.data.conversations import load_conversations, normalise_role, parse_doc_ids
from queryrl.apps.query_rewrite.data.splits import prepare_conversations
from queryrl.data.records import DataError, load_records


def _message(conv: str, turn: int, role: str, text: str, gold: str = "", **extra: Any) -> dict[str, Any]:
    row = {
        "conversation_id": conv,
        "turn": turn,
        "role": role,
        "text": text,
        "user_profile": "",
        "history_summary": "",
        "tenant_id": "t1",
        "contact_id": f"c-{conv}",
        "account_id": "a1",
        "message_id": f"{conv}-{turn}",
        "gold_doc_ids": gold,
    }
    row.update(extra)
    return row


# two conversations, one per Excel sheet; c1 is written out of turn order on purpose
SHEET_A = [
    _message("c1", 1, "客服", "售价 2999 元。"),
    _message("c1", 0, "用户", "星辰 X3 多少钱？", "phone-01-price", user_profile="学生"),
    _message("c1", 2, "客户", "它续航怎么样？", "phone-01-battery", history_summary="问过价格"),
]
SHEET_B = [
    _message("c2", 0, "customer", "云帆 Pro2 和星辰 X3 哪个好？", "phone-01-specs; phone-02-specs"),
    _message("c2", 1, "Agent", "各有所长。"),
    _message("c2", 2, "USER", "那黑色的呢？", "phone-02-stock,phone-01-stock"),
    _message("c2", 3, "销售", "都有货。"),
]


def _write_all(tmp_path: Path) -> dict[str, Path]:
    paths = {s: tmp_path / f"log.{s}" for s in ("xlsx", "csv", "jsonl", "parquet")}
    with pd.ExcelWriter(paths["xlsx"], engine="openpyxl") as writer:
        pd.DataFrame(SHEET_A).to_excel(writer, sheet_name="A", index=False)
        pd.DataFrame(SHEET_B).to_excel(writer, sheet_name="B", index=False)
    pd.DataFrame(SHEET_A + SHEET_B).to_csv(paths["csv"], index=False)
    lists = [{**m, "gold_doc_ids": parse_doc_ids(m["gold_doc_ids"])} for m in SHEET_A + SHEET_B]
    paths["jsonl"].write_text("".join(json.dumps(m, ensure_ascii=False) + "\n" for m in lists), encoding="utf-8")
    pd.DataFrame(lists).to_parquet(paths["parquet"], index=False)
    return paths


def test_all_formats_give_the_same_rows(tmp_path: Path) -> None:
    rows = {fmt: to_rows(load_conversations(path), "shop") for fmt, path in _write_all(tmp_path).items()}
    assert rows["csv"] == rows["xlsx"]
    assert rows["jsonl"] == rows["xlsx"]
    assert rows["parquet"] == rows["xlsx"]
    expected_user_turns = 4
    assert len(rows["xlsx"]) == expected_user_turns


def test_row_layout(tmp_path: Path) -> None:
    rows = to_rows(load_conversations(_write_all(tmp_path)["xlsx"]), "shop")
    second = rows[1]  # c1, turn 2: "它续航怎么样？"
    assert second["data_source"] == "query_rewrite/shop"
    assert second["reward_model"]["ground_truth"] == {"gold_doc_ids": ["phone-01-battery"]}
    info = second["extra_info"]
    assert info["conversation_id"] == "c1"
    assert info["turn"] == 2
    assert info["turn_index"] == 2
    assert (info["tenant_id"], info["contact_id"], info["account_id"], info["message_id"]) == (
        "t1",
        "c-c1",
        "a1",
        "c1-2",
    )
    assert info["contexts"] == [
        {"role": "user", "content": "星辰 X3 多少钱？"},
        {"role": "assistant", "content": "售价 2999 元。"},
        {"role": "user", "content": "它续航怎么样？"},
    ]
    assert info["user_profile"] == "学生"  # carried from the earlier turn
    assert info["history_summary"] == "问过价格"
    body = second["prompt"][1]["content"]
    assert "客服：售价 2999 元。" in body
    assert body.startswith("用户画像：\n学生\n\n历史摘要：\n问过价格")
    assert body.endswith("当前问题：\n它续航怎么样？")
    assert rows[0]["extra_info"]["contexts"] == [{"role": "user", "content": "星辰 X3 多少钱？"}]
    assert rows[2]["reward_model"]["ground_truth"]["gold_doc_ids"] == ["phone-01-specs", "phone-02-specs"]
    no_gold = to_rows(load_conversations(_write_all(tmp_path)["csv"], columns={"gold_doc_ids": "absent"}), "x")
    assert all(r["reward_model"]["ground_truth"] == {"gold_doc_ids": []} for r in no_gold)


def test_one_named_sheet_and_column_mapping(tmp_path: Path) -> None:
    path = _write_all(tmp_path)["xlsx"]
    assert [c.id for c in load_conversations(path, sheet="B")] == ["c2"]
    renamed = tmp_path / "renamed.csv"
    pd.DataFrame(SHEET_B).drop(columns=["turn"]).rename(columns={"conversation_id": "会话", "text": "内容"}).to_csv(
        renamed, index=False
    )
    convs = load_conversations(renamed, columns={"conversation_id": "会话", "text": "内容"})
    assert [m.text for m in convs[0].messages] == [m["text"] for m in SHEET_B]  # file order without turns
    with pytest.raises(ValueError, match="unknown conversation field 'speaker'"):
        load_conversations(renamed, columns={"speaker": "role"})


@pytest.mark.parametrize(
    ("value", "role"),
    [("用户", "user"), ("客户", "user"), ("Customer", "user"), (" user ", "user"), ("客服", "assistant"),
     ("销售", "assistant"), ("AGENT", "assistant"), ("assistant", "assistant"), ("系统", "skip"),
     ("销售顾问", "assistant"), ("主管", None), (None, None)],
)  # fmt: skip
def test_role_normalisation(value: str | None, role: str | None) -> None:
    assert normalise_role(value) == role


def test_parse_doc_ids_forms() -> None:
    assert parse_doc_ids("a; b,c，d；e") == ["a", "b", "c", "d", "e"]
    assert parse_doc_ids('["a", "b"]') == ["a", "b"]
    assert parse_doc_ids(["a", " b "]) == ["a", "b"]
    assert parse_doc_ids(float("nan")) == []
    assert parse_doc_ids("") == []
    with pytest.raises(ValueError, match="expected a list"):
        parse_doc_ids({"a": 1})


def test_bad_rows_are_reported_by_file_sheet_row_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.xlsx"
    bad_b = [*SHEET_B[:1], {**SHEET_B[1], "role": "主管"}, {**SHEET_B[2], "text": None}, {**SHEET_B[3], "turn": "x"}]
    with pd.ExcelWriter(path, engine="openpyxl") as writer:
        pd.DataFrame(SHEET_A).to_excel(writer, sheet_name="A", index=False)
        pd.DataFrame(bad_b).to_excel(writer, sheet_name="B", index=False)
    with pytest.raises(DataError) as info:
        load_conversations(path, empty_messages="error")
    message = str(info.value)
    assert "2 bad row(s)" in message
    # spreadsheet numbering: header is row 1, so the second data row is row 3
    assert f"{path}: column 'role': 1 unknown role value(s): '主管' x1 (first at sheet 'B': row 3)" in message
    assert f"{path}: sheet 'B': row 4: column 'text': empty message" in message
    assert f"{path}: sheet 'B': row 5: column 'turn': not an integer" in message
    assert "sheet 'A'" not in message


def test_missing_column_and_bad_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "no_role.csv"
    pd.DataFrame(SHEET_A).drop(columns=["role"]).to_csv(path, index=False)
    missing = r"no_role.csv: no header with the required columns\n  missing column for 'role' \(looked for: role, 角色"
    with pytest.raises(DataError, match=missing):
        load_conversations(path)
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text(json.dumps(SHEET_A[0]) + "\n\n" + json.dumps({**SHEET_A[1], "gold_doc_ids": 5}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl: line 3: column 'gold_doc_ids'"):
        load_conversations(jsonl)
    with pytest.raises(DataError, match="unsupported file type"):
        load_conversations(tmp_path / "log.txt")


def _many(n: int) -> list[dict[str, Any]]:
    rows = []
    for c in range(n):
        for t in range(4):
            rows.append(_message(f"conv{c:02d}", t, "用户" if t % 2 == 0 else "客服", f"第 {c} 个对话第 {t} 句", "d1"))
    return rows


def _split_ids(paths: dict[str, Path]) -> dict[str, set[str]]:
    return {s: {r["extra_info"]["conversation_id"] for r in load_records(p)} for s, p in paths.items()}


def test_prepare_splits_by_conversation_deterministically(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    pd.DataFrame(_many(30)).to_csv(log, index=False)
    paths = prepare_conversations(log, tmp_path / "out", val_fraction=0.2, test_fraction=0.1, seed=3)
    assert sorted(paths) == ["test", "train", "val"]
    ids = _split_ids(paths)
    assert [len(ids[s]) for s in ("train", "val", "test")] == [21, 6, 3]
    assert set.union(*ids.values()) == {f"conv{c:02d}" for c in range(30)}
    assert sum(len(v) for v in ids.values()) == 30  # no conversation in two splits
    rows = load_records(paths["train"])
    assert len(rows) == 21 * 2  # two user turns per conversation
    assert rows[0]["data_source"] == "query_rewrite/log"
    assert rows[0]["reward_model"]["ground_truth"] == {"gold_doc_ids": ["d1"]}
    assert not list((tmp_path / "out").glob(".*"))  # no temporary files left behind
    # same seed -> same split, also from a shuffled file; another seed -> another split
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join(json.dumps(m) + "\n" for m in reversed(_many(30))))
    again = prepare_conversations(shuffled, tmp_path / "again", val_fraction=0.2, test_fraction=0.1, seed=3)
    assert _split_ids(again) == ids
    other = prepare_conversations(log, tmp_path / "other", val_fraction=0.2, test_fraction=0.1, seed=4)
    assert _split_ids(other) != ids
    with pytest.raises(ValueError, match="fraction"):
        prepare_conversations(log, tmp_path / "x", val_fraction=0.6, test_fraction=0.5)
