"""``queryrl eval``'s "meaning kept" columns: whether each system's rewrites keep the customer's intent.

Every system, on every turn (small talk too), is read by the offline check
(:func:`~queryrl.apps.query_rewrite.intent.check.check_intent`: the conversation, the CRM summary and profile;
a turn labelled as needing no retrieval is small talk). Its metrics (:func:`intent_metrics`):
``intent_kept`` (the share of turns whose query keeps the intent; a format failure does not, it asks
nothing) with its percentile-bootstrap 95 % interval (``intent_kept_low`` / ``intent_kept_high``) and
``intent_n`` (the turns). The ``reference`` system's query is the one the service reports.

With an OpenAI-compatible judge (``--judge`` and ``app.query_rewrite.judge.backend=openai``) the LLM is
asked the same question for each query (:mod:`.intent.judge`), reported apart: ``intent_kept_judge`` (over
the turns with a valid answer) with its interval, ``intent_judge_n``, ``intent_judge_failed`` (no valid
answer) and ``intent_judge_calls``; its calls count in the report's ``judge_calls``.

``--compare A:B`` adds the paired difference of ``intent_kept`` (and ``intent_kept_judge`` over the turns
both have an answer for) to each pair (:func:`compare_intents`); each sample record carries the verdicts
(:func:`intent_fields`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from queryrl.apps.query_rewrite.eval.compare import pair_key, paired_where_both
from queryrl.apps.query_rewrite.eval.samples import Answer, EvalError, Sample, SystemSpec
from queryrl.apps.query_rewrite.intent.check import IntentVerdict, check_intent
from queryrl.apps.query_rewrite.intent.judge import IntentJudgeOutcome, judge_intents, verdict_kept
from queryrl.apps.query_rewrite.metrics import bootstrap_ci, no_retrieval_turn, paired_bootstrap
from queryrl.rewards.judge import JudgeClient


@dataclass
class SystemIntents:
    """One system's intent verdicts per sample: the offline check's and, with an LLM judge, the judge's."""

    offline: list[IntentVerdict]
    judged: IntentJudgeOutcome | None = None


def system_queries(answers: Sequence[Answer] | None, results: Sequence[Mapping[str, Any] | None]) -> list[str | None]:
    """Per sample, the query a system sent (None: its reply did not parse); ``reference``'s (`answers` None)
    is the ``rewritten_query`` its service reported."""
    if answers is None:
        return [str((r or {}).get("rewritten_query") or "") for r in results]
    return [a.query for a in answers]


def offline_intents(samples: Sequence[Sample], queries: Sequence[str | None]) -> list[IntentVerdict]:
    """The offline check of each query against its sample's conversation, summary and profile."""
    return [
        check_intent(
            s.contexts,
            q,
            [s.history_summary, s.user_profile],
            small_talk=True if no_retrieval_turn(s.gold, s.kind) else None,
        )
        for s, q in zip(samples, queries, strict=True)
    ]


def assess_intents(
    specs: Sequence[SystemSpec],
    samples: Sequence[Sample],
    answers: Mapping[str, Sequence[Answer] | None],
    results: Mapping[str, Sequence[Mapping[str, Any] | None]],
    client: JudgeClient | None,
    lang: str,
    say: Callable[[str], None],
) -> dict[str, SystemIntents]:
    """Each system's :class:`SystemIntents`; the LLM is asked only with `client` (an OpenAI-compatible judge).

    Raises:
        EvalError: the judge refused its configuration (e.g. no API key).
    """
    from queryrl.rewards.judge import JudgeConfigError

    out: dict[str, SystemIntents] = {}
    for spec in specs:
        queries = system_queries(answers[spec.name], results[spec.name])
        intents = SystemIntents(offline_intents(samples, queries))
        if client is not None:
            say(f"{spec.name}: asking the judge whether each rewrite keeps the intent ...")
            contexts = [s.contexts for s in samples]
            try:
                intents.judged = asyncio.run(judge_intents(client, contexts, queries, intents.offline, lang))
            except JudgeConfigError as exc:
                raise EvalError(f"judge: {exc}") from None
        out[spec.name] = intents
    return out


