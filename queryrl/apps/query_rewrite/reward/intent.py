"""The intent check in the query-rewrite reward: a rewrite that changes the customer's question pays for it.

:func:`~queryrl.apps.query_rewrite.reward.score.compute_score` reads every rewrite with the offline check
(:func:`~queryrl.apps.query_rewrite.intent.check.check_intent`: the conversation, the CRM summary and profile;
a turn labelled as needing no retrieval is small talk) and hands its result through :func:`with_intent`:

- a rewrite that does not keep the intent (another question, an answer, invented facts, garbled text, an
  empty query on a question) loses ``intent_penalty`` (``app.query_rewrite.intent_penalty``, default 1.0:
  the judge component's weight in ``group_judge`` and ``mix``, half its range; 0 turns it off) from its
  score. A reply that does not parse asks nothing either, so it pays the same: a parseable rewrite that
  changes the question still scores above unparsed text, and the policy is never taught to stop answering
  in the format;
- garbled text is not a well-formed answer: its ``format`` component is 0 (in the weighted modes), so it
  never gets the full score, even with the penalty off;
- the sample's result carries ``intent/changed`` (1 / 0: the trainer logs ``reward/intent/changed/mean``)
  and ``intent_check`` (``{"kept", "code", "reason"}``, for the samples files and the run page);
  :func:`pop_intent_metrics` gives ``reward/intent/changed``, the share of checked rewrites that changed
  the intent since the last call (with ``reward/intent/checked``, their count), counted when checked, so
  samples that fail afterwards (a RAG failure) are in it too.

The offline judge scores an intent change low as well (:class:`~.judging.OfflineJudge`), and the LLM judge's
rubric says the same; the penalty applies whichever judge is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from queryrl.apps.query_rewrite.intent.check import NO_QUERY, IntentVerdict, check_intent
from queryrl.apps.query_rewrite.reward.shared import SHARED
from queryrl.rag.rewriters import last_user_turn

_COUNTERS = ("reward/intent/checked", "reward/intent/changed")  # SHARED's counters, read by pop_intent_metrics


def intent_sources(info: Mapping[str, Any]) -> list[str]:
    """The row's CRM summary and profile: text the conversation holds beside its messages."""
    return [str(info.get(k) or "") for k in ("history_summary", "user_profile") if info.get(k)]


def rewrite_intent(query: str | None, info: Mapping[str, Any], no_retrieval: bool) -> IntentVerdict | None:
    """The offline verdict on `query` (None: the reply did not parse) for the row's ``extra_info``; None when
    the row has no conversation with a user turn (nothing to check against). Counted for
    :func:`pop_intent_metrics`."""
    contexts = [{"role": str(m["role"]), "content": str(m["content"])} for m in info.get("contexts") or []]
    if last_user_turn(contexts)[0] < 0:
        return None
    if query is None:
        verdict = NO_QUERY
    else:
        verdict = check_intent(contexts, query, intent_sources(info), small_talk=True if no_retrieval else None)
    SHARED.count(_COUNTERS[0])
    SHARED.count(_COUNTERS[1], float(not verdict.kept))
    return verdict


def with_intent(
    result: dict[str, Any], verdict: IntentVerdict | None, penalty: float, mode: str, weights: Mapping[str, float]
) -> dict[str, Any]:
    """`result` (``compute_score``'s dict) with the verdict applied (see the module doc); as is for None.

    Args:
        result: the sample's ``score`` and components.
        verdict: :func:`rewrite_intent`'s.
        penalty: ``app.query_rewrite.intent_penalty`` (>= 0; checked by the config).
        mode: ``app.query_rewrite.reward_mode`` (seed_hybrid's score has no format term).
        weights: the component weights the score was mixed with (the format weight of garbled text).
    """
    if verdict is None:
        return result
    out = dict(result)
    if verdict.code == "garbled" and out.get("format"):
        if mode != "seed_hybrid":  # seed_hybrid's score has no format term
            out["score"] -= float(weights.get("format", 0.0)) * float(out["format"])
        out["format"] = 0.0
    if not verdict.kept:
        out["score"] -= penalty
    out["intent/changed"] = float(not verdict.kept)
    out["intent_check"] = verdict.as_dict()
    return out


def pop_intent_metrics() -> dict[str, float]:
    """``reward/intent/changed`` (the share) and ``reward/intent/checked`` since the last call; {} when none."""
    counts = SHARED.pop_counts(_COUNTERS)
    checked, changed = counts.get(_COUNTERS[0], 0.0), counts.get(_COUNTERS[1], 0.0)
    if not checked:
        return {}
    return {"reward/intent/changed": changed / checked, "reward/intent/checked": checked}
