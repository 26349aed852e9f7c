"""The decoder stacks :class:`~queryrl.rollout.fast_decode.FastDecoder` runs: which models qualify, what
differs between them, and their weights as the decode reads them.

Notation as in :mod:`queryrl.rollout.fast_decode` (`E` hidden size, `Hq`/`Hkv` query/key-value heads,
`D` head dim, `I` MLP width, `V` vocabulary).

All of them are the same pre-norm decoder (transformers' ``modeling_{qwen2,qwen3,llama,gemma3}.py`` are
the reference): RMSNorm, RoPE (``rotate_half``), grouped-query attention, a gated MLP
``down(act(gate(h)) * up(h))``, a final RMSNorm and a tied or untied ``lm_head``. What differs:

- Qwen2: biases on q/k/v.
- Qwen3: a per-head RMSNorm on q and k, before RoPE.
- Llama (SmolLM2): optional biases on q/k/v/o (``attention_bias``) and on the MLP (``mlp_bias``).
- Gemma 3 (text only): RMSNorm multiplies by ``1 + weight`` in float32 and then casts (Llama casts, then
  multiplies); a norm after attention and before and after the MLP (4 per layer); q/k RMSNorm;
  ``gelu_pytorch_tanh``; embeddings times ``sqrt(E)`` cast to the embedding dtype; softmax scale
  ``query_pre_attn_scalar ** -0.5``; optional final logit softcapping ``c tanh(logits / c)``.

Sliding-window layers (``config.layer_types``: Gemma 3's local layers, Qwen2/Qwen3 with
``use_sliding_window``): the query at cache slot q attends to slots ``(q - W, q]``, transformers'
``sliding_window_overlay`` on cache positions (so padding slots count, as in ``generate``). Each layer
type may have its own RoPE table (Gemma 3: a local base on sliding layers, the global base on full
ones). RoPE: the module's own ``inv_freq`` buffers and ``attention_scaling``, for every ``rope_type``
whose frequencies do not depend on the sequence length (``STATIC_ROPE_TYPES``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from queryrl.rollout.int8 import Int8Linear
from queryrl.rollout.peft_weights import (
    base_model,
    is_lora_linear,
    linear_weights,
    lora_factors,
    lora_reason,
    peft_reason,
)


@dataclass(frozen=True)
class _Family:
    model_type: str  # config.model_type
    act_key: str  # the config key naming the MLP activation
    embed_class: str  # type(model.model.embed_tokens).__name__ ("": exactly nn.Embedding)
    gemma: bool  # Gemma's norms (1 + weight, 4 per layer), scaled embeddings, query_pre_attn_scalar


FAMILIES = {
    "Qwen2ForCausalLM": _Family("qwen2", "hidden_act", "", False),
    "Qwen3ForCausalLM": _Family("qwen3", "hidden_act", "", False),
    "LlamaForCausalLM": _Family("llama", "hidden_act", "", False),
    "Gemma3ForCausalLM": _Family("gemma3_text", "hidden_activation", "Gemma3TextScaledWordEmbedding", True),
}
SUPPORTED_ARCHITECTURES = {name: f.model_type for name, f in FAMILIES.items()}
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
}
# RoPE types whose inv_freq is fixed at construction ("dynamic" and "longrope" change it with the length)
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LAYER_TYPES = ("full_attention", "sliding_attention")
# forward hooks that change no value, which the fast path may skip: gradient checkpointing makes the
# embeddings' output require grad (transformers' enable_input_require_grads)
_INERT_HOOKS = {"PreTrainedModel.enable_input_require_grads.<locals>.make_inputs_require_grads"}


def rope_types(model: nn.Module) -> dict[str, Any]:
    """RoPE table key -> rope_type: one table ``""`` (Qwen, Llama), or one per layer type (Gemma 3);
    None where the model has no rotary module."""
    rotary: Any = getattr(getattr(model, "model", None), "rotary_emb", None)
    kinds: Any = getattr(rotary, "rope_type", None)
    return dict(kinds) if isinstance(kinds, dict) else {"": kinds}


def _config_reason(model: nn.Module, family: _Family) -> str | None:
    """What in `model`'s config the fast path does not compute (None = nothing)."""
    name, config = type(model).__name__, getattr(model, "config", None)
    if getattr(config, "model_type", None) != family.model_type:
        return f"model_type {getattr(config, 'model_type', None)!r} for {name}"
    act = getattr(config, family.act_key, None)
    if act not in ACTIVATIONS:
        return f"{family.act_key} {act!r} (supported: {', '.join(ACTIVATIONS)})"
    layer_types = list(getattr(config, "layer_types", None) or [])
    if any(t not in LAYER_TYPES for t in layer_types):
        return f"layer_types {sorted(set(layer_types) - set(LAYER_TYPES))} (supported: {', '.join(LAYER_TYPES)})"
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in layer_types and not (isinstance(window, int) and window > 0):
        return f"sliding-window layers with sliding_window {window!r} (want an integer > 0)"
    if getattr(config, "use_bidirectional_attention", False):
        return "use_bidirectional_attention (only causal attention)"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "attn_logit_softcapping (attention logit softcapping)"
    kinds = rope_types(model)
    for key, kind in kinds.items():
        if kind not in STATIC_ROPE_TYPES:
            where = f" ({key})" if key else ""
            return f"rope_type {kind!r}{where} (supported: {', '.join(STATIC_ROPE_TYPES)})"
    if family.gemma and not set(layer_types) <= set(kinds):
        return f"no RoPE parameters for layer types {sorted(set(layer_types) - set(kinds))}"
    return None


