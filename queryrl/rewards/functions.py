"""Reward functions: the verl contract, the built-in scorers, and loading one from a file.

The contract (verl's, so reward files move between the two)::

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict

A dict carries ``"score"`` plus extra numeric values (logged as ``reward/<key>/mean``). The
function may be ``async def``. ``kwargs`` are ``reward.kwargs`` from the config.

TRL's contract, ``def reward(prompts, completions, **kwargs) -> list[float | None]``, is taken too
(``reward.function.style``; :mod:`queryrl.rewards.trl_style`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from queryrl.rewards.scorers import arithmetic, gsm8k, math_dapo, toy
from queryrl.rewards.scorers import code as code_reward
from queryrl.rewards.scorers import math as math_reward

RewardFn = Callable[..., Any]  # the contract above; returns float | dict, or an awaitable of one

CUSTOM_REWARD_HINT = (
    "to score it with your own function, point at a file: "
    "reward.function.path=my_reward.py reward.function.name=compute_score "
    "(verl's custom_reward_function.path / custom_reward_function.name are accepted too)"
)


class RewardError(ValueError):
    """A reward function that cannot be found, loaded or routed to."""


def _gsm8k(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None, **kwargs: Any) -> float:
    return gsm8k.compute_score(solution_str, ground_truth, **kwargs)  # kwargs: method, format_score, score


def _toy(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None, **kwargs: Any) -> float:
    return toy.compute_score("toy/target_string", solution_str, ground_truth, extra_info, **kwargs)


def _math_dapo(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None, **kwargs: Any) -> Any:
    return math_dapo.compute_score(solution_str, ground_truth, **kwargs)  # kwargs: strict_box_verify


def _math(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None, **kwargs: Any) -> float:
    return math_reward.compute_score(solution_str, ground_truth, **kwargs)  # kwargs: timeout_s, use_math_verify


def _code(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None, **kwargs: Any) -> float:
    # kwargs: all_or_nothing, timeout_s, memory_mb, isolation
    return code_reward.compute_score("code", solution_str, ground_truth, extra_info, **kwargs)


def _arithmetic(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None, **kwargs: Any) -> Any:
    # kwargs: partial_credit, free_calls, call_penalty, require_tool
    return arithmetic.compute_score("arithmetic/tool", solution_str, ground_truth, extra_info, **kwargs)


# data_source -> scorer. verl routes "openai/gsm8k"; the bare "gsm8k" is a common spelling.
# The MATH, DAPO and code names are verl's (default_compute_score), plus bare "leetcode", "code".
# As in verl, the bare "math" is DAPO's scorer (+-1, the answer after "Answer:"), not the boxed MATH one.
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
MATH_DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")  # and every name starting with "aime"
CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco", "leetcode", "code")
BUILTIN_SCORERS: dict[str, Callable[..., Any]] = {
    "openai/gsm8k": _gsm8k,
    "gsm8k": _gsm8k,
    "toy/target_string": _toy,
    "arithmetic/tool": _arithmetic,
    **dict.fromkeys(MATH_SOURCES, _math),
    **dict.fromkeys(MATH_DAPO_SOURCES, _math_dapo),
    **dict.fromkeys(CODE_SOURCES, _code),
}


def builtin_scorer(data_source: str) -> Callable[..., Any] | None:
    """The built-in scorer :func:`default_compute_score` routes `data_source` to, or None. Each of them compares
    the response against the row's ``reward_model.ground_truth`` (a row without one is a data error)."""
    return BUILTIN_SCORERS.get(data_source) or (_math_dapo if data_source.startswith("aime") else None)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Score with the built-in scorer for `data_source` (verl's routing, where verl has the name).

    ``openai/gsm8k`` and ``gsm8k``: :func:`queryrl.rewards.scorers.gsm8k.compute_score` (strict unless
    ``reward.kwargs.method=flexible``); ``toy/target_string``: :func:`queryrl.rewards.scorers.toy.compute_score`;
    ``arithmetic/tool``: :func:`queryrl.rewards.scorers.arithmetic.compute_score` (uses ``num_tool_calls``);
    :data:`MATH_SOURCES` (``lighteval/MATH``, ``HuggingFaceH4/MATH-500``, ...):
    :func:`queryrl.rewards.scorers.math.compute_score` (last ``\\boxed{}``, symbolic equivalence);
    :data:`MATH_DAPO_SOURCES` (``math_dapo``, ``math``, ``math_dapo_reasoning``) and ``aime*``:
    :func:`queryrl.rewards.scorers.math_dapo.compute_score` (+1/-1, the answer after the last ``Answer:``; a dict
    with ``acc``), as verl routes them; :data:`CODE_SOURCES` (``codecontests``, ``apps``, ``taco``,
    ``leetcode``, ...): :func:`queryrl.rewards.scorers.code.compute_score` (the code runs against the tests in a
    sandbox). `kwargs` go to the scorer; one it does not take is an error, not silently ignored.

    Raises:
        RewardError: no built-in scorer for `data_source` (the message says how to use your own).
    """
    scorer = builtin_scorer(data_source)
    if scorer is None:
        raise RewardError(
            f"no built-in reward for data_source {data_source!r}; built-in data sources: "
            f"{', '.join(sorted(BUILTIN_SCORERS))}, aime* (as in verl, math, math_dapo and aime* are DAPO's "
            f"+-1 'Answer:' scorer; the boxed MATH scorer is {', '.join(MATH_SOURCES)}); {CUSTOM_REWARD_HINT}"
        )
    return scorer(solution_str, ground_truth, extra_info, **kwargs)
