"""Reward managers: call the reward function on a batch of responses and check what comes back.

A manager turns ``list[RewardInput]`` into ``list[RewardResult]``, one per input, in order.
A sample whose reward fails (the function raises, returns None, NaN, a non-number, or a dict
without ``"score"``; in the ``parallel`` and ``async`` managers also: it timed out or killed its
worker process) gets ``score=None`` and an error string saying why: the trainer drops it from
the update and counts it in ``reward/failed``. It is never silently scored 0.

Every manager has the same interface (:class:`RewardManager`)::

    pending = manager.submit(inputs)   # starts the work; returns at once where the manager can
    ...                                # work in the background (parallel, async)
    results = pending.result()         # blocks until every sample is done, in input order
    results = manager.score(inputs)    # the same as submit(inputs).result()
    metrics = manager.pop_metrics()    # reward/retries, reward/timeouts, ... since the last pop
    manager.close()                    # or: with make_reward_manager(...) as manager: ...

The trainer submits as soon as responses exist and collects later, so reward latency (a process
pool, an API judge) overlaps the rest of the step.

Managers are looked up by name in :data:`REWARD_MANAGERS` (``reward.manager``); verl's family,
each with the options it uses:

- ``naive`` (here): one sample after another, in this process. No options.
- ``batch`` (:mod:`queryrl.rewards.batch_manager`): one call of the batch form
  ``fn(data_sources=[...], solution_strs=[...], ...)`` per call. No options.
- ``dapo`` (:mod:`queryrl.rewards.dapo_manager`): ``naive`` plus DAPO's overlong penalty.
  ``overlong_buffer_len``, ``overlong_penalty_factor``, ``max_response_length``.
- ``parallel`` (:mod:`queryrl.rewards.parallel`): worker processes; a timeout or a crash fails only
  its sample, and the pool lives on. ``num_workers``, ``timeout_s``.
- ``async`` (:mod:`queryrl.rewards.async_manager`): a background event loop for API judges; bounded
  concurrency, rate limit, timeout, retries. ``max_concurrency``, ``requests_per_minute``,
  ``timeout_s``, ``max_retries``.

A TRL-style function (:mod:`queryrl.rewards.trl_style`) is called once per :meth:`submit` under
``naive``, ``batch`` and ``dapo`` (same thing: one in-process call; ``dapo`` adds its penalty) and
``async`` (the call is one request: timeout, retries and rate limit apply to it); ``parallel``, which
runs one sample per worker process, refuses it when built.

Every one is built as ``cls(fn, kwargs, **options)`` where ``options`` are the fields of
:class:`queryrl.config.RewardConfig` named in :data:`MANAGER_OPTIONS` (plus
``max_response_length``, the data's, in response tokens); a manager ignores the options it does
not use, and an option outside that set is an error (a typo is not silently ignored).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

from queryrl.registry import Registry, RegistryError
from queryrl.rewards.functions import RewardError, RewardFn

logger = logging.getLogger(__name__)

# The settings a manager may be given (RewardConfig's fields, and the data's max_response_length).
MANAGER_OPTIONS = frozenset(
    {
        "num_workers",
        "timeout_s",
        "max_concurrency",
        "requests_per_minute",
        "max_retries",
        "overlong_buffer_len",
        "overlong_penalty_factor",
        "max_response_length",
    }
)


@dataclass
class RewardInput:
    """One response to score, with what the verl contract passes alongside it.

    ``response_length`` is the response's length in tokens (used by ``dapo``; 0 when unknown).
    ``row`` (the data row: ``prompt`` and the other columns), ``completion_ids`` (the response's trained
    token ids), ``step`` (the training step; None outside training or when unknown) and ``progress``
    (``max_steps``, ``epoch``, ``num_train_epochs``) are what a TRL-style function gets besides
    (:mod:`queryrl.rewards.trl_style`); the verl contract ignores them.
    """

    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    response_length: int = 0
    row: Mapping[str, Any] = field(default_factory=dict)
    completion_ids: Sequence[int] = ()
    step: int | None = None
    # where training stands (max_steps, epoch, num_train_epochs), for a TRL-style function's trainer_state
    progress: Mapping[str, Any] | None = None
    group: int | None = None  # the prompt this response answers (its GRPO group) in the batch; None: unknown


# the extra value a reward returns beside its score for algo.adv_estimator=grpo_reference: what a reference's own
# response to the sample's prompt scores under the same reward (queryrl.trainer.scoring.reference_baselines)
REFERENCE_SCORE = "reference_score"


@dataclass
class RewardResult:
    """The reward of one response.

    Attributes:
        score: the reward; None when scoring failed (the sample is dropped, not scored 0); NaN when the
            sample is unscored (:attr:`unscored`).
        extra: further numeric values the function returned in its dict (finite only): averaged into
            the step's ``reward/<key>/mean`` metrics.
        info: the dict's other values (strings, lists, dicts: an extracted answer, the documents a RAG
            service retrieved, a judge's verdict), as verl keeps them in ``reward_extra_info``: not
            metrics, but written with the sample to ``samples/step_N.jsonl`` for a person to read.
        error: why scoring failed, naming the data source; None on success.
        unscored: TRL's "no function scored this sample" (every TRL-style function returned None or NaN for
            it): not a failure. The sample stays in the batch with a NaN score, is left out of its group's
            baseline and gets advantage 0, as TRL 1.16's ``GRPOTrainer`` does (``reward/unscored`` counts them).
        stop: a failure that ends the run rather than the sample (the trainer raises
            :class:`~queryrl.trainer.skips.RewardFunctionRaised` with `error`).
    """

    score: float | None
    extra: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    unscored: bool = False
    stop: bool = False  # the error ends the run (an exception in a TRL-style function: TRL raises it)

    @property
    def failed(self) -> bool:
        return self.score is None


def unscored_result() -> RewardResult:
    """A sample that no reward function scored (TRL's all-None row): NaN score, kept, advantage 0."""
    return RewardResult(score=math.nan, unscored=True)


class PendingRewards:
    """The rewards of one :meth:`RewardManager.submit`, possibly still being computed.

    Args:
        futures: one future per input, in input order.
        data_sources: the inputs' data sources (to name them in errors).
    """

    def __init__(self, futures: Sequence[Future[RewardResult]], data_sources: Sequence[str]) -> None:
        if len(futures) != len(data_sources):
            raise ValueError(f"{len(futures)} futures for {len(data_sources)} inputs")
        self._futures = list(futures)
        self._data_sources = list(data_sources)
        self._results: list[RewardResult] | None = None

    @classmethod
    def completed(cls, results: Sequence[RewardResult], data_sources: Sequence[str]) -> PendingRewards:
        """A handle whose results are already there (what the in-process managers return)."""
        futures: list[Future[RewardResult]] = []
        for r in results:
            f: Future[RewardResult] = Future()
            f.set_result(r)
            futures.append(f)
        return cls(futures, data_sources)

    def __len__(self) -> int:
        return len(self._futures)

    def done(self) -> bool:
        """True when every sample has its result (scored or failed)."""
        return all(f.done() for f in self._futures)

    def result(self, timeout: float | None = None) -> list[RewardResult]:
        """Wait for every sample and return the results in input order.

        Raises:
            TimeoutError: `timeout` seconds passed first (the work goes on; call again).
        """
        if self._results is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            for f in self._futures:
                try:  # waits; unlike futures.wait, also ends for a future cancelled without notice
                    f.exception(None if deadline is None else max(0.0, deadline - time.monotonic()))
                except CancelledError:
                    pass
                except TimeoutError:
                    left = sum(not g.done() for g in self._futures)
                    raise TimeoutError(f"{left} of {len(self._futures)} rewards not done after {timeout} s") from None
            self._results = [self._unwrap(f, ds) for f, ds in zip(self._futures, self._data_sources, strict=True)]
            _log_failures(self._results)
        return list(self._results)

    @staticmethod
    def _unwrap(future: Future[RewardResult], data_source: str) -> RewardResult:
        try:
            return future.result()
        except CancelledError:
            return failure(data_source, "cancelled: the reward manager was closed before it was scored")
        except Exception as e:  # a bug in a manager, not in the reward function; still one failed sample
            return failure(data_source, f"{type(e).__name__}: {e}")


class RewardManager(Protocol):
    """What the trainer calls: one result per input, in order."""

    def submit(self, inputs: list[RewardInput]) -> PendingRewards: ...

    def score(self, inputs: list[RewardInput]) -> list[RewardResult]: ...

    def pop_metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


REWARD_MANAGERS: Registry[Callable[..., RewardManager]] = Registry("reward manager")


def as_number(value: Any) -> float | None:
    """`value` as a float if it is a real number (numpy and 0-d torch scalars included), else None."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, numbers.Real):  # bool and numpy floats included; str is not
        return float(value)
    return None


def failure(data_source: str, reason: str) -> RewardResult:
    """A failed result whose error names the data source."""
    return RewardResult(score=None, error=f"reward for data_source={data_source!r} failed: {reason}")


def to_result(value: Any, data_source: str) -> RewardResult:
    """Check what a reward function returned and turn it into a :class:`RewardResult`.

    A number is the score; a dict must carry a numeric ``"score"``, its other finite numeric values
    go to ``extra`` and its other values but None and non-finite numbers (e.g. the extracted answer)
    to ``info``. A missing, non-numeric or non-finite score is a failure.
    """
    extra: dict[str, float] = {}
    info: dict[str, Any] = {}
    raw = value
    if isinstance(value, Mapping):
        if "score" not in value:
            return failure(data_source, f"returned a dict without 'score' (keys: {sorted(map(str, value))})")
        raw = value["score"]
        for key, item in value.items():
            number = as_number(item)
            if key == "score" or item is None:
                continue
            if number is None:
                info[str(key)] = item
            elif math.isfinite(number):
                extra[str(key)] = number
    score = as_number(raw)
    if score is None:
        return failure(data_source, f"score is {raw!r} ({type(raw).__name__}), not a number")
    if not math.isfinite(score):
        return failure(data_source, f"score is {score}, not a finite number")
    return RewardResult(score=score, extra=extra, info=info)


def _log_failures(results: list[RewardResult]) -> None:
    errors = [r.error for r in results if r.failed]
    if errors:
        logger.warning("%d of %d rewards failed; first: %s", len(errors), len(results), errors[0])


def check_options(manager: str, options: Mapping[str, Any]) -> None:
    """Refuse options no manager knows (a typo must not be ignored silently).

    Raises:
        RewardError: an option outside :data:`MANAGER_OPTIONS`.
    """
    unknown = sorted(set(options) - MANAGER_OPTIONS)
    if unknown:
        raise RewardError(
            f"unknown option(s) {', '.join(unknown)} for the {manager!r} reward manager; "
            f"valid: {', '.join(sorted(MANAGER_OPTIONS))}"
        )


class LoopRunner:
    """Runs awaitables to completion on one event loop it owns and reuses.

    The loop is created on first use and closed by :meth:`close` (a later use makes a new one), so
    clients bound to a loop keep working across calls. It must not be used from a thread that is
    already running an event loop.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, awaitable: Awaitable[Any]) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # no loop running in this thread: ours can run
        else:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never awaited; close it so Python does not warn
            raise RewardError(
                "an async reward function cannot run under a synchronous manager inside a running event loop "
                "(use reward.manager=async)"
            )
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(awaitable)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        self._loop = None