def unsupported_reason(model: nn.Module) -> str | None:
    """Why :class:`~queryrl.rollout.fast_decode.FastDecoder` cannot run `model` (None = it can).

    Supported: a ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``LlamaForCausalLM`` or (text-only)
    ``Gemma3ForCausalLM``, plain or in a peft LoRA ``PeftModel``, whose projections are ``nn.Linear`` or
    peft's plain LoRA ``Linear`` over one (no DoRA or other variants, no LoRA bias, not merged: see
    :func:`~queryrl.rollout.peft_weights.lora_reason`), with its own embeddings class and a plain
    ``lm_head`` (no quantized modules), a SiLU or tanh-GELU MLP, full or sliding-window causal attention
    without attention logit softcapping, RoPE of a type in ``STATIC_ROPE_TYPES``, no forward hooks
    (but the one gradient checkpointing adds, which changes no value), all parameters on one device.
    """
    not_lora = peft_reason(model)
    if not_lora is not None:
        return not_lora
    source, model = model, base_model(model)
    name = type(model).__name__
    if name not in FAMILIES:
        return f"architecture {name} (supported: {', '.join(FAMILIES)})"
    family = FAMILIES[name]
    reason = _config_reason(model, family)
    if reason is not None:
        return reason
    base = getattr(model, "model", None)
    try:
        layers = list(base.layers)  # type: ignore[union-attr]
        linears = [model.lm_head]
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            linears += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
        embed = base.embed_tokens  # type: ignore[union-attr]
    except AttributeError as err:
        return f"unexpected module layout ({err})"
    # a plain nn.Embedding, or Gemma 3's own class (by exact type: peft's LoRA Embedding wraps either)
    if family.embed_class:
        own_embed = type(embed).__name__ == family.embed_class and type(embed).__module__.startswith("transformers.")
    else:
        own_embed = type(embed) is nn.Embedding
    if not own_embed or type(model.lm_head) is not nn.Linear:
        return "wrapped or quantized embeddings or lm_head (peft, bitsandbytes)"
    for linear in linears[1:]:
        reason = lora_reason(linear)  # type: ignore[arg-type]
        if reason is not None:
            return reason
    if len(layers) != model.config.num_hidden_layers:  # type: ignore[union-attr]
        return "num_hidden_layers does not match the layers"
    for module in source.modules():
        hooks = [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]
        if "_hf_hook" in module.__dict__ or any(getattr(h, "__qualname__", "") not in _INERT_HOOKS for h in hooks):
            return "forward hooks (user hooks, accelerate offloading): the fast path would skip them"
    devices = {p.device for p in source.parameters()}
    if len(devices) != 1 or next(iter(devices)).type == "meta":
        return f"parameters on {len(devices)} devices or on meta ({', '.join(sorted(map(str, devices)))})"
    return None


@dataclass(frozen=True)
class Plan:
    """What a decode computes besides the weights, read once from a supported model's config."""

    num_heads: int  # Hq
    num_kv_heads: int  # Hkv
    head_dim: int  # D
    eps: float  # every RMSNorm's epsilon
    scaling: float  # the softmax scale of attention
    act: Callable[[Tensor], Tensor]  # the MLP activation
    softcap: float | None  # final logit softcapping
    gemma: bool

    @staticmethod
    def of(model: Any) -> Plan:
        """`model`: a supported ``*ForCausalLM`` (not a peft wrapper)."""
        config, family = model.config, FAMILIES[type(model).__name__]
        attn = model.model.layers[0].self_attn
        softcap = getattr(config, "final_logit_softcapping", None)
        return Plan(
            num_heads=int(config.num_attention_heads),
            num_kv_heads=int(config.num_key_value_heads),
            head_dim=int(attn.head_dim),
            eps=float(config.rms_norm_eps),
            scaling=float(attn.scaling),
            act=ACTIVATIONS[getattr(config, family.act_key)],
            softcap=float(softcap) if softcap is not None else None,
            gemma=family.gemma,
        )


