"""``queryrl eval``'s retrieval and judging, through the reward's own clients and judge.

Retrieval. The reference pipeline ``/rag/chat`` answers each sample once (its result is the
``reference`` system's, and what every other system is judged against); every other system's query
goes to ``/rag/chat_8b`` with its profile and summary (:func:`retrieve`). The client is the reward's
(:func:`~queryrl.apps.query_rewrite.reward.rag.rag_client`: HTTP to a service, or the embedded one). A
format failure sends nothing and has no result (None); an empty query is an abstention: no call, no
documents (:func:`~queryrl.apps.query_rewrite.metrics.abstained_result`). A failed call is an
:class:`~queryrl.apps.query_rewrite.eval.samples.EvalError` naming the service and the endpoint.

Judging (:func:`judge_all`). The offline judge (:class:`~queryrl.apps.query_rewrite.reward.judging.OfflineJudge`,
gold documents, no LLM) or an OpenAI-compatible one through
:func:`~queryrl.apps.query_rewrite.reward.judging.judge_pair`, the reward's requests (with ``position_swap``
both orders; a verdict counts only when they agree). A format failure loses to the reference
(:data:`LOSS`) without a call. Every call is counted: sent, failed (no valid verdict) and the first
error (:class:`JudgeOutcome`, :func:`judge_call_summary`); :func:`complain_about_judge` turns failures
into a warning, or an error when every call failed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.eval.samples import Answer, EvalError, Sample
from queryrl.apps.query_rewrite.metrics import abstained_result, no_retrieval_turn
from queryrl.apps.query_rewrite.reward.judging import OfflineJudge, combine_swapped, judge_pair
from queryrl.apps.query_rewrite.reward.modes import normalise_rewrite
from queryrl.rag import RAGClient, RAGError
from queryrl.rewards.judge import JudgeClient

RAG_CONCURRENCY = 16
LOSS: dict[str, Any] = {"better": "32b", "reason": "format_failure"}  # an unparsed reply loses to the reference


# --- retrieval ----------------------------------------------------------------------------------


def _where(rag_url: str | None) -> str:
    return f"RAG service at {rag_url}" if rag_url else "embedded RAG service"


async def retrieve(
    client: RAGClient,
    samples: Sequence[Sample],
    answers: Mapping[str, list[Answer] | None],
    rag_url: str | None,
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any] | None]]]:
    """(the reference result of each sample, each system's result per sample; None for a format failure).

    `answers`: a system's answers, or None for the ``reference`` system (it has no candidate results).
    The reference of the first sample is asked alone first, so that a service that is down fails fast
    with one message. The client is closed at the end.

    Raises:
        EvalError: a RAG call failed.
    """
    semaphore = asyncio.Semaphore(RAG_CONCURRENCY)

    async def call(endpoint: str, fields: dict[str, Any]) -> dict[str, Any]:
        async with semaphore:
            try:
                return await (client.chat(**fields) if endpoint == "chat" else client.chat_8b(**fields))
            except RAGError as exc:
                raise EvalError(f"{_where(rag_url)}: /rag/{endpoint} failed: {exc.error}") from None

    def common(s: Sample) -> dict[str, Any]:
        return {**s.ids, "contexts": [dict(c) for c in s.contexts]}

    async def candidate(s: Sample, a: Answer) -> dict[str, Any] | None:
        if a.query is None:
            return None
        if not a.query.strip():  # the system says the turn needs no retrieval
            return abstained_result()
        query = normalise_rewrite(a.query)
        fields = {
            **common(s),
            "user_profile": a.user_profile,
            "history_summary": a.history_summary,
            "rewritten_query": query,
        }
        return await call("chat_8b", fields)

    try:
        first = await call("chat", common(samples[0]))
        rest = await asyncio.gather(*(call("chat", common(s)) for s in samples[1:]))
        references = [first, *rest]
        candidates: dict[str, list[dict[str, Any] | None]] = {}
        for name, system_answers in answers.items():
            if system_answers is None:
                continue
            candidates[name] = list(
                await asyncio.gather(*(candidate(s, a) for s, a in zip(samples, system_answers, strict=True)))
            )
    finally:
        await client.aclose()
    return references, candidates


def doc_ids(result: Mapping[str, Any] | None) -> list[str]:
    """The ``doc_id`` of a RAG result's documents in order ([] for None: a format failure)."""
    if result is None:
        return []
    return [str(d.get("doc_id")) for d in result.get("response") or []]


# --- judging ------------------------------------------------------------------------------------


@dataclass
class JudgeOutcome:
    """One system's judging: verdicts with the candidate as "8b" (a format failure is :data:`LOSS`), the
    position-inconsistent count, and the judge calls that failed (no verdict from the service)."""

    verdicts: list[dict[str, Any] | None]
    inconsistent: int = 0
    calls: int = 0  # judge requests sent (format failures send none; position swap sends two)
    failed: int = 0  # of them, those whose call failed or whose reply was no valid verdict
    first_error: str | None = None
    position_swap: bool = False  # the judge was asked for both orders (its setting, offline or not)


async def judge_all(
    samples: Sequence[Sample],
    candidates: Sequence[dict[str, Any] | None],
    references: Sequence[dict[str, Any]],
    *,
    top_k: int,
    client: JudgeClient | None = None,
    lang: str = "zh",
    position_swap: bool = False,
) -> JudgeOutcome:
    """Judge every candidate against its reference (see :class:`JudgeOutcome`).

    Args:
        samples, candidates, references: per sample, its row, the system's result and the reference's.
        top_k: the offline judge's cutoff.
        client: an OpenAI-compatible judge (closed at the end); None: the offline judge.
        lang, position_swap: the LLM judge's prompt language, and whether it judges both orders.

    Raises:
        EvalError: the judge refused its configuration (e.g. no API key).
    """
    if client is None:
        offline = OfflineJudge(top_k=top_k)
        verdicts = [
            LOSS if cand is None else offline.judge(s.contexts, cand, ref, s.gold, no_retrieval_turn(s.gold, s.kind))
            for s, cand, ref in zip(samples, candidates, references, strict=True)
        ]
        return JudgeOutcome(verdicts, position_swap=position_swap)
    from queryrl.rewards.judge import JudgeConfigError

    outcome = JudgeOutcome([], position_swap=position_swap)

    async def one(s: Sample, cand: dict[str, Any] | None, ref: dict[str, Any]) -> dict[str, Any] | None:
        if cand is None:
            return LOSS
        results = await judge_pair(client, s.contexts, cand, ref, lang=lang, position_swap=position_swap)
        outcome.calls += len(results)
        for result in results:
            if result.verdict is None:
                outcome.failed += 1
                outcome.first_error = outcome.first_error or result.error
        if not position_swap:
            return results[0].verdict
        v_ab, v_ba = (r.verdict for r in results)
        if v_ab is None or v_ba is None:
            return None
        _, consistent = combine_swapped(v_ab, v_ba)
        if not consistent:
            outcome.inconsistent += 1
            return None
        return v_ab

    try:
        jobs = (one(*x) for x in zip(samples, candidates, references, strict=True))
        outcome.verdicts = list(await asyncio.gather(*jobs))
    except JudgeConfigError as exc:
        raise EvalError(f"judge: {exc}") from None
    finally:
        await client.aclose()
    return outcome


def judge_call_summary(outcomes: Mapping[str, JudgeOutcome]) -> dict[str, Any]:
    """``{"sent", "failed", "first_error"}`` over every system's judge calls (the report's ``judge_calls``)."""
    errors = [o.first_error for o in outcomes.values() if o.first_error]
    return {
        "sent": sum(o.calls for o in outcomes.values()),
        "failed": sum(o.failed for o in outcomes.values()),
        "first_error": errors[0] if errors else None,
    }


SPEND_KEYS = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cut_off", "cost")


def judge_spend(client: JudgeClient | None) -> dict[str, int | float]:
    """The tokens the judge client spent since the last call (its counters are reset), for the report's
    ``judge_calls``: ``prompt_tokens``, ``completion_tokens`` (reasoning included: billed as output),
    ``reasoning_tokens``, ``cut_off`` and, with ``judge.price_per_million_*`` set, the estimated ``cost``."""
    if client is None:
        return {}
    stats = client.pop_stats()
    spend = {key: stats[f"judge/{key}"] for key in SPEND_KEYS if f"judge/{key}" in stats}
    return {key: value if key == "cost" else int(value) for key, value in spend.items()}  # counts as integers


def spend_line(spend: Mapping[str, float]) -> str | None:
    """``judge: 1200 prompt tokens, 300 completion tokens (200 reasoning), estimated cost 0.0042`` or None."""
    if "prompt_tokens" not in spend:
        return None
    line = f"judge: {spend['prompt_tokens']:.0f} prompt tokens, {spend['completion_tokens']:.0f} completion tokens"
    line += f" ({spend['reasoning_tokens']:.0f} reasoning)"
    if spend.get("cut_off"):
        line += f"; {spend['cut_off']:.0f} replies cut off at the token limit"
    if "cost" in spend:
        line += f"; estimated cost {spend['cost']:.4g} (at your judge.price_per_million_* prices)"
    return line


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def complain_about_judge(calls: Mapping[str, Any], out: Path, warn: Callable[[str], None] | None = None) -> None:
    """Failed judge calls must not read as a result: some failed -> a warning (to `warn`, default stderr)
    with the count and the first error; every one failed -> :class:`EvalError` (the CLI exits 2; the
    outputs are written already)."""
    sent, failed = int(calls["sent"]), int(calls["failed"])
    if not failed:
        return
    if failed == sent:
        raise EvalError(
            f"every judge call failed ({failed} of {sent}): the win/tie/loss columns in {out} are empty, not "
            f"a result; first error: {calls['first_error']}"
        )
    (warn or _stderr)(
        f"warning: {failed} of {sent} judge calls failed (judge_call_failed per system in {out}); "
        f"first error: {calls['first_error']}"
    )
