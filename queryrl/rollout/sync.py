"""What a rollout engine receives: plain full tensors of the merged policy, one at a time.

A rollout engine with weights of its own (vLLM; the tests' stand-in) loads them by name into
full-size parameters; vLLM's default loader does ``param.data.copy_(loaded_weight)``, which
accepts neither a DTensor shard nor a tensor of another shape. :func:`rollout_weights` yields
exactly what such a loader needs, from the trainer's policy as it is (local, or sharded by
FSDP2 over a process group, full weights, LoRA, mixed precision), and never changes it:

- a plain module's parameters and persistent buffers, as copies (a DTensor is gathered with
  ``full_tensor()`` first);
- a peft LoRA ``Linear`` as the single weight it computes in eval mode,
  ``W + sum over active adapters of scaling * B @ A``, added in float32 into a new tensor under
  the base layer's name (``...q_proj.weight``, as the plain model's state dict names it). The
  adapters are never merged in place: under FSDP2 an in-place merge lands on the gathered copy
  while the unmerge lands on the shards, corrupting the trainer's weights at every sync.

It is a generator, consumed by the engine's loader as it goes: one tensor (a LoRA layer: its
base weight and adapters) is gathered at a time, so the extra memory stays about one layer.
Under FSDP2 every gather is a collective: every rank of the group must run the whole generator,
in the same order (the walk is deterministic).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from queryrl.rollout.peft_weights import base_model, is_lora_linear, lora_reason, peft_reason


def rollout_weights(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` of the plain (non-peft) model `model` computes, one at a time (see the module docstring).

    Args:
        model: the trainer's policy: a causal LM, or a peft LoRA model around one; FSDP2-sharded or not.
        dtype: the engine's dtype for floating tensors (None: each tensor's own; a LoRA layer's: its base
            weight's).

    Yields:
        names as the plain model's ``state_dict`` has them (tied weights under each of their names),
        values new, full, plain tensors on the parameters' device.

    Raises:
        ValueError: a peft adapter that is not one linear map per layer (prompt tuning, DoRA, LoRA on an
            embedding, adapters merged in place), named with the layer.
    """
    reason = peft_reason(model)
    if reason is not None:
        raise ValueError(f"cannot hand {reason} to a rollout engine")
    yield from _walk(base_model(model), "", dtype)


def _walk(module: nn.Module, prefix: str, dtype: torch.dtype | None) -> Iterator[tuple[str, Tensor]]:
    """`module`'s tensors in ``state_dict`` order: its parameters, its persistent buffers, then its children."""
    if is_lora_linear(module):
        yield from _lora_linear(module, prefix, dtype)
        return
    if type(module).__module__.startswith("peft."):
        raise ValueError(
            f"{prefix.rstrip('.') or 'the model'}: a peft layer of type {type(module).__name__} cannot be handed to a "
            "rollout engine (only LoRA on Linear projections; set model.lora.target_modules to linear layers)"
        )
    for name, param in module._parameters.items():
        if param is not None:
            yield prefix + name, _copy(_full(param), dtype)
    for name, buffer in module._buffers.items():
        if buffer is not None and name not in module._non_persistent_buffers_set:
            yield prefix + name, _copy(_full(buffer), dtype)
    for name, child in module._modules.items():
        if child is not None:
            yield from _walk(child, f"{prefix}{name}.", dtype)


def _lora_linear(layer: nn.Module, prefix: str, dtype: torch.dtype | None) -> Iterator[tuple[str, Tensor]]:
    """A peft LoRA ``Linear`` as one weight (and the base bias) under the base layer's names."""
    reason = lora_reason(layer)
    if reason is not None:
        raise ValueError(f"{prefix.rstrip('.')}: {reason} cannot be handed to a rollout engine as one weight")
    lora: Any = layer
    base = _full(lora.base_layer.weight)  # (out, in)
    merged: Tensor | None = None  # W + sum of scaling * B @ A, float32, a new tensor (never in place)
    if not lora.disable_adapters:
        for name in lora.active_adapters:
            if name not in lora.lora_A:
                continue
            a = _full(lora.lora_A[name].weight).float()  # (r, in)
            b = _full(lora.lora_B[name].weight).float()  # (out, r)
            merged = (base.float() if merged is None else merged) + float(lora.scaling[name]) * (b @ a)
    target = dtype or base.dtype
    # the merged tensor is already new: only a dtype change copies it again; the bare base is always copied
    weight = merged.to(target) if merged is not None else _copy(base, target)
    yield prefix + "weight", weight
    if lora.base_layer.bias is not None:
        yield prefix + "bias", _copy(_full(lora.base_layer.bias), dtype)


def _full(tensor: Tensor) -> Tensor:
    """The whole of `tensor`: a DTensor (an FSDP2 shard) gathered over its mesh (a collective), else itself."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        return tensor.full_tensor().detach()
    return tensor.detach()


def _copy(tensor: Tensor, dtype: torch.dtype | None) -> Tensor:
    """A new tensor with `tensor`'s values, floating ones in `dtype` (the engine never aliases the trainer)."""
    target = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.to(dtype=target, copy=True)
