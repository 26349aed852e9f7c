"""One optimizer step on a mini-batch, shared by the local trainer and the Ray workers.

A mini-batch's loss normaliser (:class:`~queryrl.algos.LossNormalizer`) is computed once from
the *whole* mini-batch and passed to every micro-batch, so the micro-batch losses sum to the
mini-batch loss and the accumulated gradient does not depend on how the rows were cut. The same
holds across data-parallel ranks: rank ``r`` runs :func:`optimizer_step` on its shard of the
mini-batch with the global normaliser, and ``reduce_grads`` sums the gradients over the ranks
before clipping, which gives every rank the single-process gradient and therefore the same step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from queryrl.algos import POLICY_LOSSES, LossNormalizer, agg_loss, kl_penalty, value_loss
from queryrl.engine.batch import Batch
from queryrl.engine.policy import forward_logprobs, forward_values

MicroStep = Callable[[Batch, LossNormalizer], dict[str, float]]


def add_metrics(into: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """Key-wise sum of two metric dicts (micro-batches' shares of a mean add up), but the maximum for a key ending in
    ``_max`` (``training/rollout_probs_diff_max``: the largest over the micro-batches and ranks)."""
    out = dict(into)
    for k, v in new.items():
        out[k] = max(out[k], v) if k.endswith("_max") and k in out else out.get(k, 0.0) + v
    return out


def on_policy_probs_diff(rollout: Tensor, logprobs: Tensor, mask: Tensor, norm: LossNormalizer) -> dict[str, float]:
    """verl's ``training/rollout_probs_diff_*`` (|p_rollout - p_train| over the counted tokens) from a single on-policy
    pass's own log-probs (`logprobs`, detached): there the loop skips ``old_log_prob`` because those equal these, so
    the gap between the rollout's numbers (int8 copies, another kernel) and the trainer's costs no extra forward. The
    mean is this micro-batch's share of the mini-batch's (summed by :func:`add_metrics`), the max its own."""
    keep = mask > 0
    if not bool(keep.any()):
        return {}
    diff = (rollout.to(logprobs.device).exp() - logprobs.exp()).abs()
    return {
        "training/rollout_probs_diff_mean": float(diff[keep].sum()) / max(norm.num_tokens, 1.0),
        "training/rollout_probs_diff_max": float(diff[keep].max()),
    }


def optimizer_step(
    mini: Batch,
    norm: LossNormalizer,
    micro_batch_size: int,
    micro_step: MicroStep,
    optimizer: torch.optim.Optimizer,
    params: list[nn.Parameter],
    grad_clip: float,
    prefix: str,
    reduce_grads: Callable[[list[nn.Parameter]], None] | None = None,
    clip_grads: Callable[[float], Tensor] | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Accumulate the gradients of `mini` (micro-batch by micro-batch), clip, step.

    Args:
        mini: this process's rows of the mini-batch (may be empty on a data-parallel rank).
        norm: the normaliser of the whole mini-batch (all ranks).
        micro_batch_size: rows per forward/backward.
        micro_step: forward and backward of one (trimmed) micro-batch; returns its metric shares.
        optimizer, params: what is stepped and clipped.
        grad_clip: maximum global gradient norm.
        prefix: metric prefix (``actor`` or ``critic``).
        reduce_grads: called before clipping to sum the gradients over data-parallel ranks.
        clip_grads: replaces ``clip_grad_norm_(params, grad_clip)`` (FSDP clips sharded gradients).

    Returns:
        ``(summed, after)``: the micro-batch metrics summed over this process's micro-batches
        (sum them over ranks for the mini-batch value), and the metrics of the step itself
        (``<prefix>/grad_norm``, identical on every rank once the gradients are reduced).
    """
    optimizer.zero_grad(set_to_none=True)
    summed: dict[str, float] = {}
    for micro in mini.split(micro_batch_size):
        summed = add_metrics(summed, micro_step(micro.trimmed(), norm))
    if reduce_grads is not None:
        reduce_grads(params)
    return summed, clip_and_step(optimizer, params, grad_clip, prefix, clip_grads)


def clip_and_step(
    optimizer: torch.optim.Optimizer,
    params: list[nn.Parameter],
    grad_clip: float,
    prefix: str,
    clip_grads: Callable[[float], Tensor] | None = None,
) -> dict[str, float]:
    """Clip the accumulated gradients to `grad_clip`, step unless their norm is not finite, zero them.

    Returns ``<prefix>/grad_norm`` (before clipping) and, for a skipped step, ``<prefix>/grad_norm_nonfinite``.
    The RL update (:func:`optimizer_step`) and SFT (``queryrl.trainer.sft``) both end their steps here.
    """
    grad_norm = clip_grads(grad_clip) if clip_grads is not None else nn.utils.clip_grad_norm_(params, grad_clip)
    after: dict[str, float] = {}
    if torch.isfinite(grad_norm):
        optimizer.step()
    else:  # skip the step, as verl does, and say so
        after[f"{prefix}/grad_norm_nonfinite"] = 1.0
    optimizer.zero_grad(set_to_none=True)
    after[f"{prefix}/grad_norm"] = float(grad_norm)
    return after


def actor_micro_step(
    cfg: DictConfig, model: nn.Module, micro: Batch, norm: LossNormalizer, loss_scale: float = 1.0
) -> dict[str, float]:
    """Forward and backward one policy micro-batch; returns its share of the mini-batch metrics.

    Args:
        cfg: the run config (``actor.*`` and ``rollout.temperature`` are read).
        loss_scale: multiplies the loss before backward (the world size under FSDP, which
            averages gradients over ranks where the normaliser expects a sum).
    """
    actor = cfg.actor
    loss_fn = POLICY_LOSSES.get(actor.policy_loss)
    want_entropy_grad = actor.entropy_coeff != 0
    logprobs, entropy = forward_logprobs(
        model,
        micro,
        cfg.rollout.temperature,
        with_entropy=True,
        entropy_grad=want_entropy_grad,
        share_prompt=actor.share_prompt_forward,
        share_prefix=actor.share_prefix_forward,
    )
    old = micro.old_logprobs if micro.old_logprobs is not None else logprobs.detach()
    assert micro.advantages is not None
    gap: dict[str, float] = {}
    if micro.old_logprobs is None and micro.rollout_logprobs is not None:  # old_log_prob skipped: the gap from here
        gap = on_policy_probs_diff(micro.rollout_logprobs, old, micro.response_mask, norm)
    out = loss_fn(
        old,
        logprobs,
        micro.advantages,
        micro.response_mask,
        loss_agg_mode=actor.loss_agg_mode,
        clip_ratio_low=actor.clip_ratio_low,
        clip_ratio_high=actor.clip_ratio_high,
        clip_ratio_c=actor.clip_ratio_c,
        tau_pos=actor.tau_pos,
        tau_neg=actor.tau_neg,
        normalizer=norm,
    )
    loss = out.loss
    share = float(micro.response_mask.sum()) / max(norm.num_tokens, 1.0)  # token share, for mean metrics
    metrics = {"actor/pg_loss": out.loss.item()} | gap
    metrics |= {f"actor/{k}": v.item() * share for k, v in out.metrics.items()}
    assert entropy is not None
    metrics["actor/entropy"] = float((entropy.detach() * micro.response_mask).sum() / max(norm.num_tokens, 1.0))
    if want_entropy_grad:
        loss = loss - actor.entropy_coeff * agg_loss(entropy, micro.response_mask, actor.loss_agg_mode, norm)
    if actor.use_kl_loss:
        assert micro.ref_logprobs is not None
        kl = agg_loss(
            kl_penalty(logprobs, micro.ref_logprobs, actor.kl_loss_type), micro.response_mask, actor.loss_agg_mode, norm
        )
        loss = loss + actor.kl_loss_coef * kl
        metrics["actor/kl_loss"] = kl.item()
    (loss * loss_scale if loss_scale != 1.0 else loss).backward()
    return metrics


def critic_micro_step(
    cfg: DictConfig, critic: nn.Module, micro: Batch, norm: LossNormalizer, loss_scale: float = 1.0
) -> dict[str, float]:
    """Forward and backward one critic micro-batch (clipped value loss); returns its metric shares."""
    assert micro.returns is not None
    assert micro.values is not None
    vpreds = forward_values(critic, micro)
    loss, clipfrac = value_loss(
        vpreds,
        micro.returns,
        micro.values,
        micro.response_mask,
        cfg.critic.cliprange_value,
        cfg.critic.loss_agg_mode,
        norm,
    )
    (loss * loss_scale if loss_scale != 1.0 else loss).backward()
    share = float(micro.response_mask.sum()) / max(norm.num_tokens, 1.0)
    return {"critic/vf_loss": loss.item(), "critic/vf_clipfrac": clipfrac.item() * share}


def micro_step_for(role: str, cfg: DictConfig, module: nn.Module, loss_scale: float = 1.0) -> MicroStep:
    """The micro step of `role` (``actor`` or ``critic``) bound to `module`."""
    if role == "actor":
        return lambda micro, norm: actor_micro_step(cfg, module, micro, norm, loss_scale)
    if role == "critic":
        return lambda micro, norm: critic_micro_step(cfg, module, micro, norm, loss_scale)
    raise ValueError(f"unknown role {role!r}; valid: actor, critic")


def role_settings(role: str, cfg: DictConfig) -> Any:
    """The config section of `role` (``actor`` or ``critic``): micro-batch size, grad clip, epochs."""
    return cfg.actor if role == "actor" else cfg.critic
