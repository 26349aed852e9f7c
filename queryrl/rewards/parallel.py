"""The ``parallel`` reward manager: a pool of worker processes that survives its reward function.

Each worker process runs the per-sample function (the verl contract) on one sample at a time. A
sample fails, with an error saying which, when its function

- raises (``"KeyError: ..."``, as in the other managers),
- runs past ``timeout_s`` (``"timed out after 2 s ..."``): the worker is killed and replaced, or
- kills its worker (``os._exit``, a signal, a segfault; ``"worker process crashed with exit
  code -11 (SIGSEGV)"``): the worker is replaced.

Other samples are unaffected, and the pool (same processes) is reused across calls while nothing
breaks. Crashes are detected exactly, not guessed: each worker has its own pipe and runs one
sample at a time, so the parent always knows which sample a worker held, and it watches both the
pipe (a result, or EOF) and the process sentinel (the process ended) with
:func:`multiprocessing.connection.wait`, with the nearest deadline as the wait's timeout.

Start method: ``forkserver`` (``spawn`` where it does not exist). The trainer process has torch
threads, CUDA contexts and tokenizer thread pools; ``fork`` from it copies locks held by threads
that do not exist in the child, and CUDA cannot be used after fork at all. A forkserver is a
fresh process, started by exec, that only imports modules (this one, hence ``queryrl.rewards``
and torch, with no torch op run, no CUDA and no thread pool started) and forks each worker from
that clean state: a new worker, including the replacement of a killed one, starts in
milliseconds instead of re-importing torch as under ``spawn``.

The reward function reaches the workers by name, never by value: a function loaded from a file by
:func:`queryrl.rewards.load_reward_function` is re-loaded there from its ``(path, name)``; any
other must be picklable by reference (a module-level function, e.g. the built-ins). Lambdas and
local functions are refused when the manager is built.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from queryrl.plugins import file_module_name
from queryrl.rewards.functions import RewardError, RewardFn
from queryrl.rewards.loading import load_reward_function
from queryrl.rewards.manager import (
    BatchScorer,
    LoopRunner,
    PendingRewards,
    RewardInput,
    RewardResult,
    check_options,
    failure,
    score_sample,
)

logger = logging.getLogger(__name__)

START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
STARTUP_TIMEOUT_S = 300.0  # a worker that has not loaded the function by then breaks the pool
READY = "ready"  # a worker's first message


@dataclass(frozen=True)
class FunctionRef:
    """How a worker process finds the reward function: a file and a name, or a pickle by reference."""

    path: str | None = None
    name: str = ""
    pickled: bytes = b""

    @classmethod
    def of(cls, fn: RewardFn) -> FunctionRef:
        """The reference to `fn`.

        Raises:
            RewardError: `fn` was not loaded from a file and is not importable by name.
        """
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        file = getattr(module, "__file__", None)
        if module is not None and file and module.__name__ == file_module_name(Path(file).resolve()):
            # made by load_reward_function: its module name exists only in this process
            name = next((k for k, v in vars(module).items() if v is fn), getattr(fn, "__name__", ""))
            return cls(path=file, name=name)
        try:
            return cls(pickled=pickle.dumps(fn))
        except Exception as e:
            raise RewardError(
                f"the parallel reward manager runs the reward function in worker processes, which import it "
                f"by name; {fn!r} cannot be ({type(e).__name__}: {e}). Use a module-level function, or load "
                "it from a file (reward.function.path)"
            ) from None

    def load(self) -> RewardFn:
        if self.path is not None:
            return load_reward_function(self.path, self.name)
        fn: RewardFn = pickle.loads(self.pickled)
        return fn


def _exit_with_parent() -> None:
    """End this worker when the process that started it ends, even mid-sample (no orphans)."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="queryrl-parent-watch").start()


