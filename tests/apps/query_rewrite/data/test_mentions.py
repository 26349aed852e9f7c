"""The knowledge base's names a conversation mentioned, as the prompt's history summary (``--mentions N``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from queryrl.apps.query_rewrite.data import kdconv_prep as prep
from queryrl.apps.query_rewrite.data.kdconv import kdconv_corpus
from queryrl.apps.query_rewrite.data.mentions import add_mentions, mention_names, mentioned, mentions_summary
from queryrl.apps.query_rewrite.eval.kdconv_file import KdConvSettings, kdconv_file_rows
from queryrl.apps.query_rewrite.eval.samples import EvalError
from tests.helpers import KDCONV, needs_kdconv

NAMES = ["故宫", "北京故宫", "景山公园", "什刹海", "恭王府"]
PATTERN = prep.entity_pattern(NAMES)


def conversation(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


def test_names_are_ordered_by_their_last_mention_and_the_current_turn_is_left_out() -> None:
    contexts = conversation(
        "你去过北京故宫吗？",  # the longer name wins over the 故宫 inside it
        "去过，景山公园就在旁边。",
        "什刹海呢？北京故宫的门票多少？",  # 北京故宫 mentioned again: it moves after 景山公园 and 什刹海
        "恭王府的电话你知道吗？",  # the current turn: the prompt shows it
    )
    assert mentioned(contexts, PATTERN, 5) == ["景山公园", "什刹海", "北京故宫"]
    assert mentioned(contexts, PATTERN, 2) == ["什刹海", "北京故宫"]
    assert mentions_summary(contexts, PATTERN, 5) == "对话中提到过（越靠后越近）：景山公园、什刹海、北京故宫"
    english = mentions_summary(contexts, PATTERN, 5, lang="en")
    assert english == "Mentioned so far (latest last): 景山公园, 什刹海, 北京故宫"


def test_no_name_before_the_turn_is_no_summary() -> None:
    assert mentions_summary(conversation("你好", "恭王府的电话？"), PATTERN, 5) == ""
    assert mentions_summary(conversation("故宫门票多少？"), PATTERN, 5) == ""  # the first turn has no history
    with pytest.raises(ValueError, match="limit must be >= 1, got 0"):
        mentioned(conversation("故宫", "好"), PATTERN, 0)


def test_mention_names_drop_one_character_names() -> None:
    assert mention_names(["故宫", "X", "岛", "天坛公园"]) == ["故宫", "天坛公园"]


def test_add_mentions_fills_the_summary_and_keeps_a_rows_own() -> None:
    rows = [
        {"extra_info": {"contexts": conversation("去故宫吗？", "门票呢？"), "history_summary": ""}},
        {"extra_info": {"contexts": conversation("去故宫吗？", "门票呢？"), "history_summary": "想带孩子去"}},
        {"extra_info": {"contexts": conversation("你好", "在吗")}},
    ]
    add_mentions(rows, prep.entity_pattern(["故宫", "天坛"]), 3)
    assert [r["extra_info"]["history_summary"] for r in rows] == [
        "对话中提到过（越靠后越近）：故宫",
        "想带孩子去\n对话中提到过（越靠后越近）：故宫",
        "",
    ]


def _slice(root: Path, n: int) -> Path:
    root.mkdir(parents=True)
    dialogues = json.loads((KDCONV / "dev.json").read_text(encoding="utf-8"))[:n]
    (root / "dev.json").write_text(json.dumps(dialogues, ensure_ascii=False), encoding="utf-8")
    (root / "kb_travel.json").write_text((KDCONV / "kb_travel.json").read_text(encoding="utf-8"), encoding="utf-8")
    return root


@needs_kdconv("travel/dev.json")
def test_prepare_puts_the_summary_in_every_splits_prompts_and_the_gold_targets_see_it(tmp_path: Path) -> None:
    src = _slice(tmp_path / "travel", 20)
    plain = prep.prepare(src, tmp_path / "plain", None, seed=0, history_chars=40, sft_target="gold_entity")
    info = prep.prepare(src, tmp_path / "m", None, seed=0, history_chars=40, sft_target="gold_entity", mentions=3)
    assert (plain["mentions"], info["mentions"]) == (0, 3)
    assert info["rows"] == plain["rows"]
    summarised = 0
    for name in ("train", "val", "test"):
        before, after = pd.read_parquet(plain["files"][name]), pd.read_parquet(info["files"][name])
        for (_, a), (_, b) in zip(before.iterrows(), after.iterrows(), strict=True):
            summary = b["extra_info"]["history_summary"]
            assert a["extra_info"]["history_summary"] == ""
            if not summary:
                assert list(a["prompt"]) == list(b["prompt"])
                continue
            summarised += 1
            assert summary.startswith("对话中提到过")
            assert summary.count("、") <= 2  # at most three names
            assert "历史摘要：\n" + summary in b["prompt"][-1]["content"]
    assert summarised > 0
    # a gold entity only the summary shows (out of the 40-character window) is named in the target
    train = pd.read_parquet(info["files"]["train"])
    named_from_summary = 0
    for _, row in train.iterrows():
        extra = row["extra_info"]
        entity = row["reward_model"]["ground_truth"]["gold_doc_ids"][0].split("::")[0]
        window = extra["contexts"][-extra["prompt_messages"] :]
        if entity in extra["history_summary"] and not any(entity in m["content"] for m in window):
            target = json.loads(extra["sft_target"])["rewritten_query"]
            assert target == f"{window[-1]['content'].strip()} {entity}"
            named_from_summary += 1
    assert named_from_summary > 0
    with pytest.raises(ValueError, match="without augment and extra_sft"):
        prep.prepare(src, tmp_path / "bad", None, seed=0, history_chars=40, augment=1, mentions=3)
    with pytest.raises(ValueError, match="mentions must be >= 0"):
        prep.prepare(src, tmp_path / "bad", None, seed=0, history_chars=40, mentions=-1)


@needs_kdconv("travel/dev.json")
def test_a_kdconv_file_evaluated_on_the_fly_gets_the_same_summaries(tmp_path: Path) -> None:
    src = _slice(tmp_path / "travel", 6)
    kb = src / "kb_travel.json"
    rows = kdconv_file_rows(src / "dev.json", kb, KdConvSettings(history_chars=40, mentions=3))
    names = prep.entity_pattern(mention_names(d["title"] for d in kdconv_corpus(kb)))
    expected = [dict(r, extra_info=dict(r["extra_info"], history_summary="")) for r in rows]
    add_mentions(expected, names, 3)
    assert [r["extra_info"]["history_summary"] for r in rows] == [r["extra_info"]["history_summary"] for r in expected]
    assert any(r["extra_info"]["history_summary"] for r in rows)
    with pytest.raises(EvalError, match="--mentions must be >= 0, got -2"):
        kdconv_file_rows(src / "dev.json", kb, KdConvSettings(mentions=-2))
