"""GSM8K scoring: verl's extraction and string compare, quirks included."""

from __future__ import annotations

import pytest

from queryrl.rewards.scorers.gsm8k import compute_score, extract_solution


@pytest.mark.parametrize(
    ("text", "strict", "flexible"),
    [
        ("So the total is 1,234.\n#### 1,234", "1234", "1,234"),  # strict drops commas, flexible keeps them
        ("It costs $72.\n#### $72", None, "72"),  # "#### $" never matches strict's pattern
        ("She owes 5 dollars.\n#### -5", "-5", "-5"),
        ("#### 3\nwait, no\n#### 4", "4", "4"),  # the last #### wins
        ("#### 7 and then 8", "7", "8"),  # flexible: the last number anywhere
        ("The answer is 72.\n#### 72.", "72.", "72."),  # the full stop is part of the match
        ("no numbers here", None, None),
        ("It is 42 .", None, "42"),  # flexible skips the lone "."
        ("Done.", None, None),  # only a lone "." -> no answer
        ("", None, None),
    ],
)
def test_extract_solution(text: str, strict: str | None, flexible: str | None) -> None:
    assert extract_solution(text, "strict") == strict
    assert extract_solution(text, "flexible") == flexible


def test_only_the_last_300_characters_are_searched() -> None:
    answer = "#### 72"  # 7 characters
    fits = answer + "x" * 293  # 300 characters: nothing clipped
    assert extract_solution(fits, "strict") == "72"
    assert extract_solution(fits, "flexible") == "72"
    clipped = answer + "x" * 294  # 301: the first "#" is clipped, "### 72" is not strict's format
    assert extract_solution(clipped, "strict") is None
    assert extract_solution(clipped, "flexible") == "72"
    gone = answer + "x" * 300
    assert extract_solution(gone, "strict") is None
    assert extract_solution(gone, "flexible") is None


def test_compute_score_right_wrong_and_missing() -> None:
    assert compute_score("#### 1,234", "1234") == 1.0
    assert compute_score("#### 1,235", "1234") == 0.0
    assert compute_score("#### 1,235", "1234", format_score=0.1) == 0.1  # found but wrong
    assert compute_score("no answer", "1234", format_score=0.1) == 0.0  # nothing found
    assert compute_score("#### 1234", "1234", score=2.0) == 2.0


def test_string_compare_as_verl() -> None:
    # verl compares strings: equal numbers written differently are wrong
    assert compute_score("#### 72.0", "72") == 0.0
    assert compute_score("#### 72.", "72", format_score=0.1) == 0.1
    assert compute_score("The answer is 1,234", "1234", method="flexible") == 0.0
    assert compute_score("The answer is 1234", "1234", method="flexible") == 1.0


def test_non_string_ground_truth_is_compared_as_a_string() -> None:
    assert compute_score("#### 72", 72) == 1.0


def test_unknown_method() -> None:
    with pytest.raises(ValueError, match=r"'fuzzy'.*strict.*flexible"):
        extract_solution("#### 1", "fuzzy")  # type: ignore[arg-type]
