"""Re-padding token tensors to a common width: prompts on the left, responses on the right.

Notation: `N` rows, `L` columns before padding, `W` the width after. Prompts are left-padded (the
last prompt token sits next to the first response token), responses right-padded.
``RolloutOutput.concat`` (``queryrl.rollout.base``) and ``Batch.concat`` (``queryrl.engine.batch``)
both stack row-wise with these.

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
