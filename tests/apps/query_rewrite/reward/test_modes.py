"""Reward modes: format, ConvSearch-R1 rank reward, the users' hybrid (seed_hybrid), group judge, mixes, dedupe."""

from __future__ import annotations

import numpy as np
import pytest

from queryrl.apps.query_rewrite.prompts import ParsedRewrite
from queryrl.apps.query_rewrite.reward.modes import (
    ABSTAIN_RIGHT,
    ABSTAIN_WRONG,
    abstain_components,
    dedupe,
    format_reward,
    group_judge_rewards,
    grpo_selector_scores,
    hybrid_reward,
    mix_rewards,
    parse_answer,
    retrieval_rank_reward,
    select_candidate,
)


def test_format_reward() -> None:
    assert format_reward(True, "X1 手机 防水", 256) == 1.0
    assert format_reward(False, "X1 手机 防水", 256) == 0.0
    assert format_reward(True, None, 256) == 0.0
    assert format_reward(True, "   ", 256) == 1.0  # an empty query is well-formed: "no retrieval needed"
    assert format_reward(True, "", 256) == 1.0
    assert format_reward(True, "abcd", 3) == 0.0
    assert format_reward(True, " abc ", 3) == 1.0  # the cap applies after stripping


def _ranked_with_gold_at(rank: int, n: int = 120) -> list[str]:
    ids = [f"x{i}" for i in range(n)]
    ids[rank - 1] = "g"
    return ids


@pytest.mark.parametrize(
    ("rank", "expected"),
    [
        (1, 2.0),  # (19 - 1) / 9
        (2, 17 / 9),  # 1.8889
        (5, 14 / 9),  # 1.5556
        (10, 1.0),  # (19 - 10) / 9
        (11, 89 / 90),  # (100 - 11) / 90 = 0.9889
        (55, 0.5),  # (100 - 55) / 90
        (100, 0.0),
        (101, 0.0),
    ],
)
def test_retrieval_rank_reward_matches_convsearch_r1(rank: int, expected: float) -> None:
    assert retrieval_rank_reward(_ranked_with_gold_at(rank), ["g"]) == pytest.approx(expected)


def test_retrieval_rank_reward_edges() -> None:
    assert retrieval_rank_reward(["a", "b"], []) is None  # no gold: not applicable
    assert retrieval_rank_reward(["a", "b"], ["g"]) == 0.0  # gold not retrieved
    assert retrieval_rank_reward(["a", "g2", "g1"], ["g1", "g2"]) == pytest.approx(17 / 9)  # best gold: rank 2
    assert retrieval_rank_reward(["a", "g"], ["g"], k=3, depth=6) == pytest.approx(1.5)  # 2 - 1/2
    with pytest.raises(ValueError, match="depth > k"):
        retrieval_rank_reward(["a"], ["a"], k=10, depth=10)


def test_grpo_selector_scores() -> None:
    # lp = [-1, -2, -3]: mean -2, population std sqrt(2/3) = 0.816497 -> z = [1.224745, 0, -1.224745]
    np.testing.assert_allclose(grpo_selector_scores([-1.0, -2.0, -3.0]), [1.224745, 0.0, -1.224745], atol=1e-6)
    np.testing.assert_array_equal(grpo_selector_scores([-4.0, -4.0]), [0.0, 0.0])
    with pytest.raises(ValueError, match="non-empty"):
        grpo_selector_scores([])


def test_select_candidate_max_log_prob() -> None:
    index, adv = select_candidate([-3.0, -1.0, -2.0], "max_log_prob", np.random.default_rng(0))
    assert index == 1
    assert adv == pytest.approx(1.224745, abs=1e-6)


def test_select_candidate_weighted_sample_is_seeded_and_softmax_distributed() -> None:
    lp = [-1.0, -2.0, -3.0]  # z = [1.2247, 0, -1.2247]; softmax = [0.7200, 0.2113, 0.0687]
    a = [select_candidate(lp, "weighted_sample", np.random.default_rng(7))[0] for _ in range(3)]
    b = [select_candidate(lp, "weighted_sample", np.random.default_rng(7))[0] for _ in range(3)]
    assert a == b
    rng = np.random.default_rng(0)
    picks = np.array([select_candidate(lp, "weighted_sample", rng)[0] for _ in range(4000)])
    freq = np.bincount(picks, minlength=3) / picks.size
    np.testing.assert_allclose(freq, [0.7200, 0.2113, 0.0687], atol=0.03)
    index, adv = select_candidate(lp, "weighted_sample", np.random.default_rng(1))
    assert adv == pytest.approx(grpo_selector_scores(lp)[index])
    with pytest.raises(ValueError, match="unknown selection"):
        select_candidate(lp, "best", rng)


