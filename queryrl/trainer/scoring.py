"""Generation with rewards in flight: each micro-batch's rewards start as soon as it exists.

The rollout yields one chunk per generation micro-batch; its responses are decoded and
submitted to the reward manager at once, so a slow reward (an LLM judge behind an API) runs
while the next chunks generate. ``timing_s/reward_wait`` is what the step still waits for
rewards after the last chunk: with overlap it approaches one reward latency, without it the
whole scoring time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from queryrl.algos import ADVANTAGE_ESTIMATORS
from queryrl.algos.kl import apply_kl_in_reward
from queryrl.engine.batch import Batch, outcome_to_tokens
from queryrl.rewards import REFERENCE_SCORE, RewardInput, RewardResult, collect_judge_metrics, summarize
from queryrl.rollout import RolloutOutput, SamplingParams
from queryrl.trainer.metrics import PhaseTimer, identical_group_fraction, unscored_rows, zero_std_group_fraction
from queryrl.trainer.samples import NOT_TRAINED


def trained_token_ids(out: RolloutOutput) -> list[list[int]]:
    """Each response's trained token ids (where ``response_mask`` is 1), read with one ``tolist`` per tensor
    rather than two tensor ops per row."""
    return [
        [t for t, m in zip(ids, mask, strict=True) if m]
        for ids, mask in zip(out.response_ids.tolist(), out.response_mask.tolist(), strict=True)
    ]


def decode_responses(tokenizer: Any, out: RolloutOutput) -> list[str]:
    """The text of each response's trained tokens (special tokens dropped)."""
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in trained_token_ids(out)]


def reward_inputs(
    out: RolloutOutput,
    texts: list[str],
    items: list[Any],
    step: int | None = None,
    progress: Mapping[str, Any] | None = None,
) -> list[RewardInput]:
    """What the reward function sees for each response of `out` (verl's contract; plus, for a TRL-style
    function, the data row, the response's trained token ids, the training `step` and where training
    stands, `progress`: ``max_steps``, ``epoch``, ``num_train_epochs``)."""
    inputs = []
    lengths = out.response_mask.sum(dim=-1).long().tolist()
    extras = out.extras if out.extras is not None else [{}] * len(out)
    ids = trained_token_ids(out)
    for prompt, text, length, extra, completion_ids in zip(
        out.prompt_index.tolist(), texts, lengths, extras, ids, strict=True
    ):
        row = items[prompt].row
        reward_model = row.get("reward_model") or {}
        inputs.append(
            RewardInput(
                data_source=str(row.get("data_source", "")),
                solution_str=text,
                ground_truth=reward_model.get("ground_truth"),
                extra_info=dict(row.get("extra_info") or {}) | extra,  # + the rollout's (num_tool_calls, ...)
                response_length=int(length),
                row=row,
                completion_ids=completion_ids,
                step=step,
                progress=progress,
                group=prompt,
            )
        )
    return inputs


def train_sampling(cfg: Any, n: int | None = None) -> SamplingParams:
    """How a training step samples (``rollout.*``, ``data.max_response_length``), `n` samples a prompt (default
    ``rollout.n``): the trainer's and ``queryrl pass-rate``'s, so a measured pass rate is the run's own."""
    return SamplingParams(
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        n=int(n or cfg.rollout.n),
        do_sample=True,
        max_new_tokens=cfg.data.max_response_length,
    )


Selector = Callable[[RolloutOutput], tuple[Tensor, list[dict[str, Any]]]]


def generate_and_score(
    rollout: Any,
    reward: Any,
    tokenizer: Any,
    items: list[Any],
    sampling: SamplingParams,
    timer: PhaseTimer,
    device: torch.device,
    select: Selector | None = None,
    step: int | None = None,
    progress: Mapping[str, Any] | None = None,
) -> tuple[Batch, list[RewardResult]]:
    """Generate for `items` and score every response; rewards overlap generation.

    A reward that scores calls as a whole (:func:`calls_per_batch`) gets one call on every response.
    With `select` (e.g. the query-rewrite app's seed_hybrid selector), everything is generated first, then
    ``select(output)`` returns the rows to keep and, for each kept row, extra ``extra_info`` entries
    for its reward; only those rows are scored and returned. `step` (the training step; None
    outside training) and `progress` reach a TRL-style reward function as its ``trainer_state``.

    Phases: ``gen`` (generation, decoding and submitting), then ``reward_wait``.
    """
    chunks: list[RolloutOutput] = []
    texts: list[str] = []
    pending = []
    whole = select is not None or calls_per_batch(reward)  # one call on every response, after generation
    with timer("gen"):
        prompts = [it.input_ids for it in items]
        # a backend that chooses per row (the multi-turn agent loop) also gets the data rows
        rows = {"rows": [it.row for it in items]} if getattr(rollout, "wants_rows", False) else {}
        for chunk in rollout.generate_chunks(prompts, sampling, **rows):
            chunk_texts = decode_responses(tokenizer, chunk)
            if not whole:
                pending.append(reward.submit(reward_inputs(chunk, chunk_texts, items, step, progress)))
            chunks.append(chunk)
            texts += chunk_texts
        out = RolloutOutput.concat(chunks, int(tokenizer.pad_token_id))
        extras: list[dict[str, Any]] = [{} for _ in range(len(out))]
        if select is not None:
            keep, extras = select(out)
            out = out.select(keep)
            texts = [texts[int(i)] for i in keep]
        if whole:
            inputs = reward_inputs(out, texts, items, step, progress)
            for inp, extra in zip(inputs, extras, strict=True):
                inp.extra_info.update(extra)
            pending.append(reward.submit(inputs))
    with timer("reward_wait"):
        results = [r for p in pending for r in p.result()]
    batch = Batch.from_rollout(
        out,
        {
            "row": [items[int(i)].row for i in out.prompt_index],
            "response_text": texts,
            "rollout_extras": out.extras if out.extras is not None else [{} for _ in range(len(out))],
        },
    ).to(device)
    return batch, results