def rope_tables(model: Any) -> dict[str, tuple[Tensor, float]]:
    """RoPE table key -> (``inv_freq`` (D/2,), ``attention_scaling``) as the rotary module holds them."""
    rotary = model.model.rotary_emb
    if isinstance(rotary.rope_type, dict):  # Gemma 3: one table per layer type
        keys = list(rotary.rope_type)
        return {k: (getattr(rotary, f"{k}_inv_freq"), float(getattr(rotary, f"{k}_attention_scaling"))) for k in keys}
    return {"": (rotary.inv_freq, float(rotary.attention_scaling))}


# (weight, bias) pairs applied to one input, their outputs end to end: q/k/v, gate/up (an int8 weight: its bias
# packed with it, None here)
Projection = list[tuple[Tensor | Int8Linear, Tensor | None]]
# LoRA adapters of a projection (or of a fused group, on its concatenated outputs): (A (R, in), B (out, R)),
# B scaled; they add (x A^T) B^T (see queryrl.rollout.peft_weights.lora_factors)
Lora = tuple[Tensor, Tensor]
# the fused QKV and gate/up copies of all layers together may take this much memory; beyond it
# (from about 100M parameters in float32, where the matmuls outweigh the op saved) each
# projection keeps its own matmul, and nothing is copied
FUSE_MAX_BYTES = 256 * 2**20


@dataclass
class Layer:
    """One decoder layer's weights (the module's own tensors, the fused projections, the derived norm
    weights) and its attention pattern. A norm weight in float32 scales before the cast (Gemma's
    ``1 + weight``), one in the compute dtype after it (see ``FastDecoder._norm``)."""

    input_norm: Tensor  # (E,)
    qkv: Projection  # to ((Hq + 2 Hkv) D) outputs
    qk_norm: Tensor | None  # (Hq + Hkv, D), per-head q_norm / k_norm weights (Qwen3, Gemma 3)
    o_proj_t: Tensor | Int8Linear  # (Hq D, E), a transposed view: x + a @ o_proj_t is one addmm (or int8, biased)
    o_bias: Tensor | None  # (E,)
    post_attn_norm: Tensor | None  # (E,), Gemma 3: on the attention output, before the residual
    pre_mlp_norm: Tensor  # (E,), post_attention_layernorm (Qwen, Llama), pre_feedforward_layernorm (Gemma)
    gate_up: Projection  # to (2 I) outputs
    down_t: Tensor | Int8Linear  # (I, E), a transposed view (or an int8 copy, its bias packed with it)
    down_bias: Tensor | None  # (E,), Llama's mlp_bias
    post_mlp_norm: Tensor | None  # (E,), Gemma 3: on the MLP output, before the residual
    window: int | None  # sliding window W (None = full attention)
    rope: str  # the key of its RoPE table
    # LoRA adapters, added to the base projections' outputs (None = none, or not read yet: see read_weights)
    qkv_lora: Lora | None = None
    o_lora: Lora | None = None
    gate_up_lora: Lora | None = None
    down_lora: Lora | None = None


@dataclass
class Weights:
    """Every weight a decode reads, in the compute dtype (norm weights: see :class:`Layer`)."""

    embed: Tensor  # (V, E)
    embed_scale: Tensor | None  # () Gemma 3's sqrt(E), in the compute dtype
    layers: list[Layer]
    norm: Tensor  # (E,) the final RMSNorm
    head: tuple[Tensor, Tensor | None]  # lm_head (V, E) and its bias
    # a restricted head's token id of each of its K rows (queryrl.models.vocab; head (K, E)), else None
    vocab: Tensor | None = None


def _projection(linears: list[nn.Module], fuse: bool, dtype: torch.dtype) -> Projection:
    """`linears` (LoRA layers: their base layers) as one matmul on their concatenated weights (a copy), or
    one each (no copy unless the dtype needs one)."""
    pairs = [linear_weights(x, dtype) for x in linears]
    if not fuse:
        return list(pairs)
    bias = None
    if any(b is not None for _, b in pairs):
        bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])
    return [(torch.cat([w for w, _ in pairs]), bias)]


def _qkv(layer: Any) -> list[nn.Module]:
    return [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]


