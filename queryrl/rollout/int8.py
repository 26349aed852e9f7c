"""Int8 copies of a frozen base model's linear layers, for rollouts on a CPU (``rollout.quantize=int8``).

Notation: `N` input rows, `in` / `out` a layer's input and output features, `G` a rotation block.

Why: on a CPU every decoded token of a rollout is a few matrix-vector products per layer, bound by reading the
weights and by float32 arithmetic (a CPU without native bfloat16 has nothing faster). Under LoRA the base
weights never change, so an int8 copy of each can be made once and reused by every rollout; an int8 GEMM reads a
quarter of the bytes and multiplies in 8 bits (4x float32's rate at 16 rows here).

The scheme (:class:`Int8Linear`): ``y = (x R)(W R)^T + b`` with ``R`` a block-diagonal normalised Hadamard matrix
(blocks of ``G = gcd(in, 128)``, orthogonal, so this is ``x W^T + b`` exactly), then ``x R`` quantized per row
(one scale per token: its absolute maximum over 127) and ``W R`` per output row, an int8 x int8 -> int32 GEMM
(``torch._int_mm``, oneDNN), and the two scales applied to its output: LLM.int8's vector-wise quantization
(Dettmers et al. 2022) without its outlier split, after the rotation QuaRot uses (Ashkboos et al. 2024; QuIP's
incoherence processing, Chee et al. 2023). Why the rotation: a transformer's activations have a few channels
tens of times larger than the rest (Gemma 3 270M: up to 60x the median channel), and one scale per row would
round the rest to a step or two; the rotation spreads each such channel over its block. Measured on Gemma 3
270M's GRPO rollouts (16 samples of 48 tokens, float32): |p_rollout - p_float| mean 0.055 with PyTorch's
``quantize_dynamic`` scheme (one activation scale per call, no rotation), 0.019 with per-row scales, 0.005
with the rotation too (bfloat16 decoding: 0.004).

Weights use 7 bits (``[-63, 63]``) where the GEMM is not exact at 8: oneDNN's int8 kernels for CPUs without
VNNI (AVX2) add pairs of u8 x s8 products in saturating int16, which full-range weights overflow
(:func:`weight_levels` tests the kernel once). Everything else (embeddings, norms, attention, the output head,
the LoRA adapters) stays in full precision: only the rollout's samples and log-probs change, by what
``training/rollout_probs_diff_*`` reports. PyTorch's own ``torch.ao.quantization`` (``quantize_dynamic``) is
not used: 2.13 marks it deprecated, and its one activation scale per call is the inaccurate scheme above.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

QUANTIZE_MODES = ("none", "int8")
ROTATION_BLOCK = 128  # the largest Hadamard block; a layer's is the largest power of two dividing its inputs
_TINY = 1e-12  # the smallest scale: an all-zero row or weight stays zero


def check_mode(mode: str) -> bool:
    """Whether ``rollout.quantize`` `mode` quantizes (``int8``) or not (``none``); any other value is an error."""
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"rollout.quantize must be one of {', '.join(QUANTIZE_MODES)} (got {mode!r})")
    return mode == "int8"


def available_reason(device: torch.device) -> str | None:
    """Why int8 rollouts cannot run on `device` (None = they can): the int8 GEMM used here is a CPU one."""
    if device.type != "cpu":
        return f"rollout.quantize=int8 runs on a CPU only (the rollout is on {device})"
    return None


@functools.cache
def weight_levels() -> int:
    """127 when ``torch._int_mm`` is exact on full-range int8 operands on this CPU, else 63 (7-bit weights).

    Its worst case, every product 127 x 127 (or -127 x 127), overflows an int16 pair sum; a kernel that is exact
    there (VNNI's int32 dot products) is exact everywhere, one that is not (AVX2's saturating ``vpmaddubsw``) is
    exact with weights in [-63, 63] whatever the activations (255 x 63 x 2 < 2^15)."""
    k, n = 64, 8
    for value in (127, -127):
        a = torch.full((16, k), value, dtype=torch.int8)
        b = torch.full((k, n), 127, dtype=torch.int8)
        if not bool((torch._int_mm(a, b) == value * 127 * k).all()):
            return 63
    return 127


@functools.cache
def hadamard(size: int) -> Tensor:
    """The (size, size) normalised Hadamard matrix of Sylvester's construction (`size` a power of two)."""
    h = torch.ones(1, 1)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h / math.sqrt(size)


def rotation_block(features: int) -> int:
    """The Hadamard block of a layer with `features` inputs: the largest power of two dividing both them and
    :data:`ROTATION_BLOCK` (1: no rotation)."""
    return math.gcd(features, ROTATION_BLOCK)


