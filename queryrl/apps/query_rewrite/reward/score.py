"""The query-rewrite reward with verl's contract (docs/query-rewriter.md), for the ``async`` reward manager::

    reward.function.path=queryrl.apps.query_rewrite.reward.score reward.function.name=compute_score
    reward.manager=async reward.kwargs.judge=offline reward.kwargs.weights.format=0.2 ...

The settings are ``app.query_rewrite`` as its dataclass
(:class:`~queryrl.apps.query_rewrite.config.QueryRewriteConfig`): the application's
:class:`QueryRewriteReward` holds them and calls :func:`score_reply`; verl's function :func:`compute_score`
reads the same settings from its flat keywords (``judge_model`` for ``judge.model``:
:data:`~queryrl.apps.query_rewrite.config.FLAT_KEYS`), over the defaults in ``mix`` mode.

Per sample: parse the policy's JSON answer (:func:`~queryrl.apps.query_rewrite.prompts.parse_rewrite`),
send the rewritten query to ``/rag/chat_8b`` and the conversation to ``/rag/chat`` (one
:meth:`~queryrl.rag.RAGClient.both` call), judge the candidate result against the reference result, and
mix the components (:func:`~queryrl.apps.query_rewrite.reward.modes.mix_rewards`):

- ``judge``: ``2q - 1`` in [-1, 1] (``group_judge``), ``q`` from the offline judge (gold documents, no
  LLM) or an OpenAI-compatible judge on the rubric (optionally both positions, :func:`~.judging.combine_swapped`);
- ``retrieval_rank``: ConvSearch-R1's rank reward of the gold documents, in [0, 2], among the service's
  documents (``rag.rank_depth`` of them where set, the first ``top_k`` of which the judge sees);
- ``retrieval_entity`` (only where ``weights.retrieval_entity`` is set): the share of the first ``top_k``
  documents whose title is one of the row's ``ground_truth.gold_titles``, in [0, 1] (a row with gold and no
  titles fails, naming the field); at its floor 0 for an unparsed reply, 1 for a right abstention;
- ``retrieval_graded`` (only where ``weights.retrieval_graded`` is set): the gold document's log-discounted rank
  and score margin over the best other document among the service's documents, in [0, 1]; 0 for a query over
  twice its length budget or one the intent check marks as changed (:func:`.graded.graded_component`); the same
  floor and top as ``retrieval_entity``;
- ``format``: 1 when the output parses and the query is within ``max_query_chars``. A ``text``-format row
  (``extra_info.answer_format``, :mod:`~.prompts`) is read by :func:`~.prompts.parse_text_answer`: its first
  line is the query; more text after it is retrieved with the same, with ``format`` 0
  (``format/trailing`` 1), so a model that does not stop yet still gets a retrieval signal. A reply cut off at the
  token budget after a complete ``rewritten_query`` parses (:func:`~.prompts.parse_rewrite`), is scored
  like any other, and is counted: ``format/truncated`` (1 / 0, logged ``reward/format/truncated/mean``).
  Its format credit is full when the row asked only for the query (``extra_info.answer_fields``, the
  default), 0.5 when the cut lost the profile/summary the prompt asked for
  (:func:`~.reward.modes.format_reward`).

``/rag/chat_8b`` gets the policy's ``user_profile`` / ``history_summary`` where it answered them, else
the row's own (``extra_info``): by default the policy answers only the query.

Failures and penalties.

- An unparseable output is the policy's fault, not a failed sample: it gets every component at the
  floor of its scale (judge -1, i.e. ``q = 0``; retrieval_rank 0; format 0). With the floor rather than
  0 for the judge, garbage never outscores a parseable bad rewrite (whose judge component is >= -1), so
  the policy is never taught to stop emitting JSON. No RAG or judge call is made for it.
  With ``app.query_rewrite.unparsed=retrieve`` (for a model that does not follow the format yet) such a
  reply is read as plain text instead (:func:`~.prompts.plain_text_query`: its first line, without a
  label or quotes) and scored like a rewrite with ``format`` 0 (``format/plain_text`` 1): its retrieval
  and judge components differ from its neighbours', so GRPO has a signal, and the format weight is the
  price of not answering in JSON (a plain-text answer that finds the gold can outscore a JSON one that
  does not). A reply with no usable line still gets the floor.
- A RAG failure on either side, a judge call that fails or answers an invalid verdict, and (with
  ``position_swap``) two orders that disagree all *raise*: the manager marks the sample failed; it is
  never scored 0.
- Turns that need no retrieval (empty gold and a kind in
  :data:`~queryrl.apps.query_rewrite.metrics.NO_RETRIEVAL_KINDS`, e.g. "在吗"): the right answer is an
  EMPTY ``rewritten_query``. It gets every component at its top (judge 1, retrieval_rank 2, format 1); a
  non-empty query there gets judge -1 and retrieval_rank 0 (format 1); an empty query on a turn with gold
  gets that same floor. These are settled by the label alone: no RAG or judge call
  (:func:`~queryrl.apps.query_rewrite.reward.modes.abstain_components`). ``abstained`` (1 / 0) is logged.
- A rewrite that changes the customer's intent (the offline check of :mod:`.intent`: another question, an
  answer, invented facts, garbled text) loses ``intent_penalty`` (:mod:`.intent`); so does an
  unparsed reply, which asks nothing. The result carries ``intent/changed`` and ``intent_check``.
- No gold documents: ``retrieval_rank`` is not applicable and its weight is dropped (the other
  components are mixed as configured). The offline judge needs gold, so there it fails the sample
  unless the judge weight is 0 (a component with weight 0 is not computed).

Sharing work: identical requests share one RAG pair and one verdict (:mod:`.reward.calls`); the judge
side is :mod:`.judge`, the RAG clients :mod:`.rag`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig

from queryrl.apps.query_rewrite.config import (
    QueryRewriteConfig,
    QueryRewriteRAGConfig,
    reward_weights,
    settings_from_flat,
    settings_of,
)
from queryrl.apps.query_rewrite.metrics import abstained_result, no_retrieval_turn, recall_at_k
from queryrl.apps.query_rewrite.prompts import (
    MAX_QUERY_CHARS,
    QUERY_FIELD,
    ParsedRewrite,
    check_answer_fields,
    plain_text_query,
)
from queryrl.apps.query_rewrite.reward.calls import RewardFailure, pop_reward_metrics, shared_both
from queryrl.apps.query_rewrite.reward.graded import graded_component
from queryrl.apps.query_rewrite.reward.intent import intent_sources, rewrite_intent, with_intent
from queryrl.apps.query_rewrite.reward.judge import shared_judge
from queryrl.apps.query_rewrite.reward.modes import (
    TRUNCATED_MISSING_FIELDS_CREDIT,
    abstain_components,
    format_reward,
    group_judge_rewards,
    hybrid_reward,
    mix_rewards,
    normalise_rewrite,
    parse_answer,
    retrieval_entity_reward,
    retrieval_rank_reward,
)
from queryrl.apps.query_rewrite.reward.rag import ID_FIELDS as ID_FIELDS  # where eval/samples.py reads it
from queryrl.apps.query_rewrite.reward.rag import fetch_depth, rag_client, rag_request_fields, row_contexts
from queryrl.apps.query_rewrite.reward.reference import reference_query, reference_reply
from queryrl.rag import (
    RAGError,
)
from queryrl.rag.client import CHAT_FIELDS
from queryrl.rewards import REFERENCE_SCORE

ENTITY = "retrieval_entity"  # the graded entity component, computed only where weighted
GRADED = "retrieval_graded"  # the graded rank-and-margin component, computed only where weighted


def shown_documents(result: Mapping[str, Any], gold: Sequence[str]) -> list[dict[str, Any]]:
    """One RAG answer's documents as a person reads them: rank order, ``doc_id``, ``title``, ``score``, and
    ``gold`` (true for a gold document; absent when the turn has no gold labels)."""
    gold_ids = set(gold)
    shown = []
    for doc in result.get("response") or []:
        item: dict[str, Any] = {"doc_id": str(doc.get("doc_id")), "title": str(doc.get("title", ""))}
        if isinstance(doc.get("score"), int | float):
            item["score"] = round(float(doc["score"]), 4)
        if gold_ids:
            item["gold"] = item["doc_id"] in gold_ids
        shown.append(item)
    return shown


# --- the reward --------------------------------------------------------------------------------


# an unparsed reply is a format failure, not a truncated answer; ``parsed`` 0 (``reward/parsed/mean``: the
# share of replies that gave a query, which the app's learning_problem watches)
_NOT_CUT = {"format/truncated": 0.0, "parsed": 0.0}


@functools.lru_cache(maxsize=64)
def _flat_settings(key: str) -> QueryRewriteConfig:
    return settings_from_flat(json.loads(key))


def flat_settings(kwargs: Mapping[str, Any]) -> QueryRewriteConfig:
    """The settings of a call by flat keywords (verl's ``reward.kwargs``): :func:`~..config.settings_from_flat`,
    made once per distinct set of keywords."""
    return _flat_settings(json.dumps(dict(kwargs), sort_keys=True, default=str))


def _gold_titles(ground_truth: Any) -> list[str]:
    titles = ground_truth.get("gold_titles") if isinstance(ground_truth, Mapping) else None
    return [] if titles is None else [str(t) for t in titles]  # a list, or an array read from parquet


def _gold(ground_truth: Any) -> list[str]:
    ids = ground_truth.get("gold_doc_ids") if isinstance(ground_truth, Mapping) else ground_truth
    ids = ids or []
    if isinstance(ids, str):
        return [ids]
    return [str(i) for i in ids]


def _abstain_score(
    components: dict[str, float],
    weights: dict[str, float],
    s: QueryRewriteConfig,
    info: Mapping[str, Any],
    no_retrieval: bool,
    abstained: bool,
) -> dict[str, float]:
    """The reward of a settled retrieve-or-not decision (:func:`abstain_components`), in `compute_score`'s
    keys; ``recall_at_5`` only on a retrieval turn (0: nothing was retrieved)."""
    quality = (components["judge"] + 1.0) / 2.0
    out = {**components, "quality": quality, "abstained": float(abstained)}
    if not no_retrieval:
        out["recall_at_5"] = 0.0
    if s.reward_mode == "seed_hybrid":
        z = float(info.get("seed_hybrid_z", 0.0))
        hybrid = hybrid_reward(quality, z, s.seed_hybrid.gpt5_weight, s.seed_hybrid.grpo_weight)
        return {"score": hybrid, **out, "selected_z": z}
    score = mix_rewards(components, weights)
    assert score is not None
    return {"score": score, **out}


def _unparsed_score(s: QueryRewriteConfig, info: Mapping[str, Any], weights: dict[str, float]) -> dict[str, float]:
    """The score of a reply that does not parse: every component at its floor (seed_hybrid: quality 0)."""
    if s.reward_mode == "seed_hybrid":  # quality 0 in the users' formula
        z = float(info.get("seed_hybrid_z", 0.0))
        hybrid = hybrid_reward(0.0, z, s.seed_hybrid.gpt5_weight, s.seed_hybrid.grpo_weight)
        return {"score": hybrid, "quality": 0.0, "judge": -1.0, "format": 0.0, "selected_z": z, **_NOT_CUT}
    components: dict[str, float | None] = {"judge": -1.0, "retrieval_rank": 0.0, "format": 0.0}
    out0 = {"quality": 0.0, "judge": -1.0, "retrieval_rank": 0.0, "format": 0.0, "recall_at_5": 0.0}
    for name in (ENTITY, GRADED):
        if weights.get(name):  # weighted: at its floor too
            components[name] = out0[name] = 0.0
    score = mix_rewards(components, weights)
    assert score is not None
    return {"score": score, **out0, **_NOT_CUT}


def first_documents(result: Mapping[str, Any], k: int) -> dict[str, Any]:
    """`result` with only its first `k` documents (what the judge, recall@5 and the samples files see when
    the rank reward read deeper)."""
    return {**result, "response": list(result.get("response") or [])[:k]}


async def _retrieve_both(
    rag: QueryRewriteRAGConfig,
    info: Mapping[str, Any],
    parsed: ParsedRewrite,
    query: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The RAG service's answers for the candidate (``/rag/chat_8b``) and the reference (``/rag/chat``)."""
    # the policy's profile/summary where it gave them, else the row's own (the input)
    fields = rag_request_fields(info, query, parsed.user_profile, parsed.history_summary)
    depth = fetch_depth(rag)
    client = rag_client(rag, depth)
    if not query.strip():  # nothing to search with: no /rag/chat_8b call, no documents
        try:
            reference = await client.chat(**{k: v for k, v in fields.items() if k in CHAT_FIELDS})
        except RAGError as exc:
            raise RewardFailure(f"RAG /rag/chat failed: {exc.error}") from None
        return abstained_result(), reference
    return await shared_both(client, (rag.url, rag.corpus, depth), fields)


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """The query-rewrite reward with verl's contract: :func:`score_reply` with the settings that the flat
    keywords `kwargs` (``reward.kwargs``) name over the defaults in ``mix`` mode (the names:
    :data:`~queryrl.apps.query_rewrite.config.FLAT_KEYS`, e.g. ``judge_model`` for ``judge.model``).

    Raises:
        RewardFailure: RAG or judge failure, or inconsistent positions: the sample fails.
        ConfigError: an unknown keyword or a bad value, naming it.
    """
    return await score_reply(flat_settings(kwargs), data_source, solution_str, ground_truth, extra_info)


async def score_reply(
    s: QueryRewriteConfig,
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The query-rewrite reward of one policy output under the settings `s` (see the module doc).

    Args:
        s: the settings, ``app.query_rewrite`` (:class:`~queryrl.apps.query_rewrite.config.QueryRewriteConfig`).
        data_source: unused (any query-rewrite source).
        solution_str: the policy's reply, a JSON object with ``rewritten_query`` (and optionally
            ``user_profile``, ``history_summary``), or the query itself for a ``text``-format row.
        ground_truth: ``{"gold_doc_ids": [...]}`` (or the list itself); may be empty.
        extra_info: the row's ``extra_info``: ``contexts`` (ending with the current user turn), the four
            ids (``tenant_id``, ``contact_id``, ``account_id``, ``message_id``), ``user_profile``,
            ``history_summary`` (sent to ``/rag/chat_8b`` where the reply has none), ``answer_fields``.

    Returns:
        ``score`` (the weighted mix) and the components and diagnostics as floats: ``quality``,
        ``judge``, ``retrieval_rank`` (absent without gold), ``format``, ``format/truncated`` (1: the reply
        was cut off after a complete query), ``recall_at_5`` and
        ``reference_recall_at_5`` (absent without gold) (with ``position_swap`` the
        consistency is counted in :func:`pop_reward_metrics`, ``judge/position_consistency``). Where the
        RAG service was asked, also what a person reads in the samples files: ``candidate_query``,
        ``reference_query``, ``candidate_documents`` and ``reference_documents`` (:func:`shown_documents`,
        gold marked) and, where the judge was asked, ``judge_verdict`` (:func:`~.reward.judge.readable_verdict`; with
        ``position_swap`` also ``judge_verdict_swapped``); ``intent/changed`` (1 / 0) and ``intent_check``
        (``{"kept", "code", "reason"}``) where the row has a conversation.

    Raises:
        RewardFailure: RAG or judge failure, or inconsistent positions: the sample fails.
        ValueError: a bad configuration.
    """
    del data_source
    info = dict(extra_info or {})
    weights = reward_weights(s)
    gold = _gold(ground_truth)
    answer_format = info.get("answer_format") or "json"
    parsed, salvaged = _parse_reply(solution_str, answer_format, s)
    mode, penalty = s.reward_mode, s.intent_penalty
    if parsed is None:  # the policy's fault: every component at its floor, no service call
        unparsed = _unparsed_score(s, info, weights)
        return with_intent(unparsed, rewrite_intent(None, info, False), penalty, mode, weights)

    query = normalise_rewrite(parsed.rewritten_query)
    # a cut-off answer that lost the profile/summary its prompt asked for gets partial format credit
    missing_fields = parsed.truncated and check_answer_fields(info.get("answer_fields")) != (QUERY_FIELD,)
    cut = {"format/truncated": float(parsed.truncated), "parsed": 1.0}
    if answer_format == "text":  # text after the one-line answer: retrieved with, format 0
        cut["format/trailing"] = float(parsed.trailing)
        salvaged = parsed.trailing
    no_retrieval = no_retrieval_turn(gold, info.get("kind") or info.get("turn_type"))
    intent = rewrite_intent(query, info, no_retrieval)  # the offline intent check (reward_intent.py)
    decided = abstain_components(query, no_retrieval, bool(gold))
    if decided is not None:  # the retrieve-or-not decision alone settles it: no RAG or judge call
        for name in (ENTITY, GRADED):  # at the top for a right abstention, else the floor (as retrieval_rank)
            if weights.get(name):
                decided[name] = 1.0 if decided["retrieval_rank"] > 0 else 0.0
        if missing_fields:
            decided["format"] = TRUNCATED_MISSING_FIELDS_CREDIT
        if salvaged:
            decided["format"] = 0.0
        if not no_retrieval:  # a turn with gold answered with no query: counted (the app watches the share)
            cut["empty_query"] = float(not query)
        decided_score = {**_abstain_score(decided, weights, s, info, no_retrieval, abstained=not query), **cut}
        return with_intent(decided_score, intent, penalty, mode, weights)
    contexts = row_contexts(info)
    # an empty query on an unlabelled turn is not sent: its result is no documents (as eval reads it)
    cut["empty_query"] = float(not query)
    candidate, reference = await _retrieve_both(s.rag, info, parsed, query)
    ranked = list(candidate.get("response") or [])  # to rank_depth, for the rank rewards
    ranked_ids = [str(d.get("doc_id")) for d in ranked]
    if s.rag.rank_depth:
        candidate, reference = first_documents(candidate, s.rag.top_k), first_documents(reference, s.rag.top_k)
    out: dict[str, Any] = {"format": format_reward(True, query, s.max_query_chars, missing_fields), "abstained": 0.0}
    out.update(cut)
    if s.unparsed == "retrieve" and answer_format == "json":
        out["format/plain_text"] = float(salvaged)
    if salvaged:
        out["format"] = 0.0  # retrieved with, but not the answer the prompt asked for
    titles = (_gold_titles(ground_truth), s.rag.top_k)
    out |= _retrieval_components(query, candidate, reference, ranked_ids, gold, weights, titles)
    if weights.get(GRADED) and gold:
        out[GRADED] = graded_component(query, ranked, gold, info, out["reference_query"], intent)
    return await _judged_score(out, s, info, contexts, (candidate, reference), gold, intent, weights)


def _parse_reply(solution_str: str, answer_format: str, s: QueryRewriteConfig) -> tuple[ParsedRewrite | None, bool]:
    """The policy's reply parsed in `answer_format`, and whether it was salvaged: with ``unparsed=retrieve``, a
    JSON reply that does not parse is read as plain text (its first line the query; retrieved with, format 0)."""
    parsed = parse_answer(solution_str, max(s.max_query_chars, MAX_QUERY_CHARS), answer_format)
    if parsed is None and answer_format == "json" and s.unparsed == "retrieve":
        text_query = plain_text_query(solution_str, s.max_query_chars)
        if text_query:
            return ParsedRewrite(text_query), True
    return parsed, False


def _retrieval_components(
    query: str,
    candidate: dict[str, Any],
    reference: dict[str, Any],
    ranked_ids: list[str],
    gold: list[str],
    weights: dict[str, float],
    titles: tuple[list[str], int],
) -> dict[str, Any]:
    """What the samples files show (the two queries and their documents, gold marked) and, with gold, the rank
    reward and recall@5 of both; without gold the rank's weight is dropped from `weights`. Where
    ``retrieval_entity`` is weighted, its share over the first ``top_k`` documents (`titles`: the gold titles
    and ``top_k``); a row with gold but no ``gold_titles`` then fails (its data cannot give that reward)."""
    out: dict[str, Any] = {  # for the samples files and the run page (non-numbers: not metrics)
        "candidate_query": query,
        "reference_query": str(reference.get("rewritten_query") or ""),
        "candidate_documents": shown_documents(candidate, gold),
        "reference_documents": shown_documents(reference, gold),
    }
    cand_ids = [str(d.get("doc_id")) for d in candidate.get("response") or []]
    ref_ids = [str(d.get("doc_id")) for d in reference.get("response") or []]
    rank = retrieval_rank_reward(ranked_ids, gold) if gold else None
    if rank is None:
        weights.pop("retrieval_rank")  # no gold: not applicable, its weight is dropped
        weights.pop(ENTITY, None)
        weights.pop(GRADED, None)
    else:
        out["retrieval_rank"] = rank
        out["recall_at_5"] = recall_at_k(cand_ids, gold, 5)
        out["reference_recall_at_5"] = recall_at_k(ref_ids, gold, 5)
        if weights.get(ENTITY):
            gold_titles, top_k = titles
            if not gold_titles:
                raise RewardFailure(
                    "app.query_rewrite.weights.retrieval_entity is set but this row's ground_truth has no "
                    "gold_titles (KdConv rows carry them; other data: add the gold documents' titles)"
                )
            cand_titles = [str(d.get("title") or "") for d in candidate.get("response") or []]
            out[ENTITY] = retrieval_entity_reward(cand_titles, gold_titles, top_k)
    return out


async def _judged_score(
    out: dict[str, Any],
    s: QueryRewriteConfig,
    info: dict[str, Any],
    contexts: list[dict[str, str]],
    results: tuple[dict[str, Any], dict[str, Any]],
    gold: list[str],
    intent: Any,
    weights: dict[str, float],
) -> dict[str, Any]:
    """`out` completed with the judge's verdict (when weighted, or in the users' hybrid mode) and the score."""
    candidate, reference = results
    sources = intent_sources(info)
    if s.reward_mode == "seed_hybrid":  # the users' compute_final_reward: the selected candidate's hybrid reward
        quality, extra = await shared_judge(s.judge, contexts, candidate, reference, gold, s.rag.top_k, sources)
        z = float(info.get("seed_hybrid_z", 0.0))
        hybrid = hybrid_reward(quality, z, s.seed_hybrid.gpt5_weight, s.seed_hybrid.grpo_weight)
        seed = {"score": hybrid, **out, "quality": quality, "judge": 2.0 * quality - 1.0, "selected_z": z, **extra}
        return with_intent(seed, intent, s.intent_penalty, s.reward_mode, weights)
    if weights.get("judge", 0.0) != 0.0:
        quality, extra = await shared_judge(s.judge, contexts, candidate, reference, gold, s.rag.top_k, sources)
        (judge_reward,) = group_judge_rewards([quality])
        assert judge_reward is not None
        out.update(quality=quality, judge=judge_reward, **extra)
    score = mix_rewards({k: out.get(k) for k in weights}, weights)
    if score is None:  # unreachable: every weighted component was computed above
        raise RewardFailure("a weighted reward component is missing")
    return with_intent({"score": score, **out}, intent, s.intent_penalty, s.reward_mode, weights)


class QueryRewriteReward:
    """The application's reward object: :func:`score_reply` under its settings, and its side metrics.

    The manager calls it like ``compute_score`` (an ``async`` call, verl's contract); the trainer adds
    :meth:`pop_metrics` to each step's metrics. The clients and caches it uses are shared per
    process (one RAG client per service and settings, one LRU of candidate calls per event loop).
    It pickles (its settings are a dataclass), for the process-pool manager.

    Args:
        settings: ``app.query_rewrite`` as its dataclass (:meth:`from_config` reads it from a run's config).
    """

    def __init__(self, settings: QueryRewriteConfig) -> None:
        self.settings = settings

    @classmethod
    def from_config(cls, cfg: DictConfig) -> QueryRewriteReward:
        """The reward of a run's config: its ``app.query_rewrite`` node (:func:`~..config.settings_of`)."""
        return cls(settings_of(cfg))

    async def __call__(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        out = await score_reply(self.settings, data_source, solution_str, ground_truth, extra_info)
        if self.settings.reference_score:  # grpo_reference's baseline: the reference's own rewrite, scored alike
            info = extra_info or {}
            reply = reference_reply(await reference_query(self.settings.rag, info, out), info.get("answer_format"))
            settings = replace(self.settings, reference_score=False)
            out[REFERENCE_SCORE] = (await score_reply(settings, data_source, reply, ground_truth, info))["score"]
        return out

    def pop_metrics(self) -> dict[str, float]:
        """The RAG counters and judge consistency since the last call (:func:`pop_reward_metrics`)."""
        return pop_reward_metrics()
