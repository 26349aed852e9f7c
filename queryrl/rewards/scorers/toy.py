"""The toy preset's reward: how close the response is to a target string.

Partial outputs get partial credit, so a tiny model learns from the first step instead of
waiting for an exact hit.
"""

from __future__ import annotations

import difflib
from typing import Any


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> float:
    """Similarity in [0, 1] between the stripped response and the target; 1.0 for an exact match.

    The similarity is ``difflib.SequenceMatcher(None, response, target).ratio()``:
    ``2 * matched_chars / (len(response) + len(target))``.

    Args:
        data_source: unused (the verl contract passes it).
        solution_str: the model's response; surrounding whitespace is ignored.
        ground_truth: the target string (a non-string is compared as ``str(ground_truth)``).
        extra_info: unused.
    """
    target = ground_truth if isinstance(ground_truth, str) else str(ground_truth)
    return difflib.SequenceMatcher(None, solution_str.strip(), target).ratio()
