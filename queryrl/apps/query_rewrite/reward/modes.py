"""Reward modes of the query-rewrite application (docs/query-rewriter.md), as pure per-sample functions.

Notation: ``G`` candidates (rewrites) per prompt; ``q`` a judged quality in [0, 1]
(:func:`queryrl.apps.query_rewrite.reward.judging.quality_from_verdict`). ``None`` anywhere means "failed /
not applicable": the sample is dropped, never scored 0.

Modes and their scales:

- ``group_judge`` (the sound default with a judge): every distinct candidate is judged against the
  reference result, reward ``2q - 1`` in [-1, 1] (:func:`group_judge_rewards`); GRPO then normalises
  over the whole group, so each update has a proper group baseline.
- ``retrieval_rank``: ConvSearch-R1's rank-incentive reward of the gold documents, in [0, 2]
  (:func:`retrieval_rank_reward`); only where gold exists.
- ``retrieval_entity`` (weight 0 unless set): the share of the first ``top_k`` documents about a gold
  document's title, in [0, 1] (:func:`retrieval_entity_reward`); needs ``gold_titles`` in the ground truth.
- ``retrieval_graded`` (weight 0 unless set): the gold document's log-discounted rank and its score margin
  over the best other document, in [0, 1], zero for a stuffed query or one that changes the question
  (:func:`retrieval_graded_reward`).
- ``format``: 1 / 0 (:func:`format_reward`); an empty ``rewritten_query`` is well-formed (it abstains); a
  reply cut off after a complete query counts as parsed (0.5 when it lost fields the prompt asked for).
- abstention (:func:`abstain_components`): on a turn labelled as needing no retrieval, an empty query gets
  every component at its top (judge 1, retrieval_rank 2, format 1) and a non-empty one the floor of the
  retrieval components (judge -1, retrieval_rank 0; format 1: it is well-formed), with no RAG or judge
  call; on a turn with gold, an empty query gets that same floor (it retrieves nothing).
- any weighted mix of the above (:func:`mix_rewards`).
- ``seed_hybrid``: the users' hybrid recipe (their spec v4.0) as written (:func:`grpo_selector_scores`,
  :func:`select_candidate`, :func:`hybrid_reward`). Kept faithful to their code, and statistically odd:

  * its "GRPO advantage" is the z-score of the candidates' sequence log-probs, not an advantage of
    any reward: it measures how confident the policy was in a candidate relative to its siblings;
  * adding ``0.15 * z`` to the reward therefore pays the model for being confident, which pushes
    towards likelier (shorter, more generic) rewrites and entropy collapse, whatever the judge says;
  * with ``max_log_prob`` the selected candidate is always the group's most likely one, so that
    term is always >= 0 (a constant-ish bonus); with ``weighted_sample`` it is random but still
    biased upward;
  * only one candidate per group is judged and updated, so the policy gradient has no group
    baseline: the update is a REINFORCE step on a single, non-uniformly selected sample, and the
    selection rule (not the policy's sampling distribution) decides what gets reinforced.

  Use ``group_judge`` unless reproducing their runs.

Identical rewrites in a group share one RAG call and one judge call (:func:`dedupe`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from queryrl.apps.query_rewrite.prompts import MAX_QUERY_CHARS, ParsedRewrite, parse_rewrite, parse_text_answer

SELECTION_METHODS = ("max_log_prob", "weighted_sample")


# --- format -------------------------------------------------------------------------------------


TRUNCATED_MISSING_FIELDS_CREDIT = 0.5  # a cut-off answer that lost the profile/summary it was asked for


def format_reward(parsed_ok: bool, query: str | None, max_chars: int, missing_fields: bool = False) -> float:
    """1.0 when the output parsed and the rewritten query is at most `max_chars` characters (after
    stripping; an empty query is well-formed: it says "no retrieval needed"), else 0.0.

    A reply cut off at the token budget after a complete query (``ParsedRewrite.truncated``) counts as
    parsed. When only the query was asked for (the default), it gets full credit: the answer's content is
    all there, only the closing brace (or fields nobody asked for) is missing. When the prompt also asked
    for ``user_profile`` / ``history_summary`` and the cut lost them (`missing_fields`), it gets
    :data:`TRUNCATED_MISSING_FIELDS_CREDIT`: the query is usable, the answer is not complete.
    """
    if not parsed_ok or query is None or len(query.strip()) > max_chars:
        return 0.0
    return TRUNCATED_MISSING_FIELDS_CREDIT if missing_fields else 1.0


def parse_answer(
    text: Any, max_query_chars: int = MAX_QUERY_CHARS, answer_format: str | None = "json"
) -> ParsedRewrite | None:
    """:func:`~queryrl.apps.query_rewrite.prompts.parse_rewrite` with the abstention allowed: an empty (or
    blank) ``rewritten_query`` parses as ``ParsedRewrite("", ...)``; a reply cut off after a complete query
    parses with ``truncated=True``. For ``answer_format="text"`` (the row's ``extra_info.answer_format``),
    :func:`~queryrl.apps.query_rewrite.prompts.parse_text_answer` instead.

    ``parse_rewrite`` refuses a blank query by default (for logs and other callers an empty query is no
    query); the reward and the evaluation read it as "this turn needs no retrieval". Never raises.
    """
    if answer_format == "text":
        return parse_text_answer(text, max_query_chars)
    return parse_rewrite(text, max_query_chars=max_query_chars, allow_empty=True)


# --- abstention: turns that need no retrieval ---------------------------------------------------

ABSTAIN_RIGHT: dict[str, float] = {"judge": 1.0, "retrieval_rank": 2.0, "format": 1.0}  # q = 1
ABSTAIN_WRONG: dict[str, float] = {"judge": -1.0, "retrieval_rank": 0.0, "format": 1.0}  # q = 0


def abstain_components(query: str, no_retrieval: bool, has_gold: bool) -> dict[str, float] | None:
    """The reward components decided without any retrieval, or None when retrieval must decide.

    - a no-retrieval turn and an empty query: every component at its top (:data:`ABSTAIN_RIGHT`);
    - a no-retrieval turn and a non-empty query: judge -1 and retrieval_rank 0 (:data:`ABSTAIN_WRONG`),
      as for a rewrite that retrieved only noise and lost to the reference; format 1 (well-formed);
    - a turn with gold and an empty query: the same floor (nothing retrieved, the lowest reward a
      well-formed answer gets);
    - otherwise (a non-empty query on a retrieval turn; an empty one on an unlabelled turn): None.
    """
    empty = not query.strip()
    if no_retrieval:
        return dict(ABSTAIN_RIGHT if empty else ABSTAIN_WRONG)
    if empty and has_gold:
        return dict(ABSTAIN_WRONG)
    return None


# --- retrieval rank (ConvSearch-R1) -------------------------------------------------------------


def retrieval_rank_reward(
    result_doc_ids: Sequence[str], gold_doc_ids: Sequence[str], k: int = 10, depth: int = 100
) -> float | None:
    """ConvSearch-R1's rank-incentive reward (Zhu et al. 2025, arXiv:2505.15776, Stage 2 reward shaping).

    With ``r`` the 1-based rank of the best-ranked gold document among `result_doc_ids`::

        R(r) = 2 - (r - 1) / (k - 1)            1 <= r <= k        (k = 10: (19 - r) / 9, from 2 to 1)
               (depth - r) / (depth - k)        k < r <= depth     (depth = 100: (100 - r) / 90, to 0)
               0                                 gold not retrieved within `depth`

    The defaults reproduce the authors' released ``cal_reward`` (BeastyZ/ConvSearch-R1,
    ``verl/utils/reward_score/rewrite_r1.py``): a dense signal inside the top 10, a weak one down to
    rank 100, instead of a sparse hit@k. Differences: the paper scores the rank of its single gold
    passage; with several gold documents the best-ranked one counts here. The paper ranks to depth
    100; here the rank can only be as deep as the RAG result list, so a gold document outside the
    returned list scores 0. The paper's format penalty (-0.1 replacing the reward) is not applied
    here: mix in :func:`format_reward` instead.

    Returns:
        the reward in [0, 2], or None when there is no gold (not applicable).
    """
    if k < 2 or depth <= k:
        raise ValueError(f"need k >= 2 and depth > k, got k={k}, depth={depth}")
    gold = set(gold_doc_ids)
    if not gold:
        return None
    rank = next((i + 1 for i, doc in enumerate(result_doc_ids) if doc in gold), None)
    if rank is None or rank > depth:
        return 0.0
    if rank <= k:
        return 2.0 - (rank - 1) / (k - 1)
    return (depth - rank) / (depth - k)


def retrieval_entity_reward(result_titles: Sequence[str], gold_titles: Sequence[str], k: int) -> float | None:
    """The share of the first `k` retrieved documents whose title is a gold document's title, in [0, 1].

    A graded-relevance reward (documents about the gold entity count as partly relevant, as in graded
    nDCG judgements): two rewrites that both miss the gold document, one retrieving the right entity's
    other documents and one retrieving another entity's, score alike under :func:`retrieval_rank_reward`
    and apart here. Fewer than `k` documents count as misses (the denominator is `k`).

    Returns:
        the share, or None when there are no gold titles (not applicable).
    """
    if k < 1:
        raise ValueError(f"need k >= 1, got k={k}")
    gold = set(gold_titles)
    if not gold:
        return None
    return sum(title in gold for title in list(result_titles)[:k]) / k


GRADED_LENGTH_SLACK = 1.5  # full graded reward up to 1.5x the longer of the turn and the reference's query


def length_factor(query_chars: int, budget_chars: int) -> float:
    """The anti-stuffing factor of :func:`retrieval_graded_reward`: 1 for a query of at most `budget_chars`
    characters, falling linearly to 0 at twice the budget (and 0 beyond). A budget below 1 counts as 1."""
    budget = max(1, budget_chars)
    return min(1.0, max(0.0, 2.0 - query_chars / budget))


def retrieval_graded_reward(
    doc_ids: Sequence[str],
    scores: Sequence[float],
    gold_doc_ids: Sequence[str],
    length: float = 1.0,
    intent_kept: bool = True,
) -> float | None:
    """A graded retrieval reward in [0, 1] that differs between rewrites retrieving the same documents.

    With ``r`` the 1-based rank of the best-ranked gold document in `doc_ids` (the service's list, to
    ``rag.rank_depth``), ``s`` the documents' `scores` (the service's, e.g. BM25 over the top score; assumed
    >= 0), ``top = max(s)`` and ``other`` the best non-gold score in the list (0 when none)::

        discount   = 1 / log2(1 + r)                          (nDCG's rank discount, Jarvelin & Kekalainen 2002)
        separation = clip((1 + (s_gold - other) / top) / 2, 0, 1)
        R          = length * (discount + separation) / 2

    ``separation`` is 0.5 when gold ties the best other document, above it when gold stands clear of every
    other document (the entity *and* the asked attribute), below when it trails: it changes continuously
    with the scores, so two rewrites with the same top 5 in the same order still score apart. It is measured
    against the best *other* document, not the top one, so a query that drops the entity (gold tied with
    every entity's document of that attribute) gets 0.5, not the top (lever 20's replay of the whole-index
    margin). A gold document outside the list, a query the intent check marks as changing the question
    (`intent_kept` false) or one at twice its length budget (`length` 0, :func:`length_factor`) scores 0.
    Sources: a rank incentive as in ConvSearch-R1 (arXiv:2505.15776, :func:`retrieval_rank_reward`), with
    nDCG's log discount instead of its linear one; the score margin is this project's (the replay
    ``experiments/replay_flat_groups.py`` measured it), not taken from a paper.

    Returns:
        the reward, or None when there is no gold (not applicable).

    Raises:
        ValueError: `doc_ids` and `scores` of different lengths, or `length` outside [0, 1].
    """
    if len(doc_ids) != len(scores):
        raise ValueError(f"need one score per document, got {len(doc_ids)} documents and {len(scores)} scores")
    if not 0.0 <= length <= 1.0:
        raise ValueError(f"length must be in [0, 1], got {length}")
    gold = set(gold_doc_ids)
    if not gold:
        return None
    rank = next((i + 1 for i, doc in enumerate(doc_ids) if doc in gold), None)
    if rank is None or not intent_kept or length == 0.0:
        return 0.0
    top = max(float(s) for s in scores)
    others = [float(s) for doc, s in zip(doc_ids, scores, strict=True) if doc not in gold]
    separation = 0.0
    if top > 0:
        margin = (float(scores[rank - 1]) - max(others, default=0.0)) / top
        separation = min(1.0, max(0.0, (1.0 + margin) / 2.0))
    return length * (1.0 / float(np.log2(1 + rank)) + separation) / 2.0


# --- seed_hybrid (the users' selector and final reward) ----------------------------------------------------------


def grpo_selector_scores(logprobs: Sequence[float] | np.ndarray) -> np.ndarray:
    """The users' ``compute_grpo_scores``: z-scores of the candidates' sequence log-probs.

    Args:
        logprobs: (G,) the summed token log-probs of each candidate.

    Returns:
        (G,) ``(lp - mean) / std`` (population std), all zeros when ``std < 1e-8``. Computed in
        float64 (their code used float32).
    """
    lp = np.asarray(logprobs, dtype=np.float64)  # (G,)
    if lp.ndim != 1 or lp.size == 0:
        raise ValueError(f"logprobs must be a non-empty 1-D sequence, got shape {lp.shape}")
    std = lp.std()
    if std < 1e-8:
        return np.zeros_like(lp)
    return (lp - lp.mean()) / std


def select_candidate(
    logprobs: Sequence[float] | np.ndarray, method: str, rng: np.random.Generator
) -> tuple[int, float]:
    """The users' ``GRPOSelector.select_best``: (index of the chosen candidate, its z-score).

    ``max_log_prob``: the argmax of the z-scores (the first on ties). ``weighted_sample``: drawn from
    ``softmax(z)`` with `rng` (a seeded ``np.random.Generator``; their code used the global RNG).
    """
    z = grpo_selector_scores(logprobs)  # (G,)
    if method == "max_log_prob":
        index = int(np.argmax(z))
    elif method == "weighted_sample":
        w = np.exp(z - z.max())
        index = int(rng.choice(z.size, p=w / w.sum()))
    else:
        raise ValueError(f"unknown selection method {method!r}; use one of {SELECTION_METHODS}")
    return index, float(z[index])


def hybrid_reward(quality: float, grpo_advantage: float, gpt5_weight: float = 0.85, grpo_weight: float = 0.15) -> float:
    """The users' ``compute_final_reward``: ``w_j * (2q - 1) + w_g * grpo_advantage``.

    Raises:
        ValueError: weights negative or not summing to 1 (within 1e-6), or `quality` outside [0, 1].
    """
    if gpt5_weight < 0 or grpo_weight < 0 or abs(gpt5_weight + grpo_weight - 1.0) > 1e-6:
        raise ValueError(f"seed_hybrid weights must be >= 0 and sum to 1, got {gpt5_weight} + {grpo_weight}")
    if not 0.0 <= quality <= 1.0:
        raise ValueError(f"quality must be in [0, 1], got {quality}")
    return gpt5_weight * (2.0 * quality - 1.0) + grpo_weight * grpo_advantage


# --- group_judge and mixes ----------------------------------------------------------------------


def group_judge_rewards(qualities: Sequence[float | None]) -> list[float | None]:
    """Each candidate's judged quality ``q`` -> reward ``2q - 1`` in [-1, 1]; None (failed) stays None."""
    return [None if q is None else 2.0 * q - 1.0 for q in qualities]


def mix_rewards(components: Mapping[str, float | None], weights: Mapping[str, float]) -> float | None:
    """``sum_c weights[c] * components[c]`` over the components with a nonzero weight.

    Weights need not sum to 1 (the components have different scales: judge [-1, 1], retrieval_rank
    [0, 2], format [0, 1]). A component with weight 0 is ignored even when missing or None. A component
    with a nonzero weight that is None (failed judge, no gold) makes the whole reward None: the sample
    is dropped rather than scored on the remaining terms, which would silently change its scale.

    Raises:
        ValueError: a negative weight, all weights zero, or a nonzero weight for a component not given.
    """
    if any(w < 0 for w in weights.values()):
        raise ValueError(f"reward weights must be >= 0, got {dict(weights)}")
    active = {name: w for name, w in weights.items() if w != 0}
    if not active:
        raise ValueError("all reward weights are zero")
    missing = sorted(set(active) - set(components))
    if missing:
        raise ValueError(f"no component(s) {missing} to weight; given: {sorted(components)}")
    total = 0.0
    for name, w in active.items():
        value = components[name]
        if value is None:
            return None
        total += w * value
    return total


# --- sharing work across identical rewrites -----------------------------------------------------


def normalise_rewrite(text: str) -> str:
    """Whitespace-normalised rewrite: stripped, every run of whitespace (Unicode, so the full-width space
    too) becomes one ASCII space. Case and punctuation are kept: they may change what a retriever finds."""
    return " ".join(text.split())


def dedupe(rewrites: Sequence[str]) -> tuple[list[str], list[int]]:
    """(unique normalised rewrites in first-seen order, index_map) with ``unique[index_map[i]]`` the
    normalised ``rewrites[i]``: one RAG call and one judge call per unique rewrite, results fanned out
    with ``[results[j] for j in index_map]``."""
    unique: list[str] = []
    where: dict[str, int] = {}
    index_map = []
    for text in rewrites:
        key = normalise_rewrite(text)
        if key not in where:
            where[key] = len(unique)
            unique.append(key)
        index_map.append(where[key])
    return unique, index_map
