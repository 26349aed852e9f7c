"""Advantage estimators.

Notation: `N` sequences, `T` response tokens, `G` groups (one per prompt). Every estimator
takes per-token rewards ``token_rewards`` (N, T) — an outcome reward sits on the last counted
token — and ``response_mask`` (N, T), and returns ``(advantages, returns)``, both (N, T).

Groups are given as one id per sequence (``group_ids``, N). They may be ragged (any size
from 1), in any order and not contiguous: samples whose reward failed are dropped before this
point. These functions reproduce the numbers of verl 0.9.1 (``verl/trainer/ppo/core_algos.py``),
with its conventions, and differ on purpose where said:

- a group of one has baseline 0 (and std 1 where the estimator divides by the std), so it keeps
  its raw score (as verl);
- a group whose scores are all equal gets advantage exactly 0, never NaN. **verl differs**: its mean
  of equal floats can miss them by an ulp, and it divides that noise by ``std + eps`` (eight scores
  of 0.3 give 0.0289 each in float32); queryrl sets the mean of a constant group to the score itself,
  so such a group never pushes the policy;
- group sums of bfloat16 / float16 scores accumulate in float32 and the results are rounded back to
  the scores' dtype once (summed in bfloat16, they were one ulp from verl in a reviewer's differential test).

All estimators share one signature (:class:`AdvantageFn`) so the trainer calls
``ADVANTAGE_ESTIMATORS.get(name)(...)`` without knowing which one it is; each ignores the
inputs it does not use and raises when one it needs is missing.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Protocol, TypeAlias, TypeVar

import numpy as np
import torch
from torch import Tensor

from queryrl.algos.masked import masked_whiten
from queryrl.registry import Registry

GroupIds: TypeAlias = Tensor | np.ndarray | Sequence[Hashable]
_T = TypeVar("_T")


class AdvantageFn(Protocol):
    """The signature every registered advantage estimator has."""

    def __call__(
        self,
        token_rewards: Tensor,
        response_mask: Tensor,
        *,
        group_ids: GroupIds | None = None,
        values: Tensor | None = None,
        reward_baselines: Tensor | None = None,
        gamma: float = 1.0,
        lam: float = 1.0,
        epsilon: float = 1e-6,
        norm_adv_by_std: bool = True,
    ) -> tuple[Tensor, Tensor]: ...


ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


def group_index(group_ids: GroupIds, n: int) -> tuple[Tensor, int]:
    """Map arbitrary group ids to ``0..G-1`` in order of first appearance.

    Numbers that are all within 1e-6 of integers are those integers (verl 0.9.1's ``as_torch_index``:
    ``[1.0000001, 1.0]`` is one group); otherwise ids are compared exactly.

    Args:
        group_ids: N hashable ids (ints, strings, a 1-D tensor or array).
        n: the number of sequences, checked against ``len(group_ids)``.

    Returns:
        ``(inverse, G)``: ``inverse`` (N,) long tensor with the group of each sequence.
    """
    if isinstance(group_ids, Tensor | np.ndarray):
        ids: list[Hashable] = group_ids.tolist()
    else:
        ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids has {len(ids)} entries but there are {n} sequences")
    numbers = [float(g) for g in ids if isinstance(g, int | float)]
    floats = len(numbers) == len(ids) and any(isinstance(g, float) for g in ids)
    if floats and all(math.isfinite(x) and abs(x - round(x)) <= 1e-6 for x in numbers):  # verl's as_torch_index
        ids = [round(x) for x in numbers]  # 1.0000001 is 1
    mapping: dict[Hashable, int] = {}
    inverse = [mapping.setdefault(g, len(mapping)) for g in ids]
    return torch.tensor(inverse, dtype=torch.long), len(mapping)


def _constant_groups(scores: Tensor, inverse: Tensor, num_groups: int) -> tuple[Tensor, Tensor]:
    """(G,) whether each group's scores are all equal, and (G,) its largest score.

    Summing then dividing need not give a constant group's value back bit for bit (0.3 + 0.3
    + 0.3 over 3), so baselines use the value itself there and the advantage is exactly 0.
    """
    zeros = scores.new_zeros(num_groups)
    g_max = zeros.scatter_reduce(0, inverse, scores, reduce="amax", include_self=False)
    g_min = zeros.scatter_reduce(0, inverse, scores, reduce="amin", include_self=False)
    return g_max == g_min, g_max


def group_mean_std(scores: Tensor, inverse: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence group mean, unbiased group std and group size, with verl's conventions.

    Args:
        scores: (N,) one score per sequence.
        inverse: (N,) group index of each sequence (from :func:`group_index`).
        num_groups: G.

    Returns:
        ``(mean, std, count)``, each (N,) and gathered back to the sequences. A group of one
        has mean 0 and std 1. A constant group has std 0 and a mean equal to its scores
        exactly, so ``scores - mean`` is exactly 0 there.
    """
    if scores.dtype in (torch.bfloat16, torch.float16):  # sums in float32, rounded back once
        mean, std, count = group_mean_std(scores.float(), inverse, num_groups)
        return mean.to(scores.dtype), std.to(scores.dtype), count.to(scores.dtype)
    zeros = scores.new_zeros(num_groups)
    count_g = zeros.index_add(0, inverse, torch.ones_like(scores))  # (G,)
    mean_g = zeros.index_add(0, inverse, scores) / count_g  # (G,)
    centered = scores - mean_g[inverse]  # (N,)
    var_g = zeros.index_add(0, inverse, centered**2) / (count_g - 1).clamp(min=1)  # (G,)
    std_g = var_g.sqrt()
    constant, value_g = _constant_groups(scores, inverse, num_groups)
    mean_g = torch.where(constant, value_g, mean_g)
    std_g = torch.where(constant, torch.zeros_like(std_g), std_g)
    single = count_g == 1
    mean_g = torch.where(single, torch.zeros_like(mean_g), mean_g)
    std_g = torch.where(single, torch.ones_like(std_g), std_g)
    return mean_g[inverse], std_g[inverse], count_g[inverse]


