"""The judge side of the query-rewrite reward: the offline judge or an OpenAI-compatible one on the rubric
(optionally both positions, :func:`~.judging.combine_swapped`), the shared clients, one verdict per
distinct request on each event loop, and verdicts as a person reads them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from queryrl.apps.query_rewrite.config import QueryRewriteJudgeConfig
from queryrl.apps.query_rewrite.reward.calls import RewardFailure, share
from queryrl.apps.query_rewrite.reward.judging import (
    OfflineJudge,
    combine_swapped,
    judge_pair,
    quality_from_verdict,
)
from queryrl.apps.query_rewrite.reward.shared import SHARED
from queryrl.rewards.judge import JudgeClient

JUDGES = ("offline", "openai")


def judge_client(judge: QueryRewriteJudgeConfig) -> JudgeClient:
    """The shared OpenAI-compatible judge client of the settings `judge` (``app.query_rewrite.judge``), made
    on first use. The request settings (``temperature``, ``max_tokens``, ``reasoning_effort``, ...) are sent
    only where set: GPT-5 takes no temperature but its default.

    Raises:
        ValueError: no ``base_url`` or ``model``.
    """
    if not judge.base_url or not judge.model:
        raise ValueError("judge backend 'openai' needs app.query_rewrite.judge.base_url and judge.model")
    key = json.dumps(asdict(judge), sort_keys=True, default=str)
    base_url, model = judge.base_url, judge.model
    return SHARED.client("judge", key, lambda: _make_judge_client(judge, base_url, model))


def _make_judge_client(judge: QueryRewriteJudgeConfig, base_url: str, model: str) -> JudgeClient:
    return JudgeClient(
        base_url,
        model,
        api_key_env=judge.api_key_env,
        timeout_s=judge.timeout_s,
        max_retries=judge.max_retries,
        temperature=judge.temperature,
        max_tokens=judge.max_tokens,
        token_limit_param=judge.token_limit_param,
        reasoning_effort=judge.reasoning_effort,
        extra_body=dict(judge.extra_body) or None,
        setting_prefix="app.query_rewrite.judge",
        price_per_million_input=judge.price_per_million_input,
        price_per_million_output=judge.price_per_million_output,
    )


async def judge_quality(
    judge: QueryRewriteJudgeConfig,
    contexts: list[dict[str, Any]],
    candidate: dict[str, Any],
    reference: dict[str, Any],
    gold: Sequence[str],
    top_k: int,
    sources: Sequence[str] = (),
) -> tuple[float, dict[str, Any]]:
    """(quality q in [0, 1], what to show a person: the verdict, :func:`readable_verdict`) from the judge of
    the settings `judge`; raises :class:`RewardFailure` on a failed / inconsistent verdict. `sources`: the
    row's summary and profile, for the offline judge's intent check."""
    if judge.backend == "offline":
        offline = SHARED.client("offline_judge", top_k, lambda: OfflineJudge(top_k=top_k))
        verdict = offline.judge(contexts, candidate, reference, gold, sources=sources)
        quality = quality_from_verdict(verdict)
        if quality is None:
            raise RewardFailure("offline judge: no verdict (it needs gold_doc_ids)")
        return quality, {"judge_verdict": readable_verdict(verdict)}
    if judge.backend != "openai":
        raise ValueError(f"unknown judge {judge.backend!r}; use one of {JUDGES}")
    client = judge_client(judge)
    swap = judge.position_swap
    results = await judge_pair(client, contexts, candidate, reference, lang=judge.lang, position_swap=swap)
    if not swap:
        quality = quality_from_verdict(results[0].verdict)
        if quality is None:
            raise RewardFailure(f"judge failed: {results[0].error or 'invalid verdict'}")
        return quality, {"judge_verdict": readable_verdict(results[0].verdict)}
    r_ab, r_ba = results
    for r in (r_ab, r_ba):
        if r.verdict is None:
            raise RewardFailure(f"judge failed: {r.error or 'invalid verdict'}")
    quality, consistent = combine_swapped(r_ab.verdict, r_ba.verdict)
    SHARED.count("judge/position_consistent" if quality is not None and consistent else "judge/position_inconsistent")
    if quality is None or not consistent:
        raise RewardFailure(
            f"judge position-inconsistent: {r_ab.verdict.get('better') if r_ab.verdict else None!r} "
            f"then {r_ba.verdict.get('better') if r_ba.verdict else None!r} with the positions swapped"
        )
    return quality, {
        "judge_verdict": readable_verdict(r_ab.verdict),
        "judge_verdict_swapped": readable_verdict(r_ba.verdict, candidate_label="32b"),
    }


def readable_verdict(verdict: Mapping[str, Any] | None, candidate_label: str = "8b") -> dict[str, Any]:
    """A verdict in the rubric's schema with its position labels replaced by what they stood for:
    ``better`` is ``candidate``, ``reference`` or ``same``, and the two sides' scores are under
    ``candidate`` and ``reference`` (with position swap the candidate was ``"32b"``). Other keys stay."""
    verdict = dict(verdict or {})
    reference_label = "32b" if candidate_label == "8b" else "8b"
    names = {candidate_label: "candidate", reference_label: "reference"}
    scores = verdict.pop("score", None)
    better = verdict.get("better")
    out: dict[str, Any] = {"better": names.get(str(better), better)}
    if isinstance(scores, Mapping):
        out |= {"candidate": scores.get(candidate_label), "reference": scores.get(reference_label)}
    return out | {k: v for k, v in verdict.items() if k != "better"}


async def shared_judge(
    judge: QueryRewriteJudgeConfig,
    contexts: list[dict[str, Any]],
    candidate: dict[str, Any],
    reference: dict[str, Any],
    gold: Sequence[str],
    top_k: int,
    sources: Sequence[str] = (),
) -> tuple[float, dict[str, Any]]:
    """:func:`judge_quality`, one call per distinct (judge settings, conversation, both RAG answers but
    their timing, gold) on this loop: identical rewrites of a prompt share one verdict."""
    sides = [{k: v for k, v in side.items() if k != "cost_time"} for side in (candidate, reference)]
    scope = [asdict(judge), contexts, sides, list(gold), top_k, list(sources)]
    key = json.dumps(scope, sort_keys=True, ensure_ascii=False, default=str)
    verdict: tuple[float, dict[str, Any]] = await share(
        SHARED.verdicts,
        key,
        lambda: judge_quality(judge, contexts, candidate, reference, gold, top_k, sources),
        "judge/distinct_calls",
    )
    return verdict