@runtime_checkable
class BatchScorer(Protocol):
    """A reward function scored a batch at a time (TRL-style: :class:`.trl_style.TRLRewardFunction`).

    :meth:`score_batch` returns one result per input, in order; it fails samples rather than raise.
    """

    def score_batch(
        self, inputs: Sequence[RewardInput], kwargs: Mapping[str, Any], loop: LoopRunner
    ) -> list[RewardResult]: ...


def score_each(
    fn: RewardFn, inputs: list[RewardInput], kwargs: Mapping[str, Any], loop: LoopRunner
) -> list[RewardResult]:
    """Score `inputs` in this thread: one call of a :class:`BatchScorer`, else one call per input."""
    if isinstance(fn, BatchScorer):
        return fn.score_batch(inputs, kwargs, loop)
    return [score_sample(fn, x, kwargs, loop) for x in inputs]


def call_reward_fn(fn: RewardFn, x: RewardInput, kwargs: Mapping[str, Any]) -> Any:
    """Call `fn` on one input by the verl contract (keyword arguments; `kwargs` appended)."""
    return fn(
        data_source=x.data_source,
        solution_str=x.solution_str,
        ground_truth=x.ground_truth,
        extra_info=x.extra_info,
        **kwargs,
    )


def score_sample(fn: RewardFn, x: RewardInput, kwargs: Mapping[str, Any], loop: LoopRunner) -> RewardResult:
    """Score one input in this thread: an exception or a bad return value is a failed result.

    A :class:`BatchScorer` scores it as a batch of one.
    """
    if isinstance(fn, BatchScorer):
        return fn.score_batch([x], kwargs, loop)[0]
    try:
        value = call_reward_fn(fn, x, kwargs)
        if inspect.isawaitable(value):
            value = loop.run(value)
    except Exception as e:
        return failure(x.data_source, f"{type(e).__name__}: {e}")
    return to_result(value, x.data_source)


