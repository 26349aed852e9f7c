"""The ``async`` reward manager: reward functions that call APIs (LLM judges, RAG services).

The manager owns one event loop, running in a thread of its own for the manager's lifetime, so
clients bound to a loop (httpx, openai) are reused across calls, and :meth:`submit` returns at
once: each sample becomes a task on that loop and its result arrives as its call finishes.

Per sample (one attempt = one request)::

    for attempt in 1 .. max_retries + 1:          # tenacity; backoff: full jitter, 2**n growth
        async with semaphore(max_concurrency):    # calls in flight at once
            await rate_limiter.acquire()          # requests_per_minute, a smooth token bucket
            value = await wait_for(fn(...), timeout_s)

An exception or a timeout is retried after an exponential backoff with jitter; after the last
attempt the sample fails with the error (``"timed out after 10 s; gave up after 3 attempts"``).
A function that returns a bad value (None, NaN, a dict without ``score``) is not retried: that
is a bug in the function, not a flaky API.

A synchronous function runs in a daemon thread per call (so a hung one never blocks the loop or
the interpreter's exit). A timeout abandons such a call but cannot stop its thread; for CPU-bound
or hang-prone synchronous functions use ``reward.manager=parallel``, which kills them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from queryrl.rewards.functions import RewardError, RewardFn
from queryrl.rewards.manager import (
    PendingRewards,
    RewardInput,
    RewardResult,
    check_options,
    failure,
    to_result,
)
from queryrl.rewards.trl_style import TRLRewardFunction

logger = logging.getLogger(__name__)


class RateLimiter:
    """A smooth token bucket of capacity one: each call reserves a start slot ``60 / requests_per_minute`` s
    after the one before and does not start before it.

    No bursts: a judge API that allows 600 requests a minute gets one every 0.1 s (a wake-up the machine
    delays shortens the gap to the next call, which keeps its slot; it never adds a call to a minute).
    Reserving a start time is atomic because only the manager's event loop calls :meth:`acquire`.

    Args:
        requests_per_minute: the rate; <= 0 turns the limiter off.
    """

    def __init__(self, requests_per_minute: float) -> None:
        self.interval = 60.0 / requests_per_minute if requests_per_minute > 0 else 0.0
        self._next_start = -float("inf")  # loop time before which no call may start

    async def acquire(self) -> None:
        if self.interval <= 0:
            return
        now = asyncio.get_running_loop().time()
        start = max(now, self._next_start)
        self._next_start = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)


class _CallTimeout(Exception):
    """One attempt ran past ``timeout_s``."""


class _GaveUp(Exception):
    """Every attempt of one call failed; the message says why."""


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if not future.done():  # a timed-out call's late result goes nowhere
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


def _in_thread(loop: asyncio.AbstractEventLoop, call: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run `call` in a new daemon thread; the returned future (of `loop`) gets its result."""
    future: asyncio.Future[Any] = loop.create_future()

    def target() -> None:
        value, error = None, None
        try:
            value = call()
        except BaseException as e:
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is closed: the manager was closed meanwhile
            loop.call_soon_threadsafe(_settle, future, value, error)

    threading.Thread(target=target, daemon=True, name="queryrl-reward-call").start()
    return future


def _fan_out(batch: Future[list[RewardResult]], n: int) -> list[Future[RewardResult]]:
    """One future per sample, each set from `batch`'s list when it is done (cancelled if it was)."""
    futures: list[Future[RewardResult]] = [Future() for _ in range(n)]

    def settle(done: Future[list[RewardResult]]) -> None:
        if done.cancelled():
            for f in futures:
                f.cancel()
            return
        error = done.exception()
        for i, f in enumerate(futures):
            if error is not None:
                f.set_exception(error)
            else:
                f.set_result(done.result()[i])

    batch.add_done_callback(settle)
    return futures


