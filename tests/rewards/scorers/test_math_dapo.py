"""DAPO's math scorer (verl's ``math_dapo``) and the routing of ``math``/``aime*`` to it, as verl routes them."""

from __future__ import annotations

import pytest

from queryrl.rewards import RewardError, RewardInput, default_compute_score, make_reward_manager
from queryrl.rewards.scorers.math_dapo import compute_score, normalize_final_answer


@pytest.mark.parametrize(
    ("answer", "normalized"),
    [
        ("5", "5"),
        ("x = 3", "3"),  # the right-hand side of the last "="
        ("1,000 dollars", "1000"),  # units dropped, then the thousands separator of a plain number
        ("$\\frac12$", "\\frac{1}{2}"),  # the short TeX form spelled out, $ dropped
        ("\\boxed{42}", "42"),
        ("\\text{(B)}", "(B)"),
        ("90^\\circ", "90"),
    ],
)
def test_normalize_final_answer(answer: str, normalized: str) -> None:
    assert normalize_final_answer(answer) == normalized


def test_the_answer_after_the_last_answer_line_scores_plus_or_minus_one() -> None:
    assert compute_score("Let me think.\nAnswer: 5", "5") == {"score": 1.0, "acc": True, "pred": "5"}
    assert compute_score("answer : 1,000 dollars\n", "1000")["score"] == 1.0  # case-insensitive, normalized
    assert compute_score("Answer: 4\nwait.\nAnswer: 5", "5")["score"] == 1.0  # the last one counts
    assert compute_score("Answer: 4", "5") == {"score": -1.0, "acc": False, "pred": "4"}
    # without an "Answer:" line, verl 0.9.1 reads the last box of the last 100 characters, unnormalised
    assert compute_score("so \\boxed{5}", "5") == {"score": 1.0, "acc": True, "pred": "5"}
    assert compute_score("\\boxed{1,000}", "1000") == {"score": -1.0, "acc": False, "pred": "1,000"}
    assert compute_score("\\boxed{7}" + "y" * 120, "7")["pred"] == "[INVALID]"  # the box is too far back
    assert compute_score("Answer: 4, so \\boxed{5}", "5")["pred"] == "4,so5"  # an Answer: line wins
    assert compute_score("Answer: 5" + "." * 300, "5")["score"] == -1.0  # only the last 300 characters are read


def test_strict_box_verify_reads_the_last_box_as_it_is() -> None:
    assert compute_score("Answer: 4, so \\boxed{5}", "5", strict_box_verify=True)["score"] == 1.0
    assert compute_score("\\boxed{ 5}", "5", strict_box_verify=True) == {"score": -1.0, "acc": False, "pred": " 5"}
    assert compute_score("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", strict_box_verify=True)["score"] == 1.0
    assert compute_score("\\boxed{5", "5", strict_box_verify=True)["pred"] is None  # unclosed (verl 0.9.1: None)
    assert compute_score("Answer: 5", "5", strict_box_verify=True) == {"score": -1.0, "acc": False, "pred": None}


def test_math_and_aime_route_to_dapo_as_in_verl_and_the_math_datasets_to_boxed() -> None:
    for source in ("math", "math_dapo", "math_dapo_reasoning", "aime24", "aime_2025"):
        assert default_compute_score(source, "Answer: 5", "5") == {"score": 1.0, "acc": True, "pred": "5"}
        assert default_compute_score(source, "\\boxed{5}", "5")["score"] == 1.0  # verl 0.9.1's box fallback
        assert default_compute_score(source, "no answer", "5")["score"] == -1.0
    for source in ("lighteval/MATH", "HuggingFaceH4/MATH-500"):
        assert default_compute_score(source, "\\boxed{5}", "5") == 1.0
        assert default_compute_score(source, "Answer: 5", "5") == 0.0
    with pytest.raises(RewardError, match=r"as in verl, math, math_dapo and aime\* are DAPO's"):
        default_compute_score("MATH", "x", "y")


def test_through_a_manager_acc_is_logged_and_pred_left_out() -> None:
    with make_reward_manager("naive", default_compute_score) as manager:
        [result] = manager.score([RewardInput("math", "Answer: 7", "5")])
    assert result.score == -1.0
    assert result.extra == {"acc": 0.0}
