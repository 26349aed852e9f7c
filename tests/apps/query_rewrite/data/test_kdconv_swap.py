"""Entity-swapped copies of prepared rows (the warm-up data bench-real's ``--warmup-swaps`` adds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from queryrl.apps.query_rewrite.data.kdconv_prep import entity_pattern
from queryrl.apps.query_rewrite.data.kdconv_swap import row_entities, swap_rows

ATTRS = frozenset({"Information", "地址", "门票"})
KB = dict.fromkeys(("北京故宫", "故宫", "颐和园", "天坛", "香山公园", "北海公园", "雍和宫", "恭王府"), ATTRS)
KB["景山公园"] = frozenset({"Information"})  # lacks 地址: never a replacement for a gold 地址 entity


def _row() -> dict[str, Any]:
    """A warm-up row in the layout ``queryrl warmup`` writes (arrays where parquet gives arrays)."""
    contexts = np.array(
        [
            {"role": "assistant", "content": "你知道北京故宫吗？旁边是景山公园。"},
            {"role": "user", "content": "地址在哪？"},
        ],
        dtype=object,
    )
    prompt = np.array(
        [
            {"role": "system", "content": "你是查询改写助手。"},
            {
                "role": "user",
                "content": "对话历史：\n客服：你知道北京故宫吗？旁边是景山公园。\n\n当前问题：\n地址在哪？",
            },
        ],
        dtype=object,
    )
    return {
        "data_source": "query_rewrite/kdconv",
        "prompt": prompt,
        "reward_model": {
            "style": "rule",
            "ground_truth": {
                "gold_doc_ids": np.array(["北京故宫::地址"], dtype=object),
                "gold_titles": np.array(["北京故宫"], dtype=object),
            },
        },
        "extra_info": {
            "conversation_id": "dev-0001",
            "turn": np.int64(1),
            "contexts": contexts,
            "sft_target": "地址在哪？ 北京故宫",
            "warmup": {"source": "reference", "rank_reward": 1.5},
        },
    }


def test_row_entities_reads_prompt_history_target_and_gold() -> None:
    pattern = entity_pattern(KB)
    assert row_entities(_row(), pattern) == {"北京故宫": {"地址"}, "景山公园": set()}


def test_a_copy_swaps_every_mention_consistently_and_keeps_the_rest() -> None:
    row = _row()
    (copy,) = swap_rows([row], KB, 1, seed=0)
    new = copy["reward_model"]["ground_truth"]["gold_titles"][0]
    assert new in KB
    assert new != "北京故宫"
    assert "地址" in KB[new]
    assert copy["reward_model"]["ground_truth"]["gold_doc_ids"] == [f"{new}::地址"]
    assert copy["extra_info"]["sft_target"] == f"地址在哪？ {new}"
    side = [e for e in KB if e in copy["extra_info"]["contexts"][0]["content"] and e != new]
    assert len(side) == 1
    assert side[0] not in {"景山公园", "北京故宫", new}
    assert copy["prompt"][1]["content"] == row["prompt"][1]["content"].replace("北京故宫", new).replace(
        "景山公园", side[0]
    )
    assert copy["prompt"][0] == {"role": "system", "content": "你是查询改写助手。"}
    assert copy["extra_info"]["conversation_id"] == "dev-0001-swap0"
    assert copy["extra_info"]["turn"] == 1
    assert copy["extra_info"]["warmup"] == {"source": "reference", "rank_reward": 1.5}
    assert row["extra_info"]["sft_target"] == "地址在哪？ 北京故宫"  # the original is untouched


def test_copies_are_seeded_per_row_and_a_row_without_entities_has_none() -> None:
    rows = [_row(), {**_row(), "extra_info": {**_row()["extra_info"], "conversation_id": "dev-0002"}}]
    first = swap_rows(rows, KB, 3, seed=0)
    assert len(first) == 6
    assert first == swap_rows(rows, KB, 3, seed=0)
    assert swap_rows(rows[1:], KB, 3, seed=0) == first[3:]  # a row's copies do not depend on the others
    assert any(swap_rows(rows, KB, 3, seed=s) != first for s in range(1, 4))
    plain = {"prompt": [{"role": "user", "content": "谢谢"}], "extra_info": {"sft_target": "无需检索"}}
    assert swap_rows([plain], KB, 2, seed=0) == []
    assert swap_rows(rows, KB, 0, seed=0) == []
    with pytest.raises(ValueError, match="copies must be >= 0"):
        swap_rows(rows, KB, -1, seed=0)


def test_rows_and_copies_write_and_read_back_as_parquet(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    pd.DataFrame([_row()]).to_parquet(path, index=False)
    rows = pd.read_parquet(path).to_dict("records")
    copies = swap_rows(rows, KB, 2, seed=1)
    pd.DataFrame([*rows, *copies]).to_parquet(path, index=False)
    back = pd.read_parquet(path)
    assert len(back) == 3
    targets = [str(info["sft_target"]) for info in back["extra_info"]]
    assert targets[0] == "地址在哪？ 北京故宫"
    assert all(t != targets[0] and t.startswith("地址在哪？ ") for t in targets[1:])
