"""Aggregating a per-token loss matrix into the scalar that is back-propagated.

Notation: `N` sequences, `T` response tokens. ``loss_mat`` (N, T), ``loss_mask`` (N, T).

Modes (verl 0.9.1's ``agg_loss``):

- ``token-mean``: ``sum(L * m) / sum(m)`` — every token weighs the same (DAPO, arXiv:2503.14476).
- ``token-sum``: ``sum(L * m)``.
- ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.
- ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (original GRPO).
- ``seq-mean-token-sum-norm``: ``seq-mean-token-sum / horizon`` with a constant horizon
  (Dr.GRPO, arXiv:2503.20783, §3.2); verl uses ``T``, the padded width.

Micro-batch invariance. With gradient accumulation a mini-batch is split into micro-batches
and each one's loss is back-propagated. verl's legacy path normalises each micro-batch by its
own token / sequence count (and, for ``-norm``, its own padded width), so the accumulated
gradient depends on how the mini-batch was cut (verl issue #5625). Here the normaliser is
computed once per mini-batch (:meth:`LossNormalizer.from_mask`) and passed to every
micro-batch: the micro-batch losses then *sum* to the full mini-batch loss, in every mode, so
accumulating their gradients is exactly one full-batch step.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from queryrl.algos.masked import masked_sum

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

_SEQ_MEAN_EPS = 1e-8  # verl's guard in seq-mean-token-mean


@dataclass(frozen=True)
class LossNormalizer:
    """Denominators of a whole mini-batch, shared by all of its micro-batches.

    Attributes:
        num_tokens: counted tokens in the mini-batch (``token-mean``).
        num_seqs: sequences with at least one counted token (the ``seq-mean-*`` modes).
        horizon: the constant divisor of ``seq-mean-token-sum-norm``.
    """

    num_tokens: float
    num_seqs: float
    horizon: float

    @classmethod
    def from_mask(cls, response_mask: Tensor, horizon: int | None = None) -> LossNormalizer:
        """Normaliser of the mini-batch whose mask is `response_mask` (N, T).

        Args:
            response_mask: (N, T) mask of the *whole* mini-batch (all ranks).
            horizon: divisor for ``seq-mean-token-sum-norm``; default ``T``. Pass the configured
                maximum response length so that it does not depend on padding.
        """
        return cls(
            num_tokens=float(response_mask.sum().item()),
            num_seqs=float((response_mask.sum(dim=-1) > 0).sum().item()),
            horizon=float(horizon if horizon is not None else response_mask.shape[-1]),
        )

    def __post_init__(self) -> None:
        if self.horizon <= 0:
            raise ValueError(f"LossNormalizer.horizon must be positive, got {self.horizon}")


def check_loss_agg_mode(loss_agg_mode: str) -> None:
    """Raise a ValueError naming the valid modes when `loss_agg_mode` is not one of them."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")


def agg_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    normalizer: LossNormalizer | None = None,
    dp_size: int = 1,
) -> Tensor:
    """Aggregate ``loss_mat`` (N, T) over ``loss_mask`` (N, T) into a scalar.

    Args:
        loss_mat: per-token losses (N, T).
        loss_mask: (N, T), 1 where a token counts.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.
        normalizer: the mini-batch's denominators. ``None`` uses this batch's own counts
            (verl's behaviour for a single micro-batch on one rank).
        dp_size: data-parallel ranks whose gradients are *averaged* afterwards (DDP/FSDP); the
            loss is scaled by it so the average equals the global-batch gradient. Above 1 every
            mode but ``token-sum`` needs the global `normalizer` (verl raises too): this rank's own
            counts would silently give another gradient.

    Returns:
        The scalar loss.

    Raises:
        ValueError: an unknown `loss_agg_mode`, or ``dp_size > 1`` without a `normalizer` in a
            mode that divides by a count.
    """
    check_loss_agg_mode(loss_agg_mode)
    if dp_size > 1 and normalizer is None and loss_agg_mode != "token-sum":
        counts = "token count" if loss_agg_mode == "token-mean" else "sequence count"
        raise ValueError(
            f"agg_loss(dp_size={dp_size}, loss_agg_mode={loss_agg_mode!r}) needs the global batch's {counts}: "
            "pass normalizer=LossNormalizer.from_mask(<the whole mini-batch's response_mask>)"
        )
    if loss_agg_mode == "token-mean":
        num_tokens = loss_mask.sum() if normalizer is None else normalizer.num_tokens
        return masked_sum(loss_mat, loss_mask) / num_tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size

    token_count = loss_mask.sum(dim=-1)  # (N,)
    seq_mask = (token_count > 0).to(loss_mat.dtype)  # (N,) fully masked sequences do not count
    seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)  # (N,) token-sum per sequence
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (token_count + _SEQ_MEAN_EPS)
    num_seqs = seq_mask.sum() if normalizer is None else normalizer.num_seqs
    loss = masked_sum(seq_losses, seq_mask) / num_seqs * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        horizon = loss_mask.shape[-1] if normalizer is None else normalizer.horizon
        loss = loss / horizon
    return loss
