"""The ``dapo`` reward manager: the per-sample score plus DAPO's soft overlong penalty (verl's)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

from queryrl.rewards.functions import RewardError, RewardFn
from queryrl.rewards.manager import InProcessManager, RewardInput, RewardResult, score_each

logger = logging.getLogger(__name__)


def overlong_penalty(
    response_length: int, max_response_length: int, overlong_buffer_len: int, penalty_factor: float
) -> float:
    """DAPO's soft overlong punishment (arXiv:2503.14476, §3.4, Eq. 13), as verl's DAPORewardManager computes it.

    With ``L = max_response_length`` and buffer ``B``, a response up to ``L - B`` tokens is not
    penalised; past that the penalty falls linearly, reaching ``-penalty_factor`` at ``L``::

        exceed = response_length - (L - B)
        penalty = min(-exceed / B * penalty_factor, 0)

    Returns 0 when ``B <= 0`` (the penalty is off).
    """
    if overlong_buffer_len <= 0:
        return 0.0
    exceed = response_length - (max_response_length - overlong_buffer_len)
    return min(-exceed / overlong_buffer_len * penalty_factor, 0.0)


class DAPORewardManager(InProcessManager):
    """verl's ``dapo``: the ``naive`` score plus :func:`overlong_penalty` of the response length.

    Uses ``overlong_buffer_len`` (``B``; 0 turns the penalty off), ``overlong_penalty_factor`` and
    ``max_response_length`` (``L``, response tokens). Needs :attr:`RewardInput.response_length`.

    Extra values (logged as ``reward/<key>/mean``), as verl's ``reward_extra_info``: ``acc``, the
    unpenalised score (the function's own ``acc`` where its dict has one); and, when the penalty is
    on, ``overlong_reward`` (the penalty, <= 0) and ``overlong`` (1 when penalised, else 0). A
    failed sample stays failed (no penalty is added to nothing). A TRL-style function is called once
    per call (:func:`score_each`).
    """

    name = "dapo"

    def __init__(
        self,
        fn: RewardFn,
        kwargs: Mapping[str, Any] | None = None,
        *,
        overlong_buffer_len: int = 0,
        overlong_penalty_factor: float = 1.0,
        max_response_length: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(fn, kwargs, **options)
        if overlong_buffer_len < 0:
            raise RewardError(f"reward.overlong_buffer_len must be >= 0, got {overlong_buffer_len}")
        if overlong_buffer_len > 0 and max_response_length <= 0:
            raise RewardError("the dapo overlong penalty needs max_response_length (response tokens) > 0")
        if overlong_buffer_len > max_response_length > 0:
            warnings.warn(
                f"reward.overlong_buffer_len ({overlong_buffer_len}) > max_response_length ({max_response_length}): "
                "every response is penalised",
                stacklevel=2,
            )
        self.overlong_buffer_len = overlong_buffer_len
        self.overlong_penalty_factor = overlong_penalty_factor
        self.max_response_length = max_response_length
        self._warned_no_length = False

    def _score_all(self, inputs: list[RewardInput]) -> list[RewardResult]:
        results = score_each(self.fn, inputs, self.kwargs, self._loop)
        on = self.overlong_buffer_len > 0
        if on and inputs and all(x.response_length <= 0 for x in inputs) and not self._warned_no_length:
            self._warned_no_length = True
            logger.warning("dapo: every RewardInput.response_length is 0, so the overlong penalty never applies")
        for x, r in zip(inputs, results, strict=True):
            if r.score is None:
                continue
            r.extra.setdefault("acc", r.score)
            if on:
                penalty = overlong_penalty(
                    x.response_length, self.max_response_length, self.overlong_buffer_len, self.overlong_penalty_factor
                )
                r.score += penalty
                r.extra["overlong_reward"] = penalty
                r.extra["overlong"] = float(penalty < 0)
        return results
