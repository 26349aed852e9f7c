"""Dispatch and collect: split a batch by data-parallel rank, concatenate the ranks' results.

verl's ``DP_COMPUTE_PROTO``: rank ``r`` of ``W`` gets a contiguous block of rows (the first
``N % W`` ranks one row more), and the results, in rank order, concatenate back to the batch's
row order. A rank may get no rows (fewer rows than ranks); it still takes part in collectives.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from queryrl.engine.batch import Batch


def shard_ranges(num_rows: int, world_size: int) -> list[range]:
    """Contiguous, balanced row ranges, one per rank, covering ``range(num_rows)`` in order."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    base, extra = divmod(num_rows, world_size)
    out, start = [], 0
    for rank in range(world_size):
        size = base + (1 if rank < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def dispatch(batch: Batch, world_size: int) -> list[Batch]:
    """The shards of `batch`, one per rank, without the non-tensor columns (workers need tensors only)."""
    light = dataclasses.replace(batch, non_tensor={})
    return [light.select(list(rows)) for rows in shard_ranges(len(batch), world_size)]


def collect(parts: list[Tensor]) -> Tensor:
    """Concatenate the ranks' (n_r, ...) results in rank order."""
    return torch.cat(parts)
