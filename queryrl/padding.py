"""Re-padding token tensors to a common width: prompts on the left, responses on the right.

Notation: `N` rows, `L` columns before padding, `W` the width after. Prompts are left-padded (the
last prompt token sits next to the first response token), responses right-padded.
``RolloutOutput.concat`` (``queryrl.rollout.base``) and ``Batch.concat`` (``queryrl.engine.batch``)
both stack row-wise with these. :func:`shared_prefix` finds the leading tokens left-padded prompts have in
common (a system prompt), which the decoder, the update and SFT run once.

Only torch is imported here: every layer may use it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def pad_to(x: Tensor, width: int, value: float, *, left: bool) -> Tensor:
    """Pad `x` to `width` columns with `value`.

    Args:
        x: (N, L), any dtype; L <= width.
        width: W, the number of columns wanted.
        value: what the new columns hold (a pad token id, 0 for masks and log-probs).
        left: True puts the new columns before the existing ones (prompts), False after (responses).

    Returns:
        (N, W), same dtype and device; `x` itself when L == W.

    Raises:
        ValueError: L > W (padding never crops).
    """
    extra = width - x.shape[1]
    if extra < 0:
        raise ValueError(f"cannot pad {x.shape[1]} columns to {width}")
    if extra == 0:
        return x
    pad = x.new_full((x.shape[0], extra), value)  # (N, W - L)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


def cat_padded(tensors: Sequence[Tensor], width: int, value: float, *, left: bool) -> Tensor:
    """Stack (N_i, L_i) tensors row-wise into (sum N_i, W), each padded as :func:`pad_to` pads it.

    Args:
        tensors: at least one (N_i, L_i) tensor, all of one dtype, each L_i <= width.
        width: W.
        value: the pad value.
        left: pad on the left (prompts) or the right (responses).
    """
    return torch.cat([pad_to(x, width, value, left=left) for x in tensors])


def mask_positions(attention_mask: Tensor) -> Tensor:
    """Each row's own token positions from 0 (``cumsum(mask) - 1``), 0 on left padding: the
    ``position_ids`` of a left-padded batch, so a padded row sees the positions it would alone."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


# Distinct prompts that start with at least this many equal tokens run those once (the fast decoder's prefill,
# the shared-prompt forward of the update, SFT's micro-batches): below it the separate pass saves less than it
# costs. The query rewriter's 145-token system prompt is 45 % of its prompts' tokens on KdConv (mean 324).
MIN_SHARED_PREFIX = 16


def shared_prefix(ids: Tensor, mask: Tensor) -> int:
    """How many leading real tokens all rows of the left-padded `ids` (U, P) share (`mask` (U, P) bool): at
    most the shortest prompt's length minus one (each prompt keeps a token of its own), 0 for fewer than two
    rows or fewer than :data:`MIN_SHARED_PREFIX` shared tokens."""
    lengths = mask.sum(-1)
    shortest = int(lengths.min())
    if ids.shape[0] < 2 or shortest <= MIN_SHARED_PREFIX:
        return 0
    starts = (ids.shape[1] - lengths)[:, None] + torch.arange(shortest, device=ids.device)  # (U, L)
    heads = ids.gather(1, starts)
    differs = (heads != heads[:1]).any(0).nonzero()
    c = int(differs[0]) if differs.numel() else shortest
    c = min(c, shortest - 1)
    return c if c >= MIN_SHARED_PREFIX else 0
