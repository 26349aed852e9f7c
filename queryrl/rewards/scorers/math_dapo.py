"""DAPO's math scorer: +1 when the answer after the last ``Answer:`` matches the reference, else -1.

The same numbers as verl's ``verl/utils/reward_score/math_dapo.py`` (the scorer of DAPO, arXiv:2503.14476,
whose rule-based reward is ``1`` if the answer is equivalent to the reference, else ``-1``, Eq. 11),
which adapts the Minerva answer normalisation (Lewkowycz et al., arXiv:2206.14858; lm-evaluation-harness's
``hendrycks_math``). verl routes ``data_source`` ``math_dapo``, ``math``, ``math_dapo_reasoning`` and
every name starting with ``aime`` here, and so does :func:`queryrl.rewards.functions.default_compute_score`.

Only the last 300 characters of the response are read. By default (Minerva): the answer is the text
after the last ``Answer:`` (case-insensitive) up to the end of its line (``[INVALID]`` when there is
none); both it and the reference go through :func:`normalize_final_answer` and are compared as strings.
Where there is no ``Answer:`` line, verl 0.9.1 falls back to the content of the last ``\\boxed{...}`` in
the last 100 characters, compared with the reference as it is (not normalised); and so does this one.
With ``strict_box_verify``: only that boxed content counts (``pred`` None when there is no box). The
result is verl's dict: ``{"score": 1.0 | -1.0, "acc": bool, "pred": str | None}``.
"""

from __future__ import annotations

import re
from typing import Any

ANSWER_PATTERN = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
INVALID = "[INVALID]"
# verl's (Minerva's) lists, applied in this order
SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
REMOVED_EXPRESSIONS = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
)
# (pattern, replacement), in order: keep the first $...$, unwrap \text{} \textbf{} \overline{} \boxed{},
# then spell out the short TeX forms \fracab -> \frac{a}{b} and \sqrta -> \sqrt{a}
_REWRITES = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$"),
        (r"(\\text\{)(.*?)(\})", "\\2"),
        (r"(\\textbf\{)(.*?)(\})", "\\2"),
        (r"(\\overline\{)(.*?)(\})", "\\2"),
        (r"(\\boxed\{)(.*)(\})", "\\2"),
        (r"(frac)([^{])(.)", "frac{\\2}{\\3}"),
        (r"(sqrt)([^{])", "sqrt{\\2}"),
    )
)


def normalize_final_answer(answer: str) -> str:
    """Minerva's normalisation of a final answer (verl's ``normalize_final_answer``, same output).

    The right-hand side of the last ``=``; units and filler words removed; TeX wrappers unwrapped;
    ``$`` dropped; commas dropped from a number that is digits and commas only.
    """
    answer = answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expression in REMOVED_EXPRESSIONS:
        answer = answer.replace(expression, "")
    for pattern, replacement in _REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in `text` (braces balanced), or None (none, or unclosed)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if text[i] == "}" and depth == 0:
            return text[start + len("\\boxed{") : i]
    return None


def compute_score(solution_str: str, ground_truth: Any, strict_box_verify: bool = False) -> dict[str, Any]:
    """Score a response as verl's ``math_dapo.compute_score`` does (see the module doc).

    Args:
        solution_str: the response.
        ground_truth: the reference answer (a string; another value is compared as its ``str``).
        strict_box_verify: read the last ``\\boxed{}`` instead of ``Answer:``.

    Returns:
        ``{"score": 1.0 if correct else -1.0, "acc": correct, "pred": the extracted answer}``.
    """
    tail = solution_str[-300:]  # verl: the longest answer in MATH-500 has 159 characters
    truth = str(ground_truth)
    pred: str | None
    if strict_box_verify:
        pred = last_boxed(tail[-100:])  # None without a box, as verl 0.9.1
        correct = pred is not None and pred == truth
    else:
        matches = ANSWER_PATTERN.findall(tail)
        pred = normalize_final_answer(matches[-1] if matches else INVALID)
        correct = pred == normalize_final_answer(truth)
        boxed = last_boxed(tail[-100:]) if pred == INVALID else None
        if boxed is not None:  # verl 0.9.1: no `Answer:` line, the last \boxed{} of the last 100 characters
            pred, correct = boxed, boxed == truth
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
