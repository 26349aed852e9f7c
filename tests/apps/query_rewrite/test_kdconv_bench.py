"""benchmarks/kdconv.py: data preparation and splitting on a small slice of KdConv travel, the goal entry."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.loopback import load_benchmark

REPO = Path(__file__).resolve().parents[3]
KDCONV = REPO.parent / "shared" / "data" / "kdconv" / "travel"


bench = load_benchmark("kdconv.py", "kdconv_bench")


def test_split_ids_is_seeded_disjoint_and_complete() -> None:
    ids = [f"dev-{i:04d}" for i in range(50)] * 2  # both-speaker copies share an id
    a = bench.split_ids(ids, 0.1, 0.1, seed=3)
    assert a == bench.split_ids(list(reversed(ids)), 0.1, 0.1, seed=3)
    assert {k: len(v) for k, v in a.items()} == {"val": 5, "test": 5, "train": 40}
    assert a["train"] | a["val"] | a["test"] == set(ids)
    assert not (a["train"] & a["val"])
    assert not (a["train"] & a["test"])
    assert not (a["val"] & a["test"])
    assert bench.split_ids(ids, 0.1, 0.1, seed=4) != a
    with pytest.raises(ValueError, match="sum < 1"):
        bench.split_ids(ids, 0.5, 0.5, seed=0)


def test_history_window_keeps_recent_messages_within_budget() -> None:
    contexts = [{"role": r, "content": c} for r, c in [("user", "a" * 50), ("assistant", "b" * 30), ("user", "c")]]
    assert [m["content"] for m in bench.history_window(contexts, 40)] == ["b" * 30, "c"]
    assert len(bench.history_window(contexts, 100)) == 3
    # the previous message is kept whatever its length
    assert [m["content"] for m in bench.history_window(contexts, 1)] == ["b" * 30, "c"]


def test_goal_ratio_and_verdict() -> None:
    systems = {
        "grpo": {"context_dependent": {"recall@5": 0.5}},
        "concat_last3": {"context_dependent": {"recall@5": 0.2}},
    }
    goal = bench.goal(systems)
    assert goal["met"]
    assert goal["ratio"] == pytest.approx(2.5)
    assert not bench.goal({**systems, "grpo": {"context_dependent": {"recall@5": 0.3}}})["met"]
    assert bench.goal({})["ratio"] is None
    assert not bench.goal({})["met"]


def test_main_skips_without_kdconv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "kdconv.json"
    assert bench.main(["--kdconv-dir", str(tmp_path / "absent"), "--out", str(out)]) == 0
    assert "SKIP" in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.skipif(not (KDCONV / "dev.json").exists(), reason="KdConv travel is absent")
def test_prepare_on_a_small_slice(tmp_path: Path) -> None:
    src = tmp_path / "travel"
    src.mkdir()
    dialogues = json.loads((KDCONV / "dev.json").read_text(encoding="utf-8"))[:20]
    (src / "dev.json").write_text(json.dumps(dialogues, ensure_ascii=False), encoding="utf-8")
    (src / "kb_travel.json").symlink_to(KDCONV / "kb_travel.json")
    info = bench.prepare(src, tmp_path / "data", None, seed=0, history_chars=120)
    assert info["conversations"] == {"val": 2, "test": 2, "train": 16}
    frames = {name: pd.read_parquet(path) for name, path in info["files"].items()}
    ids = {name: set(f["extra_info"].map(lambda e: e["conversation_id"])) for name, f in frames.items()}
    assert not (ids["train"] & ids["test"])
    assert not (ids["train"] & ids["val"])
    assert not (ids["val"] & ids["test"])
    row = frames["train"].iloc[3]
    info_row = row["extra_info"]
    assert len(row["reward_model"]["ground_truth"]["gold_doc_ids"]) > 0
    target = json.loads(info_row["sft_target"])
    # the rows ask for the query only (the default answer_fields): the target has exactly that field
    assert list(target) == list(info_row["answer_fields"]) == ["rewritten_query"]
    # the prompt shows a window of the history; the contexts keep the whole conversation
    assert info_row["prompt_messages"] <= len(info_row["contexts"])
    assert row["prompt"][-1]["content"].endswith(info_row["contexts"][-1]["content"])

    # KDCONV_TEST: the given file is the test split, dev's held-out share goes to training
    test_file = tmp_path / "test.json"
    test_file.write_text(json.dumps(dialogues[:3], ensure_ascii=False), encoding="utf-8")
    info = bench.prepare(src, tmp_path / "data2", test_file, seed=0, history_chars=120)
    assert info["conversations"] == {"val": 2, "test": 3, "train": 18}


def test_gold_query_uses_a_visible_gold_entity_and_its_attributes() -> None:
    window = [
        {"role": "user", "content": "你知道古北水镇吗？"},
        {"role": "assistant", "content": "知道。"},
        {"role": "user", "content": "那多少钱？"},
    ]
    gold = ["古北水镇::门票", "古北水镇::地址", "故宫::门票"]
    assert bench.gold_query(window, gold, "ref") == "古北水镇 那多少钱？ 门票 地址"
    # an entity the window does not show is not invented: the reference's query is the base
    assert bench.gold_query(window[1:], gold, "ref 那多少钱？") == "ref 那多少钱？ 门票 地址"
    assert bench.gold_query(window, ["古北水镇::Information"], "ref") == "古北水镇 那多少钱？ Information"