def _require(x: _T | None, what: str, estimator: str) -> _T:
    if x is None:
        raise ValueError(f"advantage estimator {estimator!r} needs {what}")
    return x


def _outcome_scores(token_rewards: Tensor) -> Tensor:
    """(N,) the sequence score: the sum of the token rewards."""
    return token_rewards.sum(dim=-1)


def _grouped_scores(token_rewards: Tensor, group_ids: GroupIds | None, estimator: str) -> tuple[Tensor, Tensor, int]:
    """The sequence scores (N,), each sequence's group index (N,) and the number of groups G."""
    if group_ids is None:
        raise ValueError(f"advantage estimator {estimator!r} needs group_ids (one group id per sequence)")
    scores = _outcome_scores(token_rewards)  # (N,)
    inverse, num_groups = group_index(group_ids, scores.shape[0])
    return scores, inverse.to(scores.device), num_groups


@ADVANTAGE_ESTIMATORS.register("grpo")
@torch.no_grad()
def grpo(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """Group-relative advantage, GRPO (arXiv:2402.03300, §4.1.2).

    ``A_i = (r_i - mean_g) / (std_g + epsilon)`` broadcast over the response tokens. With
    ``norm_adv_by_std=False`` it is ``r_i - mean_g``: Dr.GRPO (arXiv:2503.20783, §3.2).
    Uses `group_ids`; `values`, `reward_baselines`, `gamma`, `lam` are ignored.
    """
    scores, inverse, num_groups = _grouped_scores(token_rewards, group_ids, "grpo")
    mean, std, _ = group_mean_std(scores, inverse, num_groups)
    adv = (scores - mean) / (std + epsilon) if norm_adv_by_std else scores - mean
    adv = adv.unsqueeze(-1) * response_mask  # (N, T)
    return adv, adv


@ADVANTAGE_ESTIMATORS.register("grpo_reference", needs={"reference_baseline"})
@torch.no_grad()
def grpo_reference(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """GRPO whose group statistics also count the reference response's reward.

    ``reward_baselines`` (N,) holds, for each row, what a reference's own response to the row's prompt scores
    under the same reward (equal within a group; where a judge gave the rows of one prompt different scores,
    their mean). Each group's mean and unbiased std are taken over its ``n``
    scores and that one score, and the ``n`` samples get ``(r_i - mean) / (std + epsilon)``
    (``r_i - mean`` without `norm_adv_by_std`). A group whose samples all score alike still learns where the
    reference scores otherwise: up where they beat it, down where they fall short; a group that ties the
    reference gets exactly 0. The reference is counted, not trained on. The idea of an off-policy response in
    the group's advantage is LUFFY's (Yan et al. 2025, arXiv:2504.14945), which also trains on its tokens.
    """
    reward_baselines = _require(reward_baselines, "reward_baselines (the reference's reward)", "grpo_reference")
    scores, inverse, num_groups = _grouped_scores(token_rewards, group_ids, "grpo_reference")
    ref, zeros = reward_baselines.to(scores), scores.new_zeros(num_groups)
    ref_g = zeros.index_add(0, inverse, ref) / zeros.index_add(0, inverse, torch.ones_like(ref))  # (G,) its rows' mean
    constant, value_g = _constant_groups(ref, inverse, num_groups)
    ref_g = torch.where(constant, value_g, ref_g)  # equal rows give their value back exactly
    n = scores.shape[0]
    joined = torch.cat([scores, ref_g])  # the reference as one more member of each group
    joined_inverse = torch.cat([inverse, torch.arange(num_groups, device=inverse.device)])
    mean, std, _ = group_mean_std(joined, joined_inverse, num_groups)
    mean, std = mean[:n], std[:n]
    adv = (scores - mean) / (std + epsilon) if norm_adv_by_std else scores - mean
    adv = adv.unsqueeze(-1) * response_mask  # (N, T)
    return adv, adv


@ADVANTAGE_ESTIMATORS.register("grpo_passk")
@torch.no_grad()
def grpo_passk(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """Pass@k advantage (arXiv:2503.19595): only the best response of each group learns.

    The best gets ``r_max - r_second`` (divided by ``std_g + epsilon`` when
    `norm_adv_by_std`); every other response gets 0. Ties are broken as ``torch.topk`` does,
    as in verl. A group of one has no second response and gets 0 (verl raises instead; a
    group shrinks to one when its other samples' rewards failed, and that must not stop a run).
    """
    scores, inverse, num_groups = _grouped_scores(token_rewards, group_ids, "grpo_passk")
    adv = torch.zeros_like(scores)
    for g in range(num_groups):
        members = (inverse == g).nonzero(as_tuple=True)[0]  # (n_g,)
        if members.numel() < 2:
            continue
        rewards = scores[members]
        top, top_idx = torch.topk(rewards, 2)
        value = top[0] - top[1]
        if norm_adv_by_std:
            value = value / (torch.std(rewards) + epsilon)
        adv[members[top_idx[0]]] = value
    adv_tok = adv.unsqueeze(-1) * response_mask  # (N, T)
    return adv_tok, adv_tok


@ADVANTAGE_ESTIMATORS.register("rloo")
@torch.no_grad()
def rloo(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """REINFORCE leave-one-out (arXiv:2402.14740, Eq. 6).

    ``A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean_g)``; a group of one keeps its
    raw score.
    """
    scores, inverse, num_groups = _grouped_scores(token_rewards, group_ids, "rloo")
    mean, _, count = group_mean_std(scores, inverse, num_groups)
    factor = count / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, scores * factor - mean * factor, scores)
    adv = adv.unsqueeze(-1) * response_mask  # (N, T)
    return adv, adv


@ADVANTAGE_ESTIMATORS.register("opo")
@torch.no_grad()
def opo(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """On-policy RL with the optimal (length-weighted) baseline, OPO (arXiv:2505.23585, Eq. 5).

    ``b_g = sum_j |y_j| r_j / sum_j |y_j|``, ``A_i = r_i - b_g``; a group of one has b = 0.
    """
    scores, inverse, num_groups = _grouped_scores(token_rewards, group_ids, "opo")
    wide = torch.float32 if scores.dtype in (torch.bfloat16, torch.float16) else scores.dtype  # sums in fp32
    lengths = response_mask.sum(dim=-1).to(wide)  # (N,)
    zeros = scores.new_zeros(num_groups, dtype=wide)
    weighted = zeros.index_add(0, inverse, lengths * scores.to(wide))  # (G,)
    total_len = zeros.index_add(0, inverse, lengths)  # (G,)
    count = zeros.index_add(0, inverse, torch.ones_like(lengths))  # (G,)
    baseline = (weighted / total_len.clamp(min=1e-12)).to(scores.dtype)  # (G,) empty responses: 0
    constant, value_g = _constant_groups(scores, inverse, num_groups)
    baseline = torch.where(constant, value_g, baseline)
    baseline = torch.where(count > 1, baseline, torch.zeros_like(baseline))
    adv = (scores - baseline[inverse]).unsqueeze(-1) * response_mask  # (N, T)
    return adv, adv


@ADVANTAGE_ESTIMATORS.register("gpg")
@torch.no_grad()
def gpg(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """Group Policy Gradient, GPG (arXiv:2504.02546, Eq. 8).

    ``A_i = alpha * (r_i - mean_g)`` with ``alpha = N / max(#{i: r_i != 0}, 1)`` over the
    batch, compensating for groups that carry no signal. No std normalisation.
    """
    scores, inverse, num_groups = _grouped_scores(token_rewards, group_ids, "gpg")
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    mean, _, _ = group_mean_std(scores, inverse, num_groups)
    adv = (alpha * (scores - mean)).unsqueeze(-1) * response_mask  # (N, T)
    return adv, adv


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline")
@torch.no_grad()
def reinforce_plus_plus_baseline(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group-mean baseline (arXiv:2501.03262, §3).

    ``r_i - mean_g`` on every counted token, then whitened over the whole batch.
    """
    scores, inverse, num_groups = _grouped_scores(token_rewards, group_ids, "reinforce_plus_plus_baseline")
    mean, _, _ = group_mean_std(scores, inverse, num_groups)
    adv = (scores - mean).unsqueeze(-1) * response_mask  # (N, T)
    adv = masked_whiten(adv, response_mask) * response_mask
    return adv, adv


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (arXiv:2501.03262, §3): discounted return-to-go, whitened over the batch.

    ``G_t = r_t + gamma * G_{t+1}`` over counted tokens. Masked positions inside a response
    (tool/observation tokens) are skipped: the running return carries across them unchanged
    and their return is 0. Returns ``(whiten(G) * mask, G)``.
    """
    returns = torch.zeros_like(token_rewards)  # (N, T)
    running = torch.zeros_like(token_rewards[:, 0])  # (N,)
    for t in reversed(range(token_rewards.shape[1])):
        m = response_mask[:, t]
        candidate = token_rewards[:, t] + gamma * running
        returns[:, t] = candidate * m
        running = candidate * m + running * (1 - m)
    adv = masked_whiten(returns, response_mask) * response_mask
    return adv, returns


@ADVANTAGE_ESTIMATORS.register("remax", needs={"greedy_baseline"})
@torch.no_grad()
def remax(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """ReMax (arXiv:2310.10505, Eq. 6): return-to-go minus the greedy response's reward.

    Needs ``reward_baselines`` (N,): the reward of the greedy response to the same prompt.
    """
    reward_baselines = _require(reward_baselines, "reward_baselines (the greedy response's reward)", "remax")
    returns = (token_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])  # (N, T)
    adv = returns - reward_baselines.unsqueeze(-1) * response_mask
    return adv, returns


@ADVANTAGE_ESTIMATORS.register("gae", needs={"values"})
@torch.no_grad()
def gae(
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (arXiv:1506.02438, Eq. 16), for PPO with a critic.

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lam * A_{t+1}``.
    Masked positions inside a response (tool/observation tokens) are skipped: the next value
    and the running advantage carry across them. Returns ``(whiten(A), A + V)``.
    Needs ``values`` (N, T).
    """
    values = _require(values, "values (N, T) from the critic", "gae")
    next_values = torch.zeros_like(values[:, 0])  # (N,)
    last_gae = torch.zeros_like(values[:, 0])  # (N,)
    reversed_adv = []
    for t in reversed(range(token_rewards.shape[-1])):
        m = response_mask[:, t]
        delta = token_rewards[:, t] + gamma * next_values - values[:, t]
        candidate = delta + gamma * lam * last_gae
        next_values = values[:, t] * m + (1 - m) * next_values
        last_gae = candidate * m + (1 - m) * last_gae
        reversed_adv.append(last_gae)
    adv = torch.stack(reversed_adv[::-1], dim=1)  # (N, T)
    returns = adv + values
    return masked_whiten(adv, response_mask), returns


def compute_advantages(
    name: str,
    token_rewards: Tensor,
    response_mask: Tensor,
    *,
    group_ids: GroupIds | None = None,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[Tensor, Tensor]:
    """Look up estimator `name` and run it: ``(advantages, returns)``, both (N, T)."""
    fn = ADVANTAGE_ESTIMATORS.get(name)
    return fn(
        token_rewards,
        response_mask,
        group_ids=group_ids,
        values=values,
        reward_baselines=reward_baselines,
        gamma=gamma,
        lam=lam,
        epsilon=epsilon,
        norm_adv_by_std=norm_adv_by_std,
    )
