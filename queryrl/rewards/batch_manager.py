"""The ``batch`` reward manager: one call of the batch form of the reward function per call (verl's)."""

from __future__ import annotations

import inspect

from queryrl.rewards.manager import (
    BatchScorer,
    InProcessManager,
    RewardInput,
    RewardResult,
    failure,
    to_result,
)


class BatchRewardManager(InProcessManager):
    """Calls the batch form of the function once per call (verl's ``BatchRewardManager``). Uses no options.

    ``fn(data_sources=[...], solution_strs=[...], ground_truths=[...], extra_infos=[...], **kwargs)``
    returns one ``float | dict`` per input, each checked by :func:`to_result`. An exception, or a
    return of the wrong length, fails every sample of the call with an error saying so. It may be
    ``async def``. A TRL-style function (a :class:`BatchScorer`, itself a batch form) is called as such.
    """

    name = "batch"

    def _score_all(self, inputs: list[RewardInput]) -> list[RewardResult]:
        if not inputs:
            return []
        if isinstance(self.fn, BatchScorer):
            return self.fn.score_batch(inputs, self.kwargs, self._loop)
        try:
            values = self.fn(
                data_sources=[x.data_source for x in inputs],
                solution_strs=[x.solution_str for x in inputs],
                ground_truths=[x.ground_truth for x in inputs],
                extra_infos=[x.extra_info for x in inputs],
                **self.kwargs,
            )
            if inspect.isawaitable(values):
                values = self._loop.run(values)
            values = list(values)
        except Exception as e:
            reason = f"the batch reward function raised {type(e).__name__}: {e}"
            return [failure(x.data_source, reason) for x in inputs]
        if len(values) != len(inputs):
            reason = f"the batch reward function returned {len(values)} values for {len(inputs)} inputs"
            return [failure(x.data_source, reason) for x in inputs]
        return [to_result(v, x.data_source) for v, x in zip(values, inputs, strict=True)]
