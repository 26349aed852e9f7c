"""KdConv loader and corpus on the real travel files (skipped where ../shared/data is absent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queryrl.apps.query_rewrite.data.kdconv import doc_id, kdconv_corpus, kdconv_rows, load_kdconv_conversations
from queryrl.data.records import DataError

KDCONV = Path(__file__).resolve().parents[4].parent / "shared" / "data" / "kdconv" / "travel"
needs_kdconv = pytest.mark.skipif(
    not (KDCONV / "dev.json").is_file(), reason=f"KdConv travel data not found at {KDCONV} (../shared/data/kdconv)"
)


@needs_kdconv
def test_gold_of_a_user_turn_is_what_the_next_reply_used() -> None:
    rows = kdconv_rows(KDCONV / "dev.json")
    first = [r for r in rows if r["extra_info"]["conversation_id"] == "dev-0000"]
    by_turn = {r["extra_info"]["turn"]: r for r in first}
    assert sorted(by_turn)[:5] == [0, 2, 4, 6, 8]  # the opening speaker's turns
    # checked by hand in dev.json: message 8 "嗯，那它那里需要门票吗？", reply 9 used (观复博物馆, 门票, 100元)
    turn = by_turn[8]
    assert turn["extra_info"]["contexts"][-1] == {"role": "user", "content": "嗯，那它那里需要门票吗？"}
    assert len(turn["extra_info"]["contexts"]) == 9
    assert turn["reward_model"]["ground_truth"] == {"gold_doc_ids": ["观复博物馆::门票"], "gold_titles": ["观复博物馆"]}
    assert by_turn[0]["reward_model"]["ground_truth"] == {
        "gold_doc_ids": ["百雅轩798艺术中心::Information"],
        "gold_titles": ["百雅轩798艺术中心"],
    }
    # reply 5 used two triples of the same entity: both are gold for turn 4, in order
    assert by_turn[4]["reward_model"]["ground_truth"]["gold_doc_ids"] == [
        "百雅轩798艺术中心::开放时间",
        "百雅轩798艺术中心::周边景点",
    ]
    assert turn["data_source"] == "query_rewrite/kdconv"


@needs_kdconv
def test_row_counts_and_both_speakers() -> None:
    data = json.loads((KDCONV / "dev.json").read_text(encoding="utf-8"))
    n_messages = sum(len(c["messages"]) for c in data)
    assert n_messages == 2691
    one = load_kdconv_conversations(KDCONV / "dev.json")
    both = load_kdconv_conversations(KDCONV / "dev.json", both_speakers=True)
    assert len(one) == 150
    assert len(both) == 300
    n_user = sum(m.role == "user" for c in both for m in c.messages)
    assert n_user == n_messages  # every message is a user turn exactly once
    gold_rows = kdconv_rows(KDCONV / "dev.json", both_speakers=True, require_gold=True)
    # slow reference: messages whose next message carries attrs
    expected = sum(1 for c in data for i in range(len(c["messages"]) - 1) if c["messages"][i + 1].get("attrs"))
    assert len(gold_rows) == expected


@needs_kdconv
def test_corpus_has_one_document_per_entity_attribute() -> None:
    corpus = kdconv_corpus(KDCONV / "kb_travel.json")
    kb = json.loads((KDCONV / "kb_travel.json").read_text(encoding="utf-8"))
    assert sum(len(t) for t in kb.values()) == 12509
    pairs = {(name, attr) for triples in kb.values() for name, attr, _ in triples}
    assert len(corpus) == len(pairs) == 6766
    ids = {d["doc_id"] for d in corpus}
    assert len(ids) == len(corpus)
    doc = next(d for d in corpus if d["doc_id"] == "观复博物馆::门票")
    assert doc == {"doc_id": "观复博物馆::门票", "title": "观复博物馆", "content": "观复博物馆 门票: 100元"}
    near = next(d for d in corpus if d["doc_id"] == doc_id("故宫", "周边景点"))
    assert near["content"].startswith("故宫 周边景点: 南锣鼓巷；天坛；恭王府")  # distinct values, in order
    gold = {g for r in kdconv_rows(KDCONV / "dev.json") for g in r["reward_model"]["ground_truth"]["gold_doc_ids"]}
    assert gold <= ids  # every gold document exists


def test_small_synthetic_file_and_errors(tmp_path: Path) -> None:
    dialogue = [
        {
            "name": "A",
            "messages": [
                {"message": "A 在哪？"},
                {"message": "在北京。", "attrs": [{"name": "A", "attrname": "地址", "attrvalue": "北京"}]},
                {"message": "门票呢？"},
            ],
        }
    ]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(dialogue, ensure_ascii=False), encoding="utf-8")
    rows = kdconv_rows(path, name="mini")
    assert [r["reward_model"]["ground_truth"]["gold_doc_ids"] for r in rows] == [["A::地址"], []]
    kb = tmp_path / "kb.json"
    kb.write_text(json.dumps({"A": [["A", "地址", "北京"], ["A", "地址", "北京"]]}, ensure_ascii=False))
    assert kdconv_corpus(kb) == [{"doc_id": "A::地址", "title": "A", "content": "A 地址: 北京"}]
    kb.write_text(json.dumps({"A": [["A", "地址"]]}))
    with pytest.raises(DataError, match="entity 'A': triple 0"):
        kdconv_corpus(kb)
    path.write_text(json.dumps([{"name": "A"}]))
    with pytest.raises(DataError, match="conversation 0: field 'messages'"):
        load_kdconv_conversations(path)
