"""Step metrics with verl's names, and a phase timer.

Keys: ``critic/score/*`` (the reward before KL), ``critic/rewards/*`` (after KL),
``critic/advantages/*``, ``critic/returns/*``, ``critic/values/*``, ``response_length/*``,
``prompt_length/*``, ``timing_s/<phase>``, ``perf/throughput``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from queryrl.algos import masked_mean
from queryrl.engine.batch import Batch


class PhaseTimer:
    """Wall time per named phase of a step: ``with timer("gen"): ...`` -> ``timing_s/gen``.

    Args:
        cpu: also this process's CPU time per phase (:func:`time.process_time`) -> ``timing_cpu_s/gen``
            (``trainer.cpu_timing``).
    """

    def __init__(self, cpu: bool = False) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] | None = {} if cpu else None

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
            if self.cpu_seconds is not None:
                self.cpu_seconds[phase] = self.cpu_seconds.get(phase, 0.0) + time.process_time() - cpu

    def metrics(self) -> dict[str, float]:
        out = {f"timing_s/{k}": v for k, v in self.seconds.items()}
        return out | {f"timing_cpu_s/{k}": v for k, v in (self.cpu_seconds or {}).items()}


def _stats(prefix: str, values: Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _masked_stats(prefix: str, values: Tensor, mask: Tensor) -> dict[str, float]:
    keep = mask.bool()
    if not keep.any():
        return {}
    return {
        f"{prefix}/mean": masked_mean(values, mask).item(),
        f"{prefix}/max": values[keep].max().item(),
        f"{prefix}/min": values[keep].min().item(),
    }


def unscored_rows(batch: Batch) -> Tensor:
    """Which rows of `batch` are unscored (a NaN ``score``: no TRL-style function scored them); all False
    where the batch carries no scores."""
    scores = batch.non_tensor.get("score")
    if scores is None or len(scores) != len(batch):
        return torch.zeros(len(batch), dtype=torch.bool)
    return torch.tensor([s is not None and math.isnan(s) for s in scores], dtype=torch.bool)


def data_metrics(batch: Batch, max_response_length: int, max_prompt_length: int) -> dict[str, float]:
    """verl's ``compute_data_metrics`` over a scored batch with advantages. The score and reward statistics
    leave unscored samples out (a NaN ``score``: TRL's all-None rows), as TRL's logged reward does."""
    metrics: dict[str, float] = {}
    mask = batch.response_mask
    scored = ~unscored_rows(batch)
    if batch.token_scores is not None and bool(scored.any()):
        metrics |= _stats("critic/score", batch.token_scores.sum(-1)[scored.to(batch.token_scores.device)])
    if batch.token_rewards is not None and bool(scored.any()):
        metrics |= _stats("critic/rewards", batch.token_rewards.sum(-1)[scored.to(batch.token_rewards.device)])
    if batch.advantages is not None:
        metrics |= _masked_stats("critic/advantages", batch.advantages, mask)
    if batch.returns is not None:
        metrics |= _masked_stats("critic/returns", batch.returns, mask)
    if batch.values is not None:
        metrics |= _masked_stats("critic/values", batch.values, mask)
    response_length = batch.response_lengths.float()
    prompt_length = batch.prompt_lengths.float()
    metrics |= _stats("response_length", response_length)
    metrics["response_length/clip_ratio"] = (response_length >= max_response_length).float().mean().item()
    metrics |= _stats("prompt_length", prompt_length)
    metrics["prompt_length/clip_ratio"] = (prompt_length >= max_prompt_length).float().mean().item()
    return metrics


def zero_std_group_fraction(scores: Tensor, group_ids: Tensor) -> float:
    """The fraction of groups (of size > 1) whose rewards are all equal: no GRPO signal there. NaN scores
    (unscored samples) are left out, as from the group's baseline."""
    scored = ~torch.isnan(scores)
    scores, group_ids = scores[scored], group_ids[scored]
    groups = [scores[group_ids == g] for g in torch.unique(group_ids)]
    sized = [g for g in groups if g.numel() > 1]
    if not sized:
        return 0.0
    return sum(bool((g == g[0]).all()) for g in sized) / len(sized)


def identical_group_fraction(response_ids: Tensor, attention_mask: Tensor, group_ids: Tensor) -> float:
    """The fraction of groups (of size > 1) whose responses are one token sequence: flat under any reward, since
    nothing a reward reads can tell them apart. Beside ``reward/zero_std_group_frac`` it says whether flat groups
    come from the reward (different responses scored alike) or from the sampler (the same response drawn again)."""
    texts = [tuple(row[mask > 0].tolist()) for row, mask in zip(response_ids.cpu(), attention_mask.cpu(), strict=True)]
    groups: dict[int, list[tuple[int, ...]]] = {}
    for text, group in zip(texts, group_ids.tolist(), strict=True):
        groups.setdefault(int(group), []).append(text)
    sized = [g for g in groups.values() if len(g) > 1]
    if not sized:
        return 0.0
    return sum(len(set(g)) == 1 for g in sized) / len(sized)


def rollout_probs_diff(batch: Batch) -> dict[str, float]:
    """verl's ``training/rollout_probs_diff_*``: |p_rollout - p_train| over the trained tokens.

    The rollout backend's probabilities of the sampled tokens against the trainer's recomputed
    ones (``old_logprobs``): about 0 when both run the same weights (hf, or workers in sync);
    larger with vLLM's kernels or a weight sync gone wrong.
    """
    if batch.rollout_logprobs is None or batch.old_logprobs is None or len(batch) == 0:
        return {}
    mask = batch.response_mask > 0
    if not bool(mask.any()):
        return {}
    diff = (batch.rollout_logprobs.exp() - batch.old_logprobs.exp()).abs()[mask]
    return {
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_max": float(diff.max()),
    }
