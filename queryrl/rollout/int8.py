"""Int8 copies of a frozen base model's linear layers, for rollouts on a CPU (``rollout.quantize=int8``).

Notation: `N` input rows, `in` / `out` a layer's input and output features.

Why: on a CPU every decoded token of a rollout is a few matrix-vector products per layer, bound by reading the
weights and by float32 arithmetic (a CPU without native bfloat16 has nothing faster). Under LoRA the base
weights never change, so an int8 copy of each can be made once and reused by every rollout; fbgemm's int8
GEMM (AVX2 and AVX512 kernels) reads a quarter of the bytes and multiplies in 8 bits.

The scheme is dynamic quantization as PyTorch's ``torch.ao.quantization.quantize_dynamic`` builds it (Jacob
et al. 2018, "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference";
the per-row weight scales as in LLM.int8, Dettmers et al. 2022, without its outlier split): each weight row
(output channel) is scaled to [-127, 127] by its own absolute maximum and rounded (symmetric, zero point 0);
each call quantizes its input to 8 bits with one scale and zero point over the whole (N, in) input (7 bits,
``REDUCE_RANGE``, so that fbgemm's AVX2 multiply-add of two int8 pairs cannot saturate in int16), accumulates
in int32 and returns float32 with the bias (float32) added. Everything else (embeddings, norms, attention,
the output head, the LoRA adapters) stays in full precision: only the rollout's samples and log-probs change,
by what ``training/rollout_probs_diff_*`` reports.

The two ops are ``torch.ops.quantized.linear_prepack`` / ``linear_dynamic`` (what ``quantize_dynamic``'s
``DynamicQuantizedLinear`` calls). PyTorch 2.13 marks ``torch.ao.quantization`` and the quantized tensor
constructors deprecated (it points to torchao); they are still its CPU int8 GEMM, so this module is their one
user here (:class:`Int8Linear`), to swap when they go. The one deprecation warning, from
``torch.quantize_per_channel``, is silenced where the copies are built.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

QUANTIZE_MODES = ("none", "int8")
# activations quantized to 7 bits: fbgemm's AVX2 kernels add products of two int8 pairs in int16, which 8-bit
# activations can overflow (DynamicQuantizedLinear passes the same)
REDUCE_RANGE = True


def check_mode(mode: str) -> bool:
    """Whether ``rollout.quantize`` `mode` quantizes (``int8``) or not (``none``); any other value is an error."""
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"rollout.quantize must be one of {', '.join(QUANTIZE_MODES)} (got {mode!r})")
    return mode == "int8"


def available_reason(device: torch.device) -> str | None:
    """Why int8 rollouts cannot run on `device` (None = they can): a CPU whose PyTorch has an int8 GEMM engine."""
    if device.type != "cpu":
        return f"rollout.quantize=int8 runs on a CPU only (the rollout is on {device})"
    engines = set(torch.backends.quantized.supported_engines)
    if not engines & {"x86", "fbgemm", "qnnpack", "onednn"}:
        return f"rollout.quantize=int8: this PyTorch has no int8 GEMM engine ({', '.join(sorted(engines))})"
    return None


class Int8Linear:
    """``F.linear(x, weight, bias)`` with `weight` (out, in) as an int8 copy (per-row scales), `bias` in float32.

    Calling it on (..., in) inputs of any floating dtype gives (..., out) in that dtype (the int8 GEMM takes and
    returns float32: other dtypes are cast around it). The copy does not follow later changes of `weight`.

    Attributes:
        built: how many copies this process has made (tests check that a run makes them once).
    """

    built = 0

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        w = weight.detach().to(device="cpu", dtype=torch.float32)
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()  # (out,) one scale per row
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel")
            q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        b = bias.detach().to(device="cpu", dtype=torch.float32) if bias is not None else None
        self.packed: Any = torch.ops.quantized.linear_prepack(q, b)
        self.out_features, self.in_features = int(w.shape[0]), int(w.shape[1])
        Int8Linear.built += 1

    def __call__(self, x: Tensor) -> Tensor:
        y: Tensor = torch.ops.quantized.linear_dynamic(x.float(), self.packed, REDUCE_RANGE)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def __repr__(self) -> str:
        return f"Int8Linear(in_features={self.in_features}, out_features={self.out_features})"


class Int8Module(nn.Module):
    """An :class:`Int8Linear` as a module, put in place of an ``nn.Linear`` for ``generate``
    (:func:`int8_linears`); it has no parameters (the float layer keeps them)."""

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