def calls_per_batch(reward: Any) -> bool:
    """Whether `reward` scores a call's inputs together (a TRL-style function, the ``batch`` manager): then it
    gets the whole generation batch in one call, as TRL calls reward functions, so a group is never split
    across calls; per-sample functions are scored chunk by chunk, overlapping generation."""
    from queryrl.rewards.batch_manager import BatchRewardManager
    from queryrl.rewards.trl_style import TRLRewardFunction

    return isinstance(reward, BatchRewardManager) or isinstance(getattr(reward, "fn", None), TRLRewardFunction)


class Scored(NamedTuple):
    """A scored batch: the rows that train, the reward metrics, their indices, and the failed rows."""

    batch: Batch
    metrics: dict[str, float]
    kept: Tensor
    failed: Batch


GROUP_MATE_FAILED = f"{NOT_TRAINED}another sample of its group failed its reward"


def apply_scores(batch: Batch, results: list[RewardResult], drop_failed_groups: bool = False) -> Scored:
    """Put each score on its sequence's last trained token and set the failed samples apart.

    Every row gets ``non_tensor`` entries ``score`` (None: failed), ``reward_parts`` (the reward's other
    numbers: judge, retrieval_rank, format, ...), ``reward_info`` (its other values: retrieved documents,
    a verdict) and ``reward_error``, for the samples files. The failed rows are returned apart: they are
    not trained on, but a person wants to see them. With `drop_failed_groups` (``reward.drop_failed_groups``)
    the other samples of a failed sample's group go with it (their ``reward_error`` says why, their score is
    kept for the samples files): the samples that could be scored are not a fair sample of the group when
    failures fall on one kind (in a RAG outage, every rewrite that needed retrieval), and the update would
    lean toward the kind that needs no service. ``reward/dropped_group_mates`` counts them.
    """
    metrics = summarize(results)
    left_out = [r.failed for r in results]
    if drop_failed_groups and any(left_out):
        groups = batch.group_ids.tolist()
        failed_groups = {g for g, bad in zip(groups, left_out, strict=True) if bad}
        mates = [not bad and g in failed_groups for g, bad in zip(groups, left_out, strict=True)]
        metrics["reward/dropped_group_mates"] = float(sum(mates))
        left_out = [bad or mate for bad, mate in zip(left_out, mates, strict=True)]
    batch.non_tensor["score"] = [r.score for r in results]
    batch.non_tensor["reward_parts"] = [dict(r.extra) for r in results]
    batch.non_tensor["reward_info"] = [dict(r.info) for r in results]
    batch.non_tensor["reward_error"] = [
        r.error if r.failed else GROUP_MATE_FAILED if dropped else None
        for r, dropped in zip(results, left_out, strict=True)
    ]
    failed = batch.select([i for i, dropped in enumerate(left_out) if dropped])
    kept = torch.tensor([not dropped for dropped in left_out], dtype=torch.bool).nonzero(as_tuple=True)[0]
    batch = batch.select(kept)
    scores = torch.tensor(batch.non_tensor["score"], dtype=torch.float32)
    # an unscored sample (NaN: TRL's all-None row) trains with reward 0 and, by the trainer, advantage 0
    batch.token_scores = outcome_to_tokens(scores.nan_to_num(0.0).to(batch.response_mask.device), batch.response_mask)
    if len(batch):
        metrics["reward/zero_std_group_frac"] = zero_std_group_fraction(scores, batch.group_ids.cpu())
        metrics["rollout/identical_group_frac"] = identical_group_fraction(
            batch.response_ids, batch.response_attention_mask, batch.group_ids
        )
    return Scored(batch, metrics, kept, failed)


