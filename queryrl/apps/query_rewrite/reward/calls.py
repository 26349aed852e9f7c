"""Work the query-rewrite reward shares across samples: one RAG pair and one judge verdict per distinct
request on each event loop, and the side counters the trainer logs each step.

One :class:`~queryrl.rag.RAGClient` (and one :class:`~queryrl.rewards.JudgeClient`) per configuration is
made lazily and kept by the process's :data:`~.shared.SHARED`, with the caches and counters. Both clients
keep their HTTP connections and in-flight tables per event loop, so one client is safe on the manager's
background loop and on any other. The reference result is cached by the client per prompt. Identical
rewrites of one prompt share one candidate call: a per-event-loop LRU (:data:`CANDIDATE_CACHE_SIZE`
entries, plus an in-flight table so concurrent identical calls share one request) keyed by the RAG
configuration, the message ids, the contexts and the sent ``/rag/chat_8b`` fields (the whitespace-normalised
rewrite plus the policy's profile and summary: a cached result is only reused for the very same request).
Failures are not cached.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from queryrl.apps.query_rewrite.reward.intent import pop_intent_metrics
from queryrl.apps.query_rewrite.reward.rag import rag_clients
from queryrl.apps.query_rewrite.reward.shared import SHARED, LoopCache, LoopCaches
from queryrl.rag import RAGClient, RAGFailure

CANDIDATE_CACHE_SIZE = 4096

Pair = tuple[dict[str, Any], dict[str, Any]]


class RewardFailure(RuntimeError):
    """The sample cannot be scored (RAG down, judge failed or inconsistent): the manager marks it failed."""


def candidate_calls() -> int:
    """Candidate calls sent so far by the cache of the running event loop."""
    cache = SHARED.candidates.get(asyncio.get_running_loop())
    return cache.calls if cache is not None else 0


async def share(
    caches: LoopCaches,
    key: str,
    make: Callable[[], Awaitable[Any]],
    counter: str,
) -> Any:
    """``await make()``, shared with every call of the same `key` on this event loop: a finished result
    comes from the loop's LRU, a running one is awaited rather than started twice. Failures are not kept."""
    loop = asyncio.get_running_loop()
    cache = caches.get(loop)
    if cache is None:
        cache = caches[loop] = LoopCache(CANDIDATE_CACHE_SIZE)
    if key in cache.done:
        cache.done.move_to_end(key)
        return cache.done[key]
    task = cache.inflight.get(key)
    if task is None:
        cache.calls += 1
        SHARED.count(counter)
        task = cache.inflight[key] = asyncio.ensure_future(make())
        task.add_done_callback(lambda _: cache.inflight.pop(key, None))
    result = await asyncio.shield(task)
    cache.done[key] = result
    cache.done.move_to_end(key)
    while len(cache.done) > cache.size:
        cache.done.popitem(last=False)
    return result


async def shared_both(client: RAGClient, scope: Any, fields: dict[str, Any]) -> Pair:
    """``client.both(**fields)``, shared with every identical request on this loop; raises on a failed side."""
    key = json.dumps([repr(scope), fields], sort_keys=True, ensure_ascii=False, default=str)
    pair: Pair = await share(SHARED.candidates, key, lambda: _both(client, fields), "rag/candidate_calls")
    return pair


async def _both(client: RAGClient, fields: dict[str, Any]) -> Pair:
    candidate, reference = await client.both(**fields)
    for side in (candidate, reference):
        if isinstance(side, RAGFailure):
            raise RewardFailure(f"RAG /rag/{side.endpoint} failed: {side.error}")
    assert not isinstance(candidate, RAGFailure)
    assert not isinstance(reference, RAGFailure)
    return candidate, reference


# --- side metrics ------------------------------------------------------------------------------


def pop_reward_metrics() -> dict[str, float]:
    """Counters since the last call, for the trainer's step metrics (reset here): the RAG clients'
    ``rag/*`` (calls, failures, retries, reference cache hits, latency), ``rag/candidate_calls``
    (distinct candidate requests actually sent), and with position swap ``judge/position_consistency``
    (the fraction of swapped pairs whose two verdicts agreed), and ``reward/intent/changed`` (the share of
    rewrites that changed the customer's intent, :func:`~.intent.pop_intent_metrics`)."""
    metrics: dict[str, float] = {}
    clients = rag_clients()
    intent = pop_intent_metrics()  # its counters first: the rest are this step's side counters
    counts = SHARED.pop_counts()
    for client in clients:
        for key, value in client.pop_stats().items():
            metrics[key] = metrics.get(key, 0.0) + value
    if len(clients) > 1 and "rag/latency_s" in metrics:
        metrics["rag/latency_s"] /= len(clients)
    consistent = counts.pop("judge/position_consistent", 0.0)
    inconsistent = counts.pop("judge/position_inconsistent", 0.0)
    if consistent + inconsistent:
        metrics["judge/position_consistency"] = consistent / (consistent + inconsistent)
    return metrics | counts | intent
