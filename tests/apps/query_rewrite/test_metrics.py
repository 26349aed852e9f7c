"""Retrieval metrics, bootstrap intervals, win/tie/loss, the baselines and the table, hand-checked."""

from __future__ import annotations

import pytest

from queryrl.apps.query_rewrite.metrics import (
    abstain_metrics,
    abstained_result,
    bootstrap_ci,
    format_table,
    last_k_turns,
    mrr,
    ndcg_at_k,
    no_retrieval_turn,
    raw_last_turn,
    recall_at_k,
    retrieval_metrics,
    win_tie_loss,
)

RANKED = ["d3", "d1", "d7", "d2", "d9"]  # gold d1 at rank 2, d2 at rank 4
GOLD = ["d1", "d2"]


def test_recall_at_k_hand_checked() -> None:
    assert recall_at_k(RANKED, GOLD, 1) == 0.0
    assert recall_at_k(RANKED, GOLD, 3) == 0.5  # d1 of {d1, d2}
    assert recall_at_k(RANKED, GOLD, 5) == 1.0
    assert recall_at_k(["d1", "d1", "d1"], GOLD, 3) == 0.5  # a repeated id counts once


def test_mrr_hand_checked() -> None:
    assert mrr(RANKED, GOLD) == 0.5  # first gold at rank 2
    assert mrr(["x", "y"], GOLD) == 0.0
    assert mrr(["d2"], GOLD) == 1.0


def test_ndcg_hand_checked() -> None:
    # @5: DCG = 1/log2(3) + 1/log2(5) = 0.630930 + 0.430677 = 1.061606; IDCG = 1 + 1/log2(3) = 1.630930
    assert ndcg_at_k(RANKED, GOLD, 5) == pytest.approx(1.061606 / 1.630930, abs=1e-6)  # 0.650920
    # @3: only d1 (rank 2): 0.630930 / 1.630930 = 0.386853
    assert ndcg_at_k(RANKED, GOLD, 3) == pytest.approx(0.386853, abs=1e-6)
    # @1 with one gold in front: ideal = 1
    assert ndcg_at_k(["d2", "d1"], GOLD, 1) == 1.0
    assert ndcg_at_k(["d1", "d2", "x"], GOLD, 5) == pytest.approx(1.0)


def test_empty_gold_raises() -> None:
    with pytest.raises(ValueError, match="no gold"):
        recall_at_k(RANKED, [], 3)


def test_retrieval_metrics_skips_samples_without_gold() -> None:
    out = retrieval_metrics([RANKED, ["d5", "x"], ["a"]], [GOLD, ["d5"], []], ks=(1, 5))
    assert out["n_evaluated"] == 2.0
    assert out["n_skipped"] == 1.0
    assert out["recall@1"] == pytest.approx((0.0 + 1.0) / 2)
    assert out["recall@5"] == pytest.approx((1.0 + 1.0) / 2)
    assert out["mrr"] == pytest.approx((0.5 + 1.0) / 2)
    assert out["ndcg@5"] == pytest.approx((0.650920 + 1.0) / 2, abs=1e-6)
    assert retrieval_metrics([["a"]], [[]]) == {"n_evaluated": 0.0, "n_skipped": 1.0}
    with pytest.raises(ValueError, match="gold lists"):
        retrieval_metrics([RANKED], [])


def test_bootstrap_ci_contains_mean_and_narrows() -> None:
    small = [1.0, 0.0] * 10  # mean 0.5, n = 20
    large = [1.0, 0.0] * 500  # mean 0.5, n = 1000
    m1, lo1, hi1 = bootstrap_ci(small, seed=0)
    m2, lo2, hi2 = bootstrap_ci(large, seed=0)
    assert m1 == m2 == 0.5
    assert lo1 <= m1 <= hi1
    assert lo2 <= m2 <= hi2
    # the standard error shrinks as 1/sqrt(n): 0.112 at n=20, 0.016 at n=1000
    assert hi2 - lo2 < (hi1 - lo1) / 3
    assert bootstrap_ci(small, seed=0) == (m1, lo1, hi1)  # deterministic for a seed
    assert bootstrap_ci([0.3]) == (0.3, 0.3, 0.3)
    with pytest.raises(ValueError, match="no values"):
        bootstrap_ci([])


def test_win_tie_loss_counts_and_intervals() -> None:
    v = [{"better": "8b"}, {"better": "8b"}, {"better": "same"}, {"better": "32b"}, None, {"better": "x"}]
    out = win_tie_loss(v)
    assert (out["n"], out["failed"], out["win"], out["tie"], out["loss"]) == (4.0, 2.0, 2.0, 1.0, 1.0)
    assert out["win_rate"] == 0.5  # 2 / 4
    assert out["score"] == 0.625  # (2 + 0.5) / 4
    assert out["win_rate_low"] <= 0.5 <= out["win_rate_high"]
    assert out["score_low"] <= 0.625 <= out["score_high"]
    assert "win_rate" not in win_tie_loss([None])


def test_format_table() -> None:
    table = format_table(
        {
            "policy": {"recall@5": 0.8, "mrr": 0.61234, "n_evaluated": 12},
            "raw last turn": {"recall@5": 0.5, "n_evaluated": 12},
        }
    )
    assert table.splitlines() == [
        "| system | recall@5 | mrr | n_evaluated |",
        "| --- | ---: | ---: | ---: |",
        "| policy | 0.800 | 0.612 | 12 |",
        "| raw last turn | 0.500 | - | 12 |",
    ]


CONTEXTS = [
    {"role": "user", "content": "你们有 X1 手机吗"},
    {"role": "assistant", "content": "有的，X1 有三种颜色……"},
    {"role": "user", "content": "多少钱"},
    {"role": "assistant", "content": "2999 元"},
    {"role": "user", "content": " 它防水吗 "},
]


def test_baselines() -> None:
    assert raw_last_turn(CONTEXTS) == "它防水吗"
    assert last_k_turns(CONTEXTS, k=2) == "多少钱 它防水吗"
    assert last_k_turns(CONTEXTS, k=3) == "你们有 X1 手机吗 多少钱 它防水吗"  # user turns only
    assert last_k_turns(CONTEXTS, k=10) == last_k_turns(CONTEXTS, k=3)
    with pytest.raises(ValueError, match="no user turn"):
        raw_last_turn([{"role": "assistant", "content": "hi"}])


def test_no_retrieval_turn_needs_the_label_not_just_empty_gold() -> None:
    assert no_retrieval_turn([], "chitchat")
    assert not no_retrieval_turn([], "")  # logs without gold: unknown, not "no retrieval"
    assert not no_retrieval_turn([], None)
    assert not no_retrieval_turn(["d1"], "chitchat")
    assert not no_retrieval_turn([], "pronoun")
    assert abstained_result()["response"] == []
    assert abstained_result()["rewritten_query"] == ""


def test_abstain_metrics_hand_checked() -> None:
    # 3 no-retrieval turns (abstained on 2), 4 retrieval turns (abstained on 1), 1 unlabelled turn
    abstained = [True, True, False, True, False, False, False, True]
    quiet = [True, True, True, False, False, False, False, False]
    gold = [False, False, False, True, True, True, True, False]
    out = abstain_metrics(abstained, quiet, gold)
    assert out == {"n_no_retrieval": 3.0, "abstain_accuracy": pytest.approx(2 / 3), "false_abstain": 0.25}
    assert abstain_metrics([False], [False], [True]) == {"n_no_retrieval": 0.0, "false_abstain": 0.0}
    with pytest.raises(ValueError, match="lengths differ"):
        abstain_metrics([True], [True, False], [False])
