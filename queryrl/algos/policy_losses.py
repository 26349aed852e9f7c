"""Policy-gradient losses.

Notation: `N` sequences, `T` response tokens. Inputs are (N, T): ``old_logprobs`` (the policy
that sampled, or the last update's), ``logprobs`` (current, carries the gradient),
``advantages`` and ``response_mask``. The ratio is ``r = exp(logprobs - old_logprobs)``.

Every loss shares one signature (:class:`PolicyLossFn`) and returns a
:class:`PolicyLossOutput`: the aggregated scalar loss and detached metric tensors
(``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower`` where they mean something). Numbers and
gradients match verl 0.9.1's ``compute_policy_loss_*``; the operations are kept in verl's order
so that even gradients at ties (``max``/``min``/``where``) are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from queryrl.algos.aggregation import LossNormalizer, agg_loss, check_loss_agg_mode
from queryrl.algos.masked import masked_mean
from queryrl.registry import Registry

_LOG_RATIO_CLAMP = 20.0  # verl clamps log-ratios to [-20, 20] before exp


@dataclass(frozen=True)
class PolicyLossOutput:
    """A policy loss and its metrics.

    Attributes:
        loss: scalar, carries the gradient.
        metrics: detached scalar tensors keyed ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower``
            (a loss reports only those that apply); the trainer prefixes them with ``actor/``.
    """

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)


class PolicyLossFn(Protocol):
    """The signature every registered policy loss has."""

    def __call__(
        self,
        old_logprobs: Tensor,
        logprobs: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        *,
        loss_agg_mode: str = "token-mean",
        clip_ratio_low: float = 0.2,
        clip_ratio_high: float = 0.2,
        clip_ratio_c: float = 3.0,
        tau_pos: float = 1.0,
        tau_neg: float = 1.05,
        rollout_is_weights: Tensor | None = None,
        normalizer: LossNormalizer | None = None,
    ) -> PolicyLossOutput: ...


POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def _ppo_kl(log_ratio: Tensor, response_mask: Tensor) -> Tensor:
    """Detached mean of ``old - new`` log-prob over counted tokens (verl's ``actor/ppo_kl``)."""
    return masked_mean(-log_ratio, response_mask).detach()


def _valid_only(response_mask: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """Zero every tensor at masked positions, before any arithmetic.

    Padding may hold anything (a -inf log-prob gives NaN ratios); without this, ``0 * NaN`` in
    a reduction or in backward would carry it into the loss or the gradient. Counted positions
    are untouched, so the numbers are verl's.
    """
    keep = response_mask.bool()
    return tuple(torch.where(keep, x, torch.zeros_like(x)) for x in tensors)


def _weighted(pg_losses: Tensor, rollout_is_weights: Tensor | None) -> Tensor:
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


@POLICY_LOSSES.register("vanilla")
def vanilla(
    old_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: Tensor | None = None,
    normalizer: LossNormalizer | None = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate (arXiv:1707.06347, Eq. 7) with clip-higher and dual-clip.

    ``L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; clip-higher is
    ``eps_high > eps_low`` (DAPO, arXiv:2503.14476, §3.1). For ``A < 0`` the loss is also
    bounded by ``-A * c`` (dual-clip, arXiv:1912.09729, Eq. 9), ``c = clip_ratio_c > 1``.

    Metrics: ``pg_clipfrac`` (tokens where the clipped term is taken), ``pg_clipfrac_lower``
    (tokens where the dual clip binds), ``ppo_kl``.
    """
    check_loss_agg_mode(loss_agg_mode)
    old_logprobs, logprobs, advantages = _valid_only(response_mask, old_logprobs, logprobs, advantages)
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1.0, got {clip_ratio_c}")
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # (N, T)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_losses = _weighted(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer)
    return PolicyLossOutput(
        loss,
        {
            "pg_clipfrac": pg_clipfrac.detach(),
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "pg_clipfrac_lower": pg_clipfrac_lower.detach(),
        },
    )


@POLICY_LOSSES.register("gspo")
def gspo(
    old_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "seq-mean-token-mean",
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: Tensor | None = None,
    normalizer: LossNormalizer | None = None,
) -> PolicyLossOutput:
    """Group Sequence Policy Optimization, GSPO (arXiv:2507.18071, Eq. 7 and the token form Eq. 13).

    Sequence ratio ``s_i = exp(mean_t log r_{i,t})``; per token
    ``s_{i,t} = sg[s_i] * pi / sg[pi]`` (value ``s_i``, gradient of ``log pi``), clipped to
    ``[1 - eps_low, 1 + eps_high]``. Aggregated with `loss_agg_mode`, as in verl 0.9.1; the
    paper's objective is ``seq-mean-token-mean``, this function's default.
    """
    check_loss_agg_mode(loss_agg_mode)
    old_logprobs, logprobs, advantages = _valid_only(response_mask, old_logprobs, logprobs, advantages)
    log_ratio = logprobs - old_logprobs  # (N, T)
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)  # (N,)
    seq_log_ratio = torch.sum(log_ratio * response_mask, dim=-1) / seq_lengths  # (N,)
    log_seq_ratio = logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)  # (N, T)
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=10.0))
    pg_losses1 = -advantages * seq_ratio
    pg_losses2 = -advantages * torch.clamp(seq_ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = _weighted(torch.maximum(pg_losses1, pg_losses2), rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    return PolicyLossOutput(
        loss,
        {
            "pg_clipfrac": pg_clipfrac.detach(),
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "pg_clipfrac_lower": torch.zeros((), device=loss.device),
        },
    )


@POLICY_LOSSES.register("cispo")
def cispo(
    old_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: Tensor | None = None,
    normalizer: LossNormalizer | None = None,
) -> PolicyLossOutput:
    """Clipped IS-weight policy optimization, CISPO (MiniMax-M1, arXiv:2506.13585, Eq. 4).

    ``L = -sg[clip(r, 1 - eps_low, 1 + eps_high)] * A * log pi``: the ratio is clipped and
    detached, so every token keeps a REINFORCE gradient (none is zeroed by the clip).
    """
    check_loss_agg_mode(loss_agg_mode)
    old_logprobs, logprobs, advantages = _valid_only(response_mask, old_logprobs, logprobs, advantages)
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = -clipped_ratio.detach() * advantages * logprobs
    pg_clipfrac = masked_mean((ratio != clipped_ratio).float(), response_mask)
    pg_losses = _weighted(pg_losses, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer)
    return PolicyLossOutput(
        loss,
        {
            "pg_clipfrac": pg_clipfrac.detach(),
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "pg_clipfrac_lower": torch.zeros((), device=loss.device),
        },
    )


@POLICY_LOSSES.register("sapo")
def sapo(
    old_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "seq-mean-token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: Tensor | None = None,
    normalizer: LossNormalizer | None = None,
) -> PolicyLossOutput:
    """Soft Adaptive Policy Optimization, SAPO (arXiv:2511.20347, Eq. 5).

    A smooth gate replaces the hard clip: ``f(r) = sigmoid(tau (r - 1)) * 4 / tau`` with
    ``tau = tau_pos`` where ``A > 0`` and ``tau_neg`` otherwise; ``L = -f(r) A``. Aggregated
    with ``seq-mean-token-mean`` whatever `loss_agg_mode` says, as in verl.
    """
    check_loss_agg_mode(loss_agg_mode)
    old_logprobs, logprobs, advantages = _valid_only(response_mask, old_logprobs, logprobs, advantages)
    tau_p = torch.as_tensor(tau_pos, dtype=advantages.dtype, device=advantages.device)
    tau_n = torch.as_tensor(tau_neg, dtype=advantages.dtype, device=advantages.device)
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    taus = torch.where(advantages > 0, tau_p, tau_n)  # (N, T)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_losses = _weighted(-gates * advantages, rollout_is_weights)
    loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean", normalizer)
    zero = torch.zeros((), device=loss.device)
    return PolicyLossOutput(
        loss,
        {"pg_clipfrac": zero, "ppo_kl": _ppo_kl(log_ratio, response_mask), "pg_clipfrac_lower": zero},
    )


@POLICY_LOSSES.register("gpg")
def gpg(
    old_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: Tensor | None = None,
    normalizer: LossNormalizer | None = None,
) -> PolicyLossOutput:
    """Group Policy Gradient, GPG (arXiv:2504.02546, Eq. 6): plain ``L = -A log pi``.

    No ratio, no clip; `old_logprobs` is unused. No metrics.
    """
    check_loss_agg_mode(loss_agg_mode)
    old_logprobs, logprobs, advantages = _valid_only(response_mask, old_logprobs, logprobs, advantages)
    pg_losses = _weighted(-logprobs * advantages, rollout_is_weights)
    return PolicyLossOutput(agg_loss(pg_losses, response_mask, loss_agg_mode, normalizer), {})


@POLICY_LOSSES.register("geo_mean")
def geo_mean(
    old_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: Tensor | None = None,
    normalizer: LossNormalizer | None = None,
) -> PolicyLossOutput:
    """Geometric-Mean Policy Optimization, GMPO (arXiv:2507.20673, Eq. 4).

    Per sequence, the geometric mean of token ratios, each log-ratio clipped to
    ``[-eps_low, eps_high]`` in the direction of the advantage's sign; ``L_i = -A_i * ratio_i``
    with ``A_i`` the token-mean advantage. The loss is the mean over sequences (all rows, as in
    verl; with a `normalizer`, the sum divided by ``normalizer.num_seqs``); `loss_agg_mode` is
    not used.
    """
    check_loss_agg_mode(loss_agg_mode)
    old_logprobs, logprobs, advantages = _valid_only(response_mask, old_logprobs, logprobs, advantages)
    log_ratio = logprobs - old_logprobs  # (N, T), no clamp, as in verl
    sgn = torch.sign(advantages)
    log_ratio_clamped = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    log_ratio_min = sgn * torch.min(sgn * log_ratio, sgn * log_ratio_clamped)
    lengths = response_mask.sum(dim=-1)  # (N,)
    seq_ratio = torch.exp((log_ratio_min * response_mask).sum(dim=-1) / (lengths + 1e-8))  # (N,)
    seq_adv = (advantages * response_mask).sum(dim=-1) / (lengths + 1e-8)  # (N,)
    pg_losses = -seq_adv * seq_ratio  # (N,)
    if rollout_is_weights is not None:
        # token IS weights -> one per sequence, by geometric mean, as in verl
        seq_w = torch.exp((torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (lengths + 1e-8))
        pg_losses = pg_losses * seq_w
    loss = torch.mean(pg_losses) if normalizer is None else pg_losses.sum() / normalizer.num_seqs
    clipped = torch.ne(log_ratio, log_ratio_clamped)
    return PolicyLossOutput(
        loss,
        {
            "pg_clipfrac": masked_mean((clipped * (advantages > 0)).float(), response_mask).detach(),
            "ppo_kl": _ppo_kl(log_ratio, response_mask),
            "pg_clipfrac_lower": masked_mean((clipped * (advantages < 0)).float(), response_mask).detach(),
        },
    )