class InProcessManager:
    """What the synchronous managers share: the function, its kwargs, an event loop, the interface.

    Subclasses implement :meth:`_score_all`; :meth:`submit` computes at once and returns a
    completed :class:`PendingRewards`.
    """

    name = "?"

    def __init__(self, fn: RewardFn, kwargs: Mapping[str, Any] | None = None, **options: Any) -> None:
        check_options(self.name, options)
        self.fn = fn
        self.kwargs = dict(kwargs or {})
        self._loop = LoopRunner()

    def _score_all(self, inputs: list[RewardInput]) -> list[RewardResult]:
        raise NotImplementedError

    def submit(self, inputs: list[RewardInput]) -> PendingRewards:
        return PendingRewards.completed(self._score_all(inputs), [x.data_source for x in inputs])

    def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        return self.submit(inputs).result()

    def pop_metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Close the event loop (if one was made); the manager makes a new one if used again."""
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(InProcessManager):
    """Scores one sample after another in this process (verl's ``naive``). Uses no options.

    An ``async def`` reward function is awaited on an event loop the manager owns and reuses
    (see :class:`LoopRunner`). A TRL-style function (a :class:`BatchScorer`) is called once per call.

    Args:
        fn: the reward function (see :mod:`queryrl.rewards.functions`).
        kwargs: extra keyword arguments for every call (``reward.kwargs``).
    """

    name = "naive"

    def _score_all(self, inputs: list[RewardInput]) -> list[RewardResult]:
        return score_each(self.fn, inputs, self.kwargs, self._loop)


# the managers of other modules (each imports this one), imported when chosen
REWARD_MANAGERS.register_lazy("batch", "queryrl.rewards.batch_manager:BatchRewardManager")
REWARD_MANAGERS.register_lazy("dapo", "queryrl.rewards.dapo_manager:DAPORewardManager")
REWARD_MANAGERS.register_lazy("parallel", "queryrl.rewards.parallel:ParallelRewardManager")
REWARD_MANAGERS.register_lazy("async", "queryrl.rewards.async_manager:AsyncRewardManager")


def registered_managers() -> Registry[Callable[..., RewardManager]]:
    """:data:`REWARD_MANAGERS` (every manager's name; the other modules' are imported when chosen)."""
    return REWARD_MANAGERS


def make_reward_manager(
    name: str, fn: RewardFn, kwargs: Mapping[str, Any] | None = None, **options: Any
) -> RewardManager:
    """Build the manager registered as `name` (``reward.manager``); an unknown name lists the valid ones.

    Args:
        name: the registered manager name: ``naive``, ``batch``, ``dapo``, ``parallel``, ``async``.
        fn: the reward function, e.g. from :func:`queryrl.rewards.load_reward_function`.
        kwargs: keyword arguments for every call of `fn` (``reward.kwargs``).
        **options: settings of the manager (see :data:`MANAGER_OPTIONS`); each manager uses the
            ones it needs and ignores the rest.
    """
    try:
        cls = registered_managers().get(name)
    except RegistryError as e:
        raise RewardError(f"{e} (reward.manager)") from None
    return cls(fn, kwargs or {}, **options)


def summarize(results: list[RewardResult]) -> dict[str, float]:
    """Metrics for a batch: ``reward/failed`` (count), ``reward/unscored`` (count, where some sample is
    unscored) and ``reward/<key>/mean`` per extra key.

    Each mean is over the samples that returned that key.
    """
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for r in results:
        for key, value in r.extra.items():
            sums[key] += value
            counts[key] += 1
    metrics = {"reward/failed": float(sum(r.failed for r in results))}
    unscored = sum(r.unscored for r in results)
    if unscored:
        metrics["reward/unscored"] = float(unscored)
    metrics.update({f"reward/{key}/mean": sums[key] / counts[key] for key in sorted(sums)})
    return metrics