def test_hybrid_reward() -> None:
    assert hybrid_reward(0.9, 1.2) == pytest.approx(0.86)  # 0.85 * (2*0.9 - 1) + 0.15 * 1.2 = 0.68 + 0.18
    assert hybrid_reward(0.5, 0.0, 0.8, 0.2) == pytest.approx(0.0)
    assert hybrid_reward(0.0, -1.0, 0.9, 0.1) == pytest.approx(-1.0)  # 0.9 * -1 + 0.1 * -1
    with pytest.raises(ValueError, match="sum to 1"):
        hybrid_reward(0.9, 1.2, 0.85, 0.2)
    with pytest.raises(ValueError, match="sum to 1"):
        hybrid_reward(0.9, 1.2, 1.1, -0.1)
    with pytest.raises(ValueError, match="quality"):
        hybrid_reward(1.5, 0.0)


def test_group_judge_rewards() -> None:
    out = group_judge_rewards([0.952, 0.5, None, 0.0])
    assert out[0] == pytest.approx(0.904)
    assert out[1:] == [0.0, None, -1.0]


def test_mix_rewards() -> None:
    comps = {"judge": 0.5, "retrieval_rank": 1.5, "format": 1.0}
    # 1.0 * 0.5 + 0.5 * 1.5 + 0.1 * 1.0 = 0.5 + 0.75 + 0.1
    assert mix_rewards(comps, {"judge": 1.0, "retrieval_rank": 0.5, "format": 0.1}) == pytest.approx(1.35)
    assert mix_rewards({**comps, "retrieval_rank": None}, {"judge": 1.0, "retrieval_rank": 0.5}) is None
    assert mix_rewards({"judge": 0.5, "retrieval_rank": None}, {"judge": 2.0, "retrieval_rank": 0.0}) == 1.0
    with pytest.raises(ValueError, match="no component"):
        mix_rewards({"judge": 0.5}, {"judge": 1.0, "fromat": 0.2})
    with pytest.raises(ValueError, match="zero"):
        mix_rewards(comps, {"judge": 0.0})
    with pytest.raises(ValueError, match=">= 0"):
        mix_rewards(comps, {"judge": -1.0})


def test_dedupe() -> None:
    rewrites = ["X1 防水吗", " X1  防水吗\n", "X1 价格", "X1\u3000防水吗", "x1 防水吗"]
    unique, index_map = dedupe(rewrites)
    assert unique == ["X1 防水吗", "X1 价格", "x1 防水吗"]  # case kept, whitespace normalised
    assert index_map == [0, 0, 1, 0, 2]
    assert [unique[j] for j in index_map][1] == "X1 防水吗"
    assert dedupe([]) == ([], [])


def test_parse_answer_accepts_the_empty_query_and_checks_the_rest() -> None:
    assert parse_answer('{"rewritten_query": "", "user_profile": "学生", "history_summary": "问过价格"}') == (
        ParsedRewrite("", "学生", "问过价格")
    )
    assert parse_answer('好的 {"rewritten_query": "  "}') == ParsedRewrite("")
    assert parse_answer('{"rewritten_query": "X3 续航"}') == ParsedRewrite("X3 续航")
    assert parse_answer('{"rewritten_query": "", "user_profile": 3}') is None  # the other fields still checked
    assert parse_answer('{"rewritten_query": null}') is None
    assert parse_answer('{"query": ""}') is None
    assert parse_answer("no json") is None
    assert parse_answer(None) is None


def test_abstain_components_on_both_kinds_of_turn() -> None:
    # a no-retrieval turn: the empty query gets every component at its top, a query gets the floor
    assert abstain_components("", no_retrieval=True, has_gold=False) == ABSTAIN_RIGHT
    assert abstain_components("  ", no_retrieval=True, has_gold=False) == ABSTAIN_RIGHT
    assert abstain_components("在吗", no_retrieval=True, has_gold=False) == ABSTAIN_WRONG
    # a retrieval turn: the empty query gets the floor; a query is left to retrieval
    assert abstain_components("", no_retrieval=False, has_gold=True) == ABSTAIN_WRONG
    assert abstain_components("X3 续航", no_retrieval=False, has_gold=True) is None
    # unlabelled (no gold, no kind): retrieval and the judge decide
    assert abstain_components("", no_retrieval=False, has_gold=False) is None
    weights = {"judge": 0.5, "retrieval_rank": 1.0, "format": 0.2}  # the demo's weights
    right = mix_rewards(ABSTAIN_RIGHT, weights)
    wrong = mix_rewards(ABSTAIN_WRONG, weights)
    assert right == pytest.approx(0.5 + 2.0 + 0.2)  # the most any answer can get
    assert wrong == pytest.approx(-0.5 + 0.0 + 0.2)  # the least a well-formed answer can get
    garbage = mix_rewards({"judge": -1.0, "retrieval_rank": 0.0, "format": 0.0}, weights)
    assert garbage is not None
    assert wrong is not None
    assert garbage < wrong
