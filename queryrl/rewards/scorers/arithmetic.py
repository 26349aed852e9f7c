"""The calculator-agent preset's reward: the final number of the answer, and how the tool was used.

The response the scorer reads is the policy's own tokens (``response_mask`` 1): tool outputs
and forced prefixes are not in it, so copying the calculator's result counts only when the
policy writes the number itself.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _same(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return a == b


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    partial_credit: float = 0.5,
    free_calls: int = 1,
    call_penalty: float = 0.1,
    require_tool: bool = True,
) -> dict[str, float]:
    """Score an arithmetic answer given with (or without) the calculator.

    ``correct`` is 1 when the last number in `solution_str` equals `ground_truth`, otherwise
    ``partial_credit * difflib ratio`` of the two digit strings (0 without a number), so that
    a tiny model gets a gradient before its first exact hit. The score is ``correct`` minus
    ``call_penalty`` per tool call beyond ``free_calls`` (seed 001's efficiency penalty), and
    0 when ``require_tool`` and ``extra_info["num_tool_calls"]`` is 0 (or missing).

    Returns:
        ``{"score", "correct", "num_tool_calls"}`` (the extra keys are logged as ``reward/<key>/mean``).
    """
    info = extra_info or {}
    calls = int(info.get("num_tool_calls", 0) or 0)
    truth = str(ground_truth).strip()
    numbers = _NUMBER.findall(solution_str)
    if not numbers:
        correct = 0.0
    elif _same(numbers[-1], truth):
        correct = 1.0
    else:
        correct = partial_credit * difflib.SequenceMatcher(None, numbers[-1], truth).ratio()
    score = correct - call_penalty * max(0, calls - free_calls)
    if require_tool and calls == 0:
        score = 0.0
    return {"score": score, "correct": float(correct == 1.0), "num_tool_calls": float(calls)}