def _with_ci(name: str, values: Sequence[float], n_boot: int, seed: int) -> dict[str, float]:
    mean, low, high = bootstrap_ci(values, n_boot, seed=seed)
    return {name: mean, f"{name}_low": low, f"{name}_high": high}


def intent_metrics(intents: SystemIntents, n_boot: int, seed: int) -> dict[str, float]:
    """One system's ``intent_kept`` (with interval) and ``intent_n``; with the LLM, ``intent_kept_judge``
    (with interval, over the valid answers), ``intent_judge_n``, ``intent_judge_failed``, ``intent_judge_calls``."""
    kept = [float(v.kept) for v in intents.offline]
    out: dict[str, float] = {"intent_n": float(len(kept))}
    if kept:
        out |= _with_ci("intent_kept", kept, n_boot, seed)
    if intents.judged is not None:
        judged = [verdict_kept(v) for v in intents.judged.verdicts]
        valid = [float(k) for k in judged if k is not None]
        out |= {
            "intent_judge_n": float(len(valid)),
            "intent_judge_failed": float(len(judged) - len(valid)),
            "intent_judge_calls": float(intents.judged.calls),
        }
        if valid:
            out |= _with_ci("intent_kept_judge", valid, n_boot, seed)
    return out


def compare_intents(
    pairs: Sequence[tuple[str, str]], intents: Mapping[str, SystemIntents], n_boot: int, seed: int
) -> dict[str, dict[str, Any]]:
    """Per pair (its key ``A-B``): ``intent_kept`` -- :func:`~.metrics.paired_bootstrap` of A's and B's
    per-turn 1 / 0 over every turn -- and ``intent_kept_judge`` over the turns the LLM answered for both."""
    out: dict[str, dict[str, Any]] = {}
    for a, b in pairs:
        entry: dict[str, Any] = {}
        xs, ys = intents[a].offline, intents[b].offline
        if xs:
            entry["intent_kept"] = paired_bootstrap(
                [float(v.kept) for v in xs], [float(v.kept) for v in ys], n_boot, seed=seed
            )
        ja, jb = intents[a].judged, intents[b].judged
        if ja is not None and jb is not None:
            kept_a = [None if k is None else float(k) for k in map(verdict_kept, ja.verdicts)]
            kept_b = [None if k is None else float(k) for k in map(verdict_kept, jb.verdicts)]
            paired = paired_where_both(kept_a, kept_b, n_boot, seed)
            if paired is not None:
                entry["intent_kept_judge"] = paired
        out[pair_key(a, b)] = entry
    return out


def intent_fields(intents: SystemIntents, index: int) -> dict[str, Any]:
    """One sample's verdicts for ``eval_samples.jsonl``: ``intent_kept``, ``intent_code``, ``intent_reason``
    and, with the LLM, ``intent_kept_judge`` (None: no valid answer) and ``intent_judge_reason``."""
    verdict = intents.offline[index]
    fields: dict[str, Any] = {"intent_kept": verdict.kept, "intent_code": verdict.code, "intent_reason": verdict.reason}
    if intents.judged is not None:
        judged = intents.judged.verdicts[index]
        fields["intent_kept_judge"] = verdict_kept(judged)
        fields["intent_judge_reason"] = str(judged.get("reason", "")) if isinstance(judged, Mapping) else None
    return fields


def intent_call_summary(calls: Mapping[str, Any], intents: Mapping[str, SystemIntents]) -> dict[str, Any]:
    """The report's ``judge_calls`` with the LLM intent calls added (sent, failed, the first error)."""
    judged = [i.judged for i in intents.values() if i.judged is not None]
    errors = [calls.get("first_error"), *(j.first_error for j in judged)]
    return {
        "sent": int(calls["sent"]) + sum(j.calls for j in judged),
        "failed": int(calls["failed"]) + sum(j.failed for j in judged),
        "first_error": next((e for e in errors if e), None),
    }
