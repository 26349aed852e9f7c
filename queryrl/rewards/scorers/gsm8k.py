"""GSM8K answer scoring, with verl's semantics (``verl/utils/reward_score/gsm8k.py``).

The answer is the number after ``#### `` (strict, which also checks the model's format) or the
last number in the text (flexible). Only the last 300 characters are searched, as in verl.

The comparison is a *string* compare, exactly as verl does it, so these quirks are kept on
purpose (a model trained here scores the same as under verl):

- ``"#### 72.0"`` against ``"72"`` is wrong (``"72.0" != "72"``);
- ``"#### 72."`` extracts ``"72."`` (the class ``[0-9.,]`` takes the sentence's full stop),
  which is wrong against ``"72"``;
- strict removes ``,`` from the answer (``"#### 1,234"`` -> ``"1234"``); flexible does not;
- ``"#### $72"`` finds nothing: the pattern needs a digit or ``-`` right after ``#### ``, so
  strict's removal of ``$`` never changes anything (kept because verl has it).

Two differences, both where verl's result is an accident:

- a non-string ``ground_truth`` (e.g. ``72`` read as an int) is compared as ``str(ground_truth)``;
  verl would score every answer against it as wrong;
- flexible on a text whose only "numbers" are lone ``.`` finds no answer (reward 0); verl
  returns ``"."`` as the answer (reward `format_score`). Same reward when ``format_score=0``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

_SOLUTION_CLIP_CHARS = 300  # verl searches only the tail: regexes on long outputs are slow
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_NOT_A_NUMBER = ("", ".")

Method = Literal["strict", "flexible"]


def extract_solution(solution_str: str, method: Method = "strict") -> str | None:
    """The final answer in `solution_str`, or None when there is none.

    Args:
        solution_str: the model's response.
        method: ``"strict"``: the last ``#### <number>``, with ``,`` and ``$`` removed;
            ``"flexible"``: the last number anywhere, as written (commas kept), skipping a lone ``.``.

    Returns:
        The answer string, searched for in the last 300 characters only.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"unknown gsm8k extraction method {method!r}; valid: 'strict', 'flexible'")
    tail = solution_str[-_SOLUTION_CLIP_CHARS:]
    if method == "strict":
        matches: list[str] = _STRICT.findall(tail)
        return matches[-1].replace(",", "").replace("$", "") if matches else None
    candidates: list[str] = _FLEXIBLE.findall(tail)
    for candidate in reversed(candidates):
        if candidate not in _NOT_A_NUMBER:
            return candidate
    # Here verl's loop falls through and returns the last candidate it looked at (a lone ".");
    # we say "no answer" instead. It matters only with format_score != 0.
    return None


def compute_score(
    solution_str: str,
    ground_truth: Any,
    method: Method = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """GSM8K reward: `score` for the right answer, `format_score` for a wrong one, 0 for none.

    Reference: Trung et al., "ReFT: Reasoning with Reinforced Fine-Tuning", ACL 2024 (arXiv:2401.08967).

    Args:
        solution_str: the model's response.
        ground_truth: the reference answer, e.g. ``"72"`` (compared as a string).
        method: see :func:`extract_solution`.
        format_score: the reward for an answer that was found but is wrong.
        score: the reward for the right answer.
    """
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    truth = ground_truth if isinstance(ground_truth, str) else str(ground_truth)
    return float(score) if answer == truth else float(format_score)