def _worker_main(conn: Connection, ref: FunctionRef, kwargs: dict[str, Any]) -> None:
    """A worker: load the function, then score one sample per message until told to stop (None)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which closes the pool
    _exit_with_parent()
    loop = LoopRunner()
    try:
        fn: RewardFn | None = ref.load()
        load_error = ""
    except BaseException as e:  # reported per sample rather than crashing in a restart loop
        fn, load_error = None, f"the worker could not load the reward function: {type(e).__name__}: {e}"
    conn.send(READY)  # the first sample's timeout starts only now, not while imports run
    while True:
        try:
            x: RewardInput | None = conn.recv()
        except (EOFError, OSError):
            return
        if x is None:
            return
        result = failure(x.data_source, load_error) if fn is None else score_sample(fn, x, kwargs, loop)
        conn.send(result)


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"worker process crashed with exit code {exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    return f"worker process crashed with exit code {exitcode}"


@dataclass
class _Task:
    future: Future[RewardResult]
    input: RewardInput


class _Worker:
    """One worker process, its end of the pipe, and the sample it holds (if any)."""

    def __init__(self, ctx: BaseContext, ref: FunctionRef, kwargs: dict[str, Any]) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main, args=(child, ref, kwargs), daemon=True, name="queryrl-reward-worker"
        )
        self.process.start()
        child.close()
        self.pid: int = self.process.pid
        self.ready = False  # set by its first message: it has loaded the function
        self.task: _Task | None = None
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S  # of its start-up, then of its sample

    def stop(self, kill: bool) -> None:
        """Ask an idle worker to exit (or kill it), then reap it."""
        if not kill:
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.process.join(timeout=1.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5.0)
        self.conn.close()
        if not self.process.is_alive():
            self.process.close()  # release its sentinel and pipe now, not at garbage collection


class _Pool:
    """The workers and the dispatcher thread that feeds them; shared by nothing but its manager."""

    def __init__(self, ref: FunctionRef, kwargs: dict[str, Any], num_workers: int, timeout_s: float) -> None:
        self.ref, self.kwargs = ref, kwargs
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.ctx = mp.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            # Import the worker code once in the server, so every fork starts warm (no-op if it runs).
            self.ctx.set_forkserver_preload(["__main__", __name__])
        self.lock = threading.Lock()
        self.queue: deque[_Task] = deque()  # guarded by lock
        self.closing = False  # guarded by lock
        self.counts = {"reward/timeouts": 0.0, "reward/worker_crashes": 0.0}  # guarded by lock
        self.workers: list[_Worker] = []  # the dispatcher thread's only
        self.broken = ""  # why workers cannot be started; then every sample fails with it
        self.idle_deaths = 0  # workers that ended holding no sample, since the last result
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.thread = threading.Thread(target=self._run, daemon=True, name="queryrl-reward-pool")
        self.thread.start()

    # -- called from the manager's thread --------------------------------------------------------

    def put(self, tasks: list[_Task]) -> None:
        with self.lock:
            if self.closing:
                raise RewardError(self.broken or "the parallel reward manager is closed")
            self.queue.extend(tasks)
        self._wake()

    def close(self) -> None:
        with self.lock:
            if self.closing:
                return
            self.closing = True
        self._wake()
        self.thread.join(timeout=30.0)
        os.close(self.wake_r)
        os.close(self.wake_w)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe: the dispatcher has wake-ups enough
            os.write(self.wake_w, b"x")

    # -- the dispatcher thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self.lock:
                    if self.closing:
                        break
                self._fill()
                self._assign()
                self._wait_and_collect()
        except Exception:  # a bug here must not leave callers waiting forever
            logger.exception("the parallel reward pool stopped")
            self.broken = "the parallel reward pool stopped on an internal error (see the log)"
        finally:
            self._shutdown()

    def _fill(self) -> None:
        while len(self.workers) < self.num_workers and not self.broken:
            try:
                self.workers.append(_Worker(self.ctx, self.ref, self.kwargs))
            except Exception as e:
                self.broken = f"could not start a reward worker process: {type(e).__name__}: {e}"
                logger.error(self.broken)

    def _assign(self) -> None:
        with self.lock:
            if self.broken:
                tasks, self.queue = list(self.queue), deque()
                for t in tasks:
                    t.future.set_result(failure(t.input.data_source, self.broken))
                return
        for w in self.workers:
            if w.task is not None or not w.ready:
                continue
            with self.lock:
                if not self.queue:
                    return
                task = self.queue.popleft()
            if not task.future.set_running_or_notify_cancel():
                continue
            try:
                w.conn.send(task.input)
            except (OSError, EOFError):
                w.task = task  # the worker is gone; its sentinel reports it below
            except Exception as e:  # the input does not pickle
                task.future.set_result(failure(task.input.data_source, f"cannot send it to a worker: {e}"))
                continue
            w.task = task
            w.deadline = time.monotonic() + self.timeout_s if self.timeout_s > 0 else math.inf

    def _wait_and_collect(self) -> None:
        """Wait for a message, a process end, a deadline or a wake-up; handle what happened."""
        deadline = min((w.deadline for w in self.workers), default=math.inf)
        timeout = None if deadline == math.inf else max(0.0, deadline - time.monotonic())
        watched: list[Any] = [self.wake_r]
        for w in self.workers:
            watched.append(w.process.sentinel)
            if w.task is not None or not w.ready:
                watched.append(w.conn)
        ready = set(wait(watched, timeout))
        if self.wake_r in ready:
            os.read(self.wake_r, 4096)
        now = time.monotonic()
        retired: list[_Worker] = []
        for w in self.workers:
            ended, readable = w.process.sentinel in ready, w.conn in ready
            if (ended or readable) and self._receive(w) and not ended:
                continue
            if ended or readable:  # the process ended, or its pipe is at EOF
                self._retire(w, _exit_reason(self._reap(w)), "reward/worker_crashes")
            elif now >= w.deadline and w.task is not None:
                self._retire(w, f"timed out after {self.timeout_s:g} s (worker killed and replaced)", "reward/timeouts")
            elif now >= w.deadline:
                self.broken = f"a reward worker process did not load the reward function within {STARTUP_TIMEOUT_S:g} s"
                self._retire(w, "start-up timed out", "")
            else:
                continue
            retired.append(w)
        if retired:  # _fill starts their replacements
            self.workers = [w for w in self.workers if w not in retired]

    def _receive(self, w: _Worker) -> bool:
        """Take `w`'s message (it is ready, or a result) if one is waiting; False if none or the pipe broke."""
        try:
            if not w.conn.poll():
                return False
            message: str | RewardResult = w.conn.recv()
        except (EOFError, OSError):
            return False
        if not w.ready:
            w.ready, w.deadline = message == READY, math.inf
            return w.ready
        if w.task is not None and isinstance(message, RewardResult):
            w.task.future.set_result(message)
            w.task, w.deadline = None, math.inf
            self.idle_deaths = 0
        return True

    @staticmethod
    def _reap(w: _Worker) -> int | None:
        w.process.join(timeout=5.0)
        return w.process.exitcode

    def _retire(self, w: _Worker, reason: str, counter: str) -> None:
        """Fail the sample `w` held (if any) with `reason`, then kill and reap `w`."""
        if w.task is not None:
            w.task.future.set_result(failure(w.task.input.data_source, reason))
            w.task = None
            with self.lock:
                self.counts[counter] += 1
        elif not self.broken:
            logger.warning("a reward worker process ended while idle (%s); replacing it", reason)
            self.idle_deaths += 1
            if self.idle_deaths >= 3:  # dying at start-up: restarting forever would hide it
                self.broken = f"reward worker processes keep ending before taking a sample (last: {reason})"
                logger.error(self.broken)
        w.stop(kill=True)

    def _shutdown(self) -> None:
        reason = self.broken or "the reward manager was closed before it was scored"
        with self.lock:
            self.closing = True  # also after an internal error: put() must not queue for nobody
            tasks, self.queue = list(self.queue), deque()
        tasks += [w.task for w in self.workers if w.task is not None]
        for t in tasks:
            if not t.future.done():
                t.future.set_result(failure(t.input.data_source, reason))
        for w in self.workers:
            w.stop(kill=w.task is not None)
        self.workers.clear()