def read_weights(model: Any, plan: Plan, dtype: torch.dtype, lora: bool = True) -> Weights:
    """The current weights of a supported ``*ForCausalLM`` `model` (QKV and gate/up concatenated now,
    when small enough; cast to `dtype`): LoRA layers' base weights, and with `lora` their adapters
    (:func:`with_lora` adds them to weights read without)."""
    base, head = model.model, model.lm_head

    def norm(module: Any) -> Tensor:  # Gemma: 1 + w in float32 (of w as stored in `dtype`), scaled before the cast
        return 1.0 + module.weight.to(dtype).float() if plan.gemma else module.weight.to(dtype)

    fused = [
        (x.base_layer if is_lora_linear(x) else x).weight
        for layer in base.layers
        for x in (*_qkv(layer), layer.mlp.gate_proj, layer.mlp.up_proj)
    ]
    fuse = sum(w.numel() for w in fused) * (torch.finfo(dtype).bits // 8) <= FUSE_MAX_BYTES
    layer_types = list(getattr(model.config, "layer_types", None) or [])
    layers = []
    for i, layer in enumerate(base.layers):
        a, m = layer.self_attn, layer.mlp
        qk_norm = None
        if hasattr(a, "q_norm"):  # an RMSNorm over D on every q and k head
            qk_norm = torch.cat(
                [norm(a.q_norm).expand(plan.num_heads, -1), norm(a.k_norm).expand(plan.num_kv_heads, -1)]
            )
        o_weight, o_bias = linear_weights(a.o_proj, dtype)
        down_weight, down_bias = linear_weights(m.down_proj, dtype)
        sliding = bool(layer_types) and layer_types[i] == "sliding_attention"
        layers.append(
            Layer(
                input_norm=norm(layer.input_layernorm),
                qkv=_projection(_qkv(layer), fuse, dtype),
                qk_norm=qk_norm,
                o_proj_t=o_weight.t(),
                o_bias=o_bias,
                post_attn_norm=norm(layer.post_attention_layernorm) if plan.gemma else None,
                pre_mlp_norm=norm(layer.pre_feedforward_layernorm if plan.gemma else layer.post_attention_layernorm),
                gate_up=_projection([m.gate_proj, m.up_proj], fuse, dtype),
                down_t=down_weight.t(),
                down_bias=down_bias,
                post_mlp_norm=norm(layer.post_feedforward_layernorm) if plan.gemma else None,
                window=int(model.config.sliding_window) if sliding else None,
                rope=layer_types[i] if plan.gemma else "",
            )
        )
    weights = Weights(
        embed=base.embed_tokens.weight.to(dtype),
        embed_scale=base.embed_tokens.embed_scale.to(dtype) if plan.gemma else None,
        layers=layers,
        norm=norm(base.norm),
        head=(head.weight.to(dtype), head.bias.to(dtype) if head.bias is not None else None),
        vocab=getattr(head, "vocab_ids", None),
    )
    return with_lora(weights, model, dtype) if lora else weights


def with_lora(weights: Weights, model: Any, dtype: torch.dtype) -> Weights:
    """`weights` (read without adapters) with `model`'s current LoRA adapters in `dtype`: small copies
    (A and the scaled B of every adapted projection), read afresh, the base weights shared."""
    layers = []
    for w, layer in zip(weights.layers, model.model.layers, strict=True):
        m = layer.mlp
        layers.append(
            replace(
                w,
                qkv_lora=lora_factors(_qkv(layer), dtype),
                o_lora=lora_factors([layer.self_attn.o_proj], dtype),
                gate_up_lora=lora_factors([m.gate_proj, m.up_proj], dtype),
                down_lora=lora_factors([m.down_proj], dtype),
            )
        )
    return replace(weights, layers=layers)


def quantized(weights: Weights) -> Weights:
    """`weights` (read without adapters) with every decoder projection as an :class:`~queryrl.rollout.int8.Int8Linear`
    copy, its bias packed with it (``rollout.quantize=int8``); embeddings, norms and the output head as they are.
    Per-row scales make a fused QKV or gate/up copy the same as its parts quantized one by one."""

    def int8(pairs: Projection) -> Projection:
        return [(Int8Linear(m, b) if isinstance(m, Tensor) else m, None) for m, b in pairs]

    layers = []
    for w in weights.layers:
        assert isinstance(w.o_proj_t, Tensor), "quantized twice"
        assert isinstance(w.down_t, Tensor), "quantized twice"
        layers.append(
            replace(
                w,
                qkv=int8(w.qkv),
                o_proj_t=Int8Linear(w.o_proj_t.t(), w.o_bias),
                o_bias=None,
                gate_up=int8(w.gate_up),
                down_t=Int8Linear(w.down_t.t(), w.down_bias),
                down_bias=None,
            )
        )
    return replace(weights, layers=layers)
