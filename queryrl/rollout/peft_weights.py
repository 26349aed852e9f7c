"""The weights of peft LoRA layers, for code that reads weights instead of calling forward.

A peft LoRA ``Linear`` computes ``base(x) + sum over active adapters of scaling * B(A(dropout(x)))``;
with dropout off (eval) that is the base layer's linear map plus a low-rank one. :func:`linear_weights`
returns the base layer's own (weight, bias), :func:`lora_factors` the low-rank part of one or more
projections as two small matrices, so that a reader computes ``x W^T + (x A^T) B^T`` as peft's forward
does, without merging (a merge rewrites every projection's weight after each optimizer step).
:func:`lora_reason` says when a layer is not such a map (DoRA and other variants, a LoRA bias, adapters
already merged, a quantized base layer). peft is duck-typed here (its classes by module name), so nothing
imports it unless a model uses it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def base_model(model: nn.Module) -> nn.Module:
    """The causal LM inside a peft ``PeftModel`` (with its LoRA layers in place), or `model` itself."""
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        base: nn.Module = model.get_base_model()  # type: ignore[operator]
        return base
    return model


def peft_reason(model: nn.Module) -> str | None:
    """Why a peft-wrapped `model` is not served (prompt tuning and the like add inputs; None = LoRA only)."""
    if not (hasattr(model, "peft_config") and hasattr(model, "get_base_model")):
        return None
    active: Any = getattr(model, "active_adapters", None) or [getattr(model, "active_adapter", "default")]
    configs: Any = model.peft_config
    kinds = {str(getattr(configs[a], "peft_type", "?")).rsplit(".", 1)[-1] for a in active if a in configs}
    if kinds != {"LORA"}:
        return f"peft adapters of type {', '.join(sorted(kinds)) or '?'} (only LoRA)"
    return None


def is_lora_linear(layer: nn.Module) -> bool:
    return type(layer).__name__ == "Linear" and type(layer).__module__.startswith("peft.tuners.lora")


def lora_reason(layer: nn.Module) -> str | None:
    """Why the projection `layer` cannot be read as one weight matrix (None = it can)."""
    if type(layer) is nn.Linear:
        return None
    if not is_lora_linear(layer):
        return f"wrapped or quantized layers ({type(layer).__module__}.{type(layer).__name__}: peft, bitsandbytes)"
    lora: Any = layer
    if type(lora.base_layer) is not nn.Linear:
        return "LoRA over a wrapped or quantized layer (QLoRA, bitsandbytes)"
    if lora.merged:
        return "LoRA adapters merged into the weights (merge_adapter)"
    if lora.fan_in_fan_out:
        return "LoRA with fan_in_fan_out"
    for name in lora.active_adapters:
        if name in lora.lora_variant:
            return f"LoRA variant {type(lora.lora_variant[name]).__name__} (DoRA and the like)"
        if name in lora.lora_B and lora.lora_B[name].bias is not None:
            return "LoRA with lora_bias"
    return None


def lora_parameters(model: nn.Module) -> set[int]:
    """The ``id`` of every LoRA A and B matrix in `model` (what an adapter-only optimizer step changes)."""
    ids: set[int] = set()
    for module in model.modules():
        if is_lora_linear(module):
            lora: Any = module
            for factors in (lora.lora_A, lora.lora_B):
                ids.update(id(p) for p in factors.parameters())
    return ids


def linear_weights(linear: nn.Module, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """`linear`'s own (weight, bias) in `dtype`; for a LoRA layer its base layer's (see :func:`lora_factors`)."""
    base: Any = linear.base_layer if is_lora_linear(linear) else linear
    return base.weight.to(dtype), (base.bias.to(dtype) if base.bias is not None else None)


def lora_factors(linears: list[nn.Module], dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
    """The active adapters of `linears`, whose outputs are concatenated, as ``(A, B)`` in `dtype`: A (R, in)
    stacks every adapter's A, B (sum of the outputs, R) is block-diagonal with each adapter's B times its
    scaling (scaled in float32), so that the adapters add ``(x A^T) B^T`` to the concatenated outputs; None
    when no layer has an enabled active adapter."""
    a_rows: list[Tensor] = []
    blocks: list[tuple[int, Tensor]] = []  # (output offset, scaled B)
    offset = 0
    for linear in linears:
        lora: Any = linear
        if is_lora_linear(linear) and not lora.disable_adapters:
            for name in lora.active_adapters:
                if name in lora.lora_A:
                    a_rows.append(lora.lora_A[name].weight)
                    blocks.append((offset, lora.lora_B[name].weight.float() * float(lora.scaling[name])))
        base: Any = lora.base_layer if is_lora_linear(linear) else linear
        offset += int(base.weight.shape[0])
    if not a_rows:
        return None
    a = torch.cat(a_rows).to(dtype)
    b = a.new_zeros(offset, a.shape[0])
    column = 0
    for row, block in blocks:
        b[row : row + block.shape[0], column : column + block.shape[1]] = block.to(dtype)
        column += block.shape[1]
    return a, b