def batch_advantages(batch: Batch, algo: Any, kl_ctrl: Any, baselines: Tensor | None) -> dict[str, float]:
    """Set `batch`'s ``token_rewards`` (its scores, less the KL penalty where ``algo.use_kl_in_reward``, which
    also updates `kl_ctrl` with the step's KL), ``advantages`` and ``returns`` (``algo.adv_estimator``, with
    unscored samples left out: :func:`estimate_advantages`); returns the KL-penalty metrics."""
    metrics: dict[str, float] = {}
    assert batch.token_scores is not None
    if algo.use_kl_in_reward:
        assert batch.old_logprobs is not None
        assert batch.ref_logprobs is not None
        batch.token_rewards, kl = apply_kl_in_reward(
            batch.token_scores,
            batch.old_logprobs,
            batch.ref_logprobs,
            batch.response_mask,
            kl_ctrl.value,
            algo.kl_penalty,
        )
        current_kl = (kl.sum(-1) / batch.response_mask.sum(-1).clamp(min=1)).mean().item()
        metrics |= {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": kl_ctrl.value}
        kl_ctrl.update(current_kl, n_steps=len(batch))
    else:
        batch.token_rewards = batch.token_scores
    batch.advantages, batch.returns = estimate_advantages(
        ADVANTAGE_ESTIMATORS.get(algo.adv_estimator),
        batch.token_rewards,
        batch.response_mask,
        unscored=unscored_rows(batch),
        group_ids=batch.group_ids,
        values=batch.values,
        reward_baselines=None if baselines is None else baselines.to(batch.response_mask.device),
        gamma=algo.gamma,
        lam=algo.lam,
        norm_adv_by_std=algo.norm_adv_by_std,
    )
    return metrics


def estimate_advantages(
    estimator: Callable[..., tuple[Tensor, Tensor]],
    token_rewards: Tensor,
    response_mask: Tensor,
    unscored: Tensor,
    group_ids: Tensor,
    values: Tensor | None,
    reward_baselines: Tensor | None,
    **settings: Any,
) -> tuple[Tensor, Tensor]:
    """`estimator`'s advantages and returns, with TRL 1.16's unscored samples (`unscored`: no TRL-style
    function scored them) left out: the estimator runs on the scored rows alone, so an unscored sample is
    out of its group's mean and standard deviation (TRL's ``nanmean``/``nanstd``), and it gets advantage 0
    (and, with a critic, a return equal to its values: no value target). The one scored sample of a group
    whose others are all unscored gets 0 too (its own score is its baseline). It stays in the batch: its tokens
    count in the loss's normaliser and the KL term, as in TRL."""
    if not bool(unscored.any()):
        return estimator(
            token_rewards,
            response_mask,
            group_ids=group_ids,
            values=values,
            reward_baselines=reward_baselines,
            **settings,
        )
    rows = (~unscored).nonzero(as_tuple=True)[0].to(token_rewards.device)
    advantages = torch.zeros_like(token_rewards)
    returns = values.clone() if values is not None else torch.zeros_like(token_rewards)
    if rows.numel():
        sub_advantages, sub_returns = estimator(
            token_rewards[rows],
            response_mask[rows],
            group_ids=group_ids[rows.to(group_ids.device)],
            values=None if values is None else values[rows],
            reward_baselines=None if reward_baselines is None else reward_baselines[rows],
            **settings,
        )
        advantages[rows], returns[rows] = sub_advantages, sub_returns.to(returns.dtype)
        # a group left with one scored sample is not a group of one (whose baseline an estimator takes as 0):
        # its baseline is that sample's own score, so its advantage is 0, as TRL's nanmean makes it
        ids = group_ids.to(unscored.device)
        for g in torch.unique(ids[~unscored]).tolist():
            members = ids == g
            if int(members.sum()) > 1 and int((members & ~unscored).sum()) == 1:
                advantages[members.to(advantages.device)] = 0.0
    return advantages, returns


def reference_baselines(results: list[RewardResult], estimator: str) -> Tensor:
    """(N,) the ``reference_score`` each scored sample's reward returned beside its score: what the reference's
    own response to the sample's prompt scores under the same reward (the query-rewrite reward returns it when
    the run's estimator needs it). A failed sample's is NaN (it leaves the batch anyway).

    Raises:
        ValueError: a scored sample whose reward returned none, naming the estimator.
    """
    out = []
    for i, r in enumerate(results):
        if r.score is None:
            out.append(float("nan"))
        elif REFERENCE_SCORE not in r.extra:
            raise ValueError(
                f"algo.adv_estimator={estimator} needs the reward to return {REFERENCE_SCORE!r} (the reference "
                f"response's score on the prompt) for every sample; sample {i}'s reward returned "
                f"{sorted(r.extra) or 'no extra values'} (the query-rewrite application's reward returns it)"
            )
        else:
            out.append(float(r.extra[REFERENCE_SCORE]))
    return torch.tensor(out, dtype=torch.float32)


def reward_side_metrics(reward: Any) -> dict[str, float]:
    """The reward manager's own counters, ``judge/*`` from the judge clients, and the reward's own.

    A reward function that is an object with ``pop_metrics()`` (e.g. the query-rewrite application's,
    counting its RAG calls) adds what that returns.
    """
    metrics: dict[str, float] = dict(reward.pop_metrics()) if hasattr(reward, "pop_metrics") else {}
    metrics |= collect_judge_metrics()
    own = getattr(getattr(reward, "fn", None), "pop_metrics", None)
    if callable(own):
        metrics |= own()
    return metrics