def _is_coroutine_function(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel what is still running on `loop`, stop it, join its thread and close it."""
    if loop.is_closed():
        return

    async def cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    if thread.is_alive():
        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=10.0)
        except Exception:
            logger.warning("the async reward manager's tasks did not cancel in time", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10.0)
    if not thread.is_alive():
        loop.close()


class AsyncRewardManager:
    """Scores samples concurrently on a background event loop, for API-bound reward functions.

    Uses ``max_concurrency``, ``requests_per_minute`` (0: no limit), ``timeout_s`` (per attempt;
    <= 0: none) and ``max_retries``; ignores the other options. The function may be ``async def``
    (awaited on the loop) or synchronous (run in a thread per call). A TRL-style function is called
    once per :meth:`submit`, and that call is the one request that is timed, retried and rate-limited.

    Metrics (:meth:`pop_metrics`, counts since the last pop): ``reward/retries`` (attempts that were
    retried) and ``reward/timeouts`` (attempts that timed out, retried or not).

    Args:
        fn: the reward function (the verl contract).
        kwargs: extra keyword arguments for every call (``reward.kwargs``).
        backoff_s: the backoff scale: the wait after failed attempt ``n`` (1-based) is uniform in
            ``[0, min(backoff_s * 2**(n - 1), max_backoff_s)]`` (full jitter).
        max_backoff_s: the longest wait between attempts.
    """

    def __init__(
        self,
        fn: RewardFn,
        kwargs: Mapping[str, Any] | None = None,
        *,
        max_concurrency: int = 16,
        requests_per_minute: float = 0.0,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        **options: Any,
    ) -> None:
        check_options("async", options)
        if max_concurrency < 1:
            raise RewardError(f"reward.max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise RewardError(f"reward.max_retries must be >= 0, got {max_retries}")
        self.fn = fn
        self.kwargs = dict(kwargs or {})
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._is_async = _is_coroutine_function(fn.fn if isinstance(fn, TRLRewardFunction) else fn)
        self._semaphore = asyncio.Semaphore(max_concurrency)  # binds to the loop on first use
        self._limiter = RateLimiter(requests_per_minute)
        self._counts_lock = threading.Lock()
        self._counts = {"reward/retries": 0.0, "reward/timeouts": 0.0}
        self._loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="queryrl-reward-loop")
        thread.start()
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, thread)

    def submit(self, inputs: list[RewardInput]) -> PendingRewards:
        """Start scoring `inputs` on the manager's loop and return at once.

        A TRL-style function gets one task for all of `inputs`; its results reach each sample's future.
        """
        if self._loop.is_closed():
            raise RewardError("the async reward manager is closed")
        if isinstance(self.fn, TRLRewardFunction):
            futures = _fan_out(
                asyncio.run_coroutine_threadsafe(self._score_batch(self.fn, inputs), self._loop), len(inputs)
            )
        else:
            futures = [asyncio.run_coroutine_threadsafe(self._score(x), self._loop) for x in inputs]
        return PendingRewards(futures, [x.data_source for x in inputs])

    def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        return self.submit(inputs).result()

    def pop_metrics(self) -> dict[str, float]:
        with self._counts_lock:
            metrics = dict(self._counts)
            self._counts = dict.fromkeys(metrics, 0.0)
        return metrics

    def close(self) -> None:
        """Cancel the calls still running (their samples fail as closed) and stop the loop. Idempotent."""
        self._finalizer()

    def __enter__(self) -> AsyncRewardManager:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- on the loop -------------------------------------------------------------------------------

    def _count(self, key: str) -> None:
        with self._counts_lock:
            self._counts[key] += 1

    def _before_retry(self, state: RetryCallState) -> None:
        self._count("reward/retries")

    async def _score(self, x: RewardInput) -> RewardResult:
        kwargs = {
            "data_source": x.data_source,
            "solution_str": x.solution_str,
            "ground_truth": x.ground_truth,
            "extra_info": x.extra_info,
            **self.kwargs,
        }
        try:
            value = await self._with_retries(self.fn, kwargs)
        except _GaveUp as e:
            return failure(x.data_source, str(e))
        return to_result(value, x.data_source)

    async def _score_batch(self, trl: TRLRewardFunction, inputs: list[RewardInput]) -> list[RewardResult]:
        """A TRL-style function's one call on `inputs`, as one request (timeout, retries, rate limit)."""
        if not inputs:
            return []
        try:
            value = await self._with_retries(trl.fn, trl.call_kwargs(inputs, self.kwargs))
        except (_GaveUp, RewardError) as e:
            return [failure(x.data_source, f"TRL-style reward function {trl.name}: {e}") for x in inputs]
        return trl.results(value, inputs)

    async def _with_retries(self, fn: RewardFn, kwargs: dict[str, Any]) -> Any:
        """``fn(**kwargs)`` with the retries of the module doc.

        Raises:
            _GaveUp: the last attempt failed too (the message says why and after how many attempts).
        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_random_exponential(multiplier=self.backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception_type(Exception),
            before_sleep=self._before_retry,
            reraise=True,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    value = await self._attempt(fn, kwargs)
        except Exception as e:
            reason = str(e) if isinstance(e, _CallTimeout) else f"{type(e).__name__}: {e}"
            raise _GaveUp(f"{reason}; gave up after {attempts} attempt(s)") from None
        return value

    async def _attempt(self, fn: RewardFn, kwargs: dict[str, Any]) -> Any:
        async with self._semaphore:
            await self._limiter.acquire()
            timeout = asyncio.timeout(self.timeout_s if self.timeout_s > 0 else None)
            try:
                async with timeout:
                    return await self._call(fn, kwargs)
            except TimeoutError:
                if not timeout.expired():
                    raise  # the function's own TimeoutError, not our deadline
                self._count("reward/timeouts")
                raise _CallTimeout(f"timed out after {self.timeout_s:g} s") from None

    async def _call(self, fn: RewardFn, kwargs: dict[str, Any]) -> Any:
        if self._is_async:
            value = fn(**kwargs)
        else:
            value = await _in_thread(asyncio.get_running_loop(), lambda: fn(**kwargs))
        if inspect.isawaitable(value):
            value = await value
        return value
