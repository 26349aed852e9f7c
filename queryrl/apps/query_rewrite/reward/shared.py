"""What the query-rewrite reward shares across samples, threads and event loops of one process.

verl calls a reward as a plain function (:func:`~.score.compute_score`, once per sample, from the reward
manager's threads or event loop), so what the samples share lives in one object per process, :data:`SHARED`
(a :class:`SharedClients`), instead of loose module dicts: the clients per configuration (RAG, the
OpenAI-compatible judge, the offline judge), each event loop's caches of candidate RAG pairs and verdicts,
and the step counters the trainer logs. Its locks are its own; tests start clean with :meth:`SharedClients.reset`.
A worker process of the ``parallel`` reward manager has its own.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar, cast

T = TypeVar("T")


class LoopCache:
    """One event loop's LRU of finished results (at most `size`) and its in-flight calls."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.done: OrderedDict[str, Any] = OrderedDict()
        self.inflight: dict[str, asyncio.Task[Any]] = {}
        self.calls = 0  # calls actually sent (for tests and debugging)


LoopCaches = weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopCache]


class SharedClients:
    """The reward's shared clients, per-loop caches and counters, each guarded by this object's own lock.

    Attributes:
        candidates: each event loop's cache of candidate RAG pairs (:func:`~.calls.shared_both`).
        verdicts: each event loop's cache of judge verdicts (:func:`~.judge.shared_judge`).
    """

    def __init__(self) -> None:
        self._clients_lock = threading.Lock()  # held while a client is made: one client per key
        self._counts_lock = threading.Lock()
        self._clients: dict[tuple[str, Hashable], Any] = {}
        self._counts: dict[str, float] = {}
        self.candidates: LoopCaches = weakref.WeakKeyDictionary()
        self.verdicts: LoopCaches = weakref.WeakKeyDictionary()

    def client(self, kind: str, key: Hashable, make: Callable[[], T]) -> T:
        """The client of `kind` (``rag``, ``judge``, ``offline_judge``) for `key`, made by `make()` on first use;
        threads asking for the same one at once get the one client."""
        with self._clients_lock:
            if (kind, key) not in self._clients:
                self._clients[(kind, key)] = make()
            return cast(T, self._clients[(kind, key)])

    def clients(self, kind: str) -> list[Any]:
        """Every client of `kind` made so far, in the order they were made."""
        with self._clients_lock:
            return [client for (k, _), client in self._clients.items() if k == kind]

    def count(self, key: str, value: float = 1.0) -> None:
        """Add `value` to the counter `key`."""
        with self._counts_lock:
            self._counts[key] = self._counts.get(key, 0.0) + value

    def pop_counts(self, keys: Iterable[str] | None = None) -> dict[str, float]:
        """The counters `keys` (default: all) and their values since they were last popped; they restart at 0."""
        with self._counts_lock:
            names = list(self._counts) if keys is None else [k for k in keys if k in self._counts]
            return {k: self._counts.pop(k) for k in names}

    def reset(self) -> None:
        """Forget every client, cache and counter (a test's clean start)."""
        with self._clients_lock, self._counts_lock:
            self._clients.clear()
            self._counts.clear()
            self.candidates = weakref.WeakKeyDictionary()
            self.verdicts = weakref.WeakKeyDictionary()


SHARED = SharedClients()
