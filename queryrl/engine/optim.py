"""AdamW with linear warm-up and a constant, cosine or linear schedule, built from a role's config node.

:func:`optimizer_from_config` is the one way the trainers build an optimizer: each role's node
(``actor``, ``critic``, ``sft``) names its AdamW settings and schedule, as torchtune builds each
component from its config node and verl gives actor and critic the same ``optim`` section.

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
from omegaconf import DictConfig
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


# the node of each role and its key for the learning-rate warm-up: the critic's ``warmup_steps`` is verl's
# ``critic_warmup`` (steps before the actor starts updating), so its learning-rate warm-up is ``lr_warmup_steps``
OPTIM_ROLES: dict[str, str] = {"actor": "warmup_steps", "critic": "lr_warmup_steps", "sft": "warmup_steps"}


def optimizer_from_config(
    params: Iterable[nn.Parameter], cfg: DictConfig, role: str, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `params` and its schedule, as the run config `cfg` sets them for `role` (actor, critic, sft).

    The node ``cfg.<role>`` gives ``lr``, ``weight_decay``, ``betas``, the warm-up (:data:`OPTIM_ROLES`),
    ``lr_schedule`` and ``min_lr_ratio``; `total_steps` is where a cosine or linear schedule ends.
    """
    if role not in OPTIM_ROLES:
        raise ValueError(f"no optimizer for role {role!r}; valid: {', '.join(OPTIM_ROLES)}")
    node = cfg[role]
    betas = [float(b) for b in node.betas]
    if len(betas) != 2:
        raise ValueError(f"{role}.betas must be two numbers (AdamW's beta1, beta2), got {list(node.betas)}")
    return make_optimizer(
        params,
        lr=float(node.lr),
        weight_decay=float(node.weight_decay),
        betas=(betas[0], betas[1]),
        warmup_steps=int(node[OPTIM_ROLES[role]]),
        total_steps=total_steps,
        schedule=str(node.lr_schedule),
        min_lr_ratio=float(node.min_lr_ratio),
    )