def _rotate(x: Tensor, block: int) -> Tensor:
    """(N, in) `x` times the block-diagonal Hadamard matrix of `block`: one matmul over (N in / G, G)."""
    if block == 1:
        return x
    return (x.reshape(-1, block) @ hadamard(block)).reshape(x.shape)


class Int8Linear:
    """``F.linear(x, weight, bias)`` from an int8 copy of `weight` (out, in), rotated and scaled per output row
    (see the module's notes); `bias` stays float32.

    Calling it on (..., in) inputs of any floating dtype gives (..., out) in that dtype (the int8 GEMM's scales
    are applied in float32: other dtypes are cast around it). The copy does not follow later changes of `weight`.

    Attributes:
        built: how many copies this process has made (tests check that a run makes them once).
    """

    built = 0

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        w = weight.detach().to(device="cpu", dtype=torch.float32)
        self.out_features, self.in_features = int(w.shape[0]), int(w.shape[1])
        self.block = rotation_block(self.in_features)
        w = _rotate(w, self.block)
        self.scale = (w.abs().amax(dim=1) / weight_levels()).clamp(min=_TINY)  # (out,)
        q = torch.round(w / self.scale[:, None]).to(torch.int8)  # (out, in)
        # (in, out): oneDNN's int8 GEMM at 16 rows is 1.4-2.3x faster on a row-major copy when in > out (640 x 2048:
        # 0.14 against 0.32 ms) and 1.3x slower when in < out (4096 x 640: 0.38 against 0.29 ms) than on the view
        self.weight_t = q.t().contiguous() if self.in_features > self.out_features else q.t()
        self.bias = bias.detach().to(device="cpu", dtype=torch.float32) if bias is not None else None
        Int8Linear.built += 1

    def __call__(self, x: Tensor) -> Tensor:
        h = _rotate(x.reshape(-1, self.in_features).float(), self.block)  # (N, in)
        step = (h.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=_TINY)  # (N, 1): one scale per row
        y = torch._int_mm(torch.round(h / step).to(torch.int8), self.weight_t).float()  # (N, out)
        y = y.mul_(step).mul_(self.scale)
        if self.bias is not None:
            y = y.add_(self.bias)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def __repr__(self) -> str:
        return f"Int8Linear(in_features={self.in_features}, out_features={self.out_features}, block={self.block})"


class Int8Module(nn.Module):
    """An :class:`Int8Linear` as a module, put in place of an ``nn.Linear`` for ``generate``
    (:meth:`Int8Copies.swapped_in`); it has no parameters (the float layer keeps them)."""

    def __init__(self, linear: Int8Linear) -> None:
        super().__init__()
        self.linear = linear
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)


def _state_key(layer: nn.Linear) -> tuple[Any, ...]:
    """What changes when `layer`'s weights do: their storages and in-place version counters."""
    return tuple((p.data_ptr(), p._version) for p in (layer.weight, layer.bias) if p is not None)


def _is_lora_linear(module: nn.Module) -> bool:
    return type(module).__name__ == "Linear" and type(module).__module__.startswith("peft.tuners.lora")


def base_linears(model: nn.Module, head: nn.Module | None) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Every ``nn.Linear`` of `model` a rollout computes in int8, as ``(parent, attribute, layer)``: the base layer
    of each peft LoRA layer and each plain ``nn.Linear``, but not the output `head` and not the LoRA adapters."""
    adapters: set[int] = set()
    for module in model.modules():
        if _is_lora_linear(module):
            lora: Any = module
            adapters.update(id(m) for d in (lora.lora_A, lora.lora_B) for m in d.values())
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Linear and child is not head and id(child) not in adapters:
                found.append((parent, name, child))
    return found


class Int8Copies:
    """The int8 copies of a model's base linear layers, made once and remade only for a layer whose weights
    changed (a full fine-tune's step, ``load_state_dict``): under LoRA, once per run."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[tuple[Any, ...], Int8Module]] = {}

    def of(self, layer: nn.Linear) -> Int8Module:
        key = _state_key(layer)
        kept = self._copies.get(id(layer))
        if kept is None or kept[0] != key:
            self._copies[id(layer)] = (key, Int8Module(Int8Linear(layer.weight, layer.bias)))
        return self._copies[id(layer)][1]

    @contextlib.contextmanager
    def swapped_in(self, model: nn.Module, head: nn.Module | None) -> Iterator[None]:
        """Inside: `model`'s base linear layers (:func:`base_linears`) replaced by their int8 copies, so that its
        forward (``generate``) computes them in int8; the float layers put back after, whatever happens."""
        found = base_linears(model, head)
        try:
            for parent, name, layer in found:
                setattr(parent, name, self.of(layer))
            yield
        finally:
            for parent, name, layer in found:
                setattr(parent, name, layer)
