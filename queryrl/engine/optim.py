"""AdamW with linear warm-up and a constant, cosine or linear schedule.

AdamW updates the parameters in their own dtype and keeps its moments in it: float32 parameters
(``model.dtype=float32``, with ``model.compute_dtype=bfloat16`` for bf16 compute) are the float32
master weights of mixed precision; training bfloat16/float16 parameters directly is warned about
(:func:`low_precision_message`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import torch
from torch import nn


def lr_lambda(step: int, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """The learning-rate multiplier after `step` optimizer-schedule steps.

    Linear warm-up from ``1/(warmup+1)`` to 1 over `warmup_steps`, then ``constant``, ``linear``
    decay to `min_lr_ratio`, or ``cosine`` decay to `min_lr_ratio` at `total_steps`.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    if schedule == "linear":
        return min_lr_ratio + (1 - min_lr_ratio) * (1 - progress)
    if schedule == "cosine":
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}; valid: constant, linear, cosine")


def low_precision_message(dtypes: set[torch.dtype], lr: float) -> str:
    """Why AdamW over bf16/fp16 parameters loses updates, and the setting that does not."""
    names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
    # an AdamW step moves a weight by about lr; bfloat16 keeps 8 significant bits (float16 11), so a
    # weight w rounds the step away when lr < half its ulp, i.e. |w| > ~2^8 lr (2^11 lr in float16)
    bits = 8 if torch.bfloat16 in dtypes else 11
    return (
        f"training {names} parameters: the weights and AdamW's moments are {names}, and an AdamW step "
        f"(about lr={lr:g} per weight) is rounded away on every weight larger than ~{2**bits * lr:.1e}, "
        "most of a pretrained model's at a fine-tuning lr. Use mixed precision instead: model.dtype=float32 "
        "model.compute_dtype=bfloat16 (float32 master weights and AdamW state, bfloat16 compute), or LoRA "
        "(model.lora.rank > 0: float32 adapters over the bfloat16 base)"
    )


def make_optimizer(
    params: Iterable[nn.Parameter],
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    warmup_steps: int,
    total_steps: int,
    schedule: str = "constant",
    min_lr_ratio: float = 0.0,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable `params` and its scheduler (stepped once per training step)."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    low = {p.dtype for p in trainable if p.dtype in (torch.bfloat16, torch.float16)}
    if low:
        warnings.warn(low_precision_message(low, lr), stacklevel=2)
    # foreach: torch's default on GPU, not on CPU, where the per-tensor loop costs a dispatch per op and
    # parameter (a visible share of a tiny model's step); the same numbers bit for bit (tests/engine/test_optim.py)
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=betas, foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_lambda(step, warmup_steps, total_steps, schedule, min_lr_ratio)
    )
    return optimizer, scheduler