class ParallelRewardManager:
    """Scores samples in a pool of worker processes (verl's ``prime``-style parallel manager).

    Uses ``num_workers`` (processes) and ``timeout_s`` (per sample, from when a worker starts it;
    <= 0: none); ignores the other options. Workers start in the background when the manager is
    built (the first start of the forkserver imports torch, a few seconds), so :meth:`submit`
    returns at once.

    Metrics (:meth:`pop_metrics`, counts since the last pop): ``reward/timeouts``,
    ``reward/worker_crashes``.

    Args:
        fn: the per-sample reward function: loaded from a file, or importable by name.
        kwargs: extra keyword arguments for every call (``reward.kwargs``); must pickle.

    Raises:
        RewardError: `fn` cannot reach the workers, or ``num_workers < 1``.
    """

    def __init__(
        self,
        fn: RewardFn,
        kwargs: Mapping[str, Any] | None = None,
        *,
        num_workers: int = 2,
        timeout_s: float = 60.0,
        **options: Any,
    ) -> None:
        check_options("parallel", options)
        if isinstance(fn, BatchScorer):
            raise RewardError(
                f"reward.manager=parallel scores one sample per worker process, but {fn} is TRL-style (one call "
                "scores a batch): use reward.manager=naive, batch, dapo or async (or reward.function.style=verl "
                "if it is a per-sample function)"
            )
        if num_workers < 1:
            raise RewardError(f"reward.num_workers must be >= 1 for the parallel manager, got {num_workers}")
        self.fn = fn
        self.kwargs = dict(kwargs or {})
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._pool = _Pool(FunctionRef.of(fn), self.kwargs, num_workers, timeout_s)
        self._finalizer = weakref.finalize(self, self._pool.close)

    def submit(self, inputs: list[RewardInput]) -> PendingRewards:
        """Queue `inputs` for the workers and return at once."""
        tasks = [_Task(Future(), x) for x in inputs]
        if tasks:
            self._pool.put(tasks)
        return PendingRewards([t.future for t in tasks], [x.data_source for x in inputs])

    def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        return self.submit(inputs).result()

    def worker_pids(self) -> list[int]:
        """The process ids of the live workers (for logs and tests)."""
        return [w.pid for w in list(self._pool.workers)]

    def pop_metrics(self) -> dict[str, float]:
        with self._pool.lock:
            metrics = dict(self._pool.counts)
            self._pool.counts = dict.fromkeys(metrics, 0.0)
        return metrics

    def close(self) -> None:
        """Stop the workers (a sample still running fails as closed). Idempotent."""
        self._finalizer()

    def __enter__(self) -> ParallelRewardManager:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.close()
