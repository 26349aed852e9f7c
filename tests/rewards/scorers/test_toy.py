"""The toy preset's similarity reward."""

from __future__ import annotations

import pytest

from queryrl.rewards.scorers.toy import compute_score


@pytest.mark.parametrize(
    ("response", "target", "expected"),
    [
        ("hello world", "hello world", 1.0),
        ("  hello world \n", "hello world", 1.0),  # surrounding whitespace ignored
        ("abce", "abcd", 0.75),  # 3 matched chars: 2 * 3 / (4 + 4)
        ("hello", "hello world", 0.625),  # 2 * 5 / (5 + 11)
        ("xyz", "abc", 0.0),
        ("", "abc", 0.0),
    ],
)
def test_similarity(response: str, target: str, expected: float) -> None:
    assert compute_score("toy/target_string", response, target) == pytest.approx(expected)


def test_partial_credit_grows_towards_the_target() -> None:
    target = "the quick brown fox"
    scores = [compute_score("toy/target_string", target[:n], target) for n in (0, 5, 10, 19)]
    assert scores == sorted(scores)
    assert scores[0] == 0.0
    assert scores[-1] == 1.0
    assert 0.0 < scores[1] < 1.0
