"""The effective weights of peft LoRA layers, for code that reads weights instead of calling forward.

A peft LoRA ``Linear`` computes ``base(x) + sum over active adapters of scaling * B(A(dropout(x)))``;
with dropout off (eval) that is one linear map with weight ``W + sum of scaling * B @ A`` (what
``get_delta_weight`` and peft's merge compute). :func:`linear_weights` returns that merged weight as
a new tensor, never touching the module; :func:`lora_reason` says when a layer is not such a map
(DoRA and other variants, a LoRA bias, adapters already merged, a quantized base layer). peft is
duck-typed here (its classes by module name), so nothing imports it unless a model uses it.
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


def adapter_state(model: nn.Module) -> tuple[Any, ...]:
    """What decides a LoRA layer's effective weight besides its parameters, for every LoRA layer."""
    state: list[Any] = []
    for module in model.modules():
        if is_lora_linear(module):
            lora: Any = module
            active = tuple(a for a in lora.active_adapters if a in lora.lora_A)
            state.append((bool(lora.disable_adapters), active, tuple(float(lora.scaling[a]) for a in active)))
    return tuple(state)


def linear_weights(linear: nn.Module, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """`linear`'s effective (weight, bias) in `dtype`: a LoRA layer's merged weight (the same function
    as peft's forward, up to rounding), the module's own tensors when nothing needs deriving."""
    lora: Any = linear
    base: Any = lora.base_layer if is_lora_linear(linear) else linear
    weight, bias = base.weight, base.bias
    if is_lora_linear(linear) and not lora.disable_adapters:
        deltas = [lora.get_delta_weight(a) for a in lora.active_adapters if a in lora.lora_A]
        if deltas:  # W + sum of scaling * B @ A, added in float32
            weight = weight.float() + sum(d.float() for d in deltas)
    return weight.to(dtype), (bias.to(dtype) if bias is not None else None)
