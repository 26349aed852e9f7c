"""A generation-only forward for Qwen2/Qwen3 causal LMs: prefill, then one token at a time.

Notation: `B` sequences, `U` distinct prompts among them, `P` prompt tokens (left-padded), `T`
response tokens, `S = P + T` cache slots, `V` vocabulary, `E` hidden size, `I` MLP width, `Hq`
query heads, `Hkv` key/value heads, `G = Hq / Hkv`, `D` head dim.

Why: on a small model a decode step of ``model.generate`` costs transformers' Python and
dispatch overhead (module calls, mask building, cache objects, output classes, logits
processors), not arithmetic. This computes the same function with about fifteen torch ops per
layer: one fused QKV matmul; RoPE from a table built once per batch, applied to all heads of the
step at once (the identity on the value heads) so that keys and values reach the cache in one
copy; a preallocated KV cache written in place; ``scaled_dot_product_attention`` with the G query
heads of a KV head folded into its query rows (GQA without repeating K/V); RMSNorm; one fused
gate/up matmul; ``addmm`` for each projection and its residual; the (tied or not) ``lm_head``.
The n samples of a prompt share one prefill (``generate`` runs it n times).

Weights are read from the Hugging Face module by every :meth:`FastDecoder.generate`: the QKV and
gate/up matrices are concatenated afresh (a few ``torch.cat``; not at all when those copies would
exceed ``FUSE_MAX_BYTES``, then each projection keeps its own matmul), the rest are the module's
own tensors, so a colocated optimizer step made in place on the module is always seen, with
nothing to refresh in ``update_weights``.

LoRA (a peft ``PeftModel``, or LoRA layers injected in place) and a compute dtype other than the
parameters' (mixed precision: float32 master weights, bfloat16 decoding) are served from derived
copies: each LoRA projection's merged weight ``W + scaling * B @ A`` (summed over the active
adapters, added in float32 as peft's merge does on a CPU), everything cast to the compute dtype.
The trained module is never modified (no ``merge_adapter``). The copies are kept between calls and
rebuilt when any parameter of the module has changed: the key is every parameter's storage and
torch's in-place version counter (which an optimizer step, ``load_state_dict`` or any ``copy_``
bumps) plus the adapters' state (enabled, active, scaling), so a step is seen at the next call.

Sampling is ``generate``'s as :mod:`queryrl.rollout.hf` calls it: ``log_softmax(raw logits /
temperature)`` is recorded at the chosen token; greedy = ``argmax``; sampling = temperature,
top-k, top-p (transformers' warpers: same order, same ties) and a draw from the softmax. The draw
inverts the CDF with one uniform per row instead of ``torch.multinomial`` (which draws V
exponentials per row, most of a small model's step): the same distribution, other random numbers,
so a seeded run samples other tokens than ``generate``. Finished rows continue with the pad token;
decoding stops when every row has produced EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from queryrl.rollout.base import SamplingParams
from queryrl.rollout.peft_weights import (
    adapter_state,
    base_model,
    is_lora_linear,
    linear_weights,
    lora_reason,
    peft_reason,
)

SUPPORTED_ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
# forward hooks that change no value, which the fast path may skip: gradient checkpointing makes the
# embeddings' output require grad (transformers' enable_input_require_grads)
_INERT_HOOKS = {"PreTrainedModel.enable_input_require_grads.<locals>.make_inputs_require_grads"}


def unsupported_reason(model: nn.Module) -> str | None:
    """Why :class:`FastDecoder` cannot run `model` (None = it can).

    Supported: a ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``, plain or in a peft LoRA
    ``PeftModel``, whose projections are ``nn.Linear`` or peft's plain LoRA ``Linear`` over one
    (no DoRA or other variants, no LoRA bias, not merged: see
    :func:`~queryrl.rollout.peft_weights.lora_reason`), with a plain ``nn.Embedding`` and
    ``lm_head`` (no quantized modules), SiLU MLPs, full attention in every layer (no sliding
    window), unscaled RoPE (``rope_type="default"``), no forward hooks (but the one gradient
    checkpointing adds, which changes no value), all parameters on one device.
    """
    not_lora = peft_reason(model)
    if not_lora is not None:
        return not_lora
    source, model = model, base_model(model)
    name = type(model).__name__
    if name not in SUPPORTED_ARCHITECTURES:
        return f"architecture {name} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != SUPPORTED_ARCHITECTURES[name]:
        return f"model_type {getattr(config, 'model_type', None)!r} for {name}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} (only silu)"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    base = getattr(model, "model", None)
    rope_type = getattr(getattr(base, "rotary_emb", None), "rope_type", None)
    if rope_type != "default":
        return f"rope_type {rope_type!r} (only default)"
    try:
        layers = list(base.layers)  # type: ignore[union-attr]
        linears = [model.lm_head]
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            linears += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
        embed = base.embed_tokens  # type: ignore[union-attr]
    except AttributeError as err:
        return f"unexpected module layout ({err})"
    if type(embed) is not nn.Embedding or type(model.lm_head) is not nn.Linear:
        return "wrapped or quantized embeddings or lm_head (peft, bitsandbytes)"
    for linear in linears[1:]:
        reason = lora_reason(linear)  # type: ignore[arg-type]
        if reason is not None:
            return reason
    if len(layers) != config.num_hidden_layers:  # type: ignore[union-attr]
        return "num_hidden_layers does not match the layers"
    for module in source.modules():
        hooks = [*module._forward_pre_hooks.values(), *module._forward_hooks.values()]
        if "_hf_hook" in module.__dict__ or any(getattr(h, "__qualname__", "") not in _INERT_HOOKS for h in hooks):
            return "forward hooks (user hooks, accelerate offloading): the fast path would skip them"
    devices = {p.device for p in source.parameters()}
    if len(devices) != 1 or next(iter(devices)).type == "meta":
        return f"parameters on {len(devices)} devices or on meta ({', '.join(sorted(map(str, devices)))})"
    return None


# (weight, bias) pairs applied to one input, their outputs end to end: q/k/v, gate/up
Projection = list[tuple[Tensor, Tensor | None]]
# the fused QKV and gate/up copies of all layers together may take this much memory; beyond it
# (from about 100M parameters in float32, where the matmuls outweigh the op saved) each
# projection keeps its own matmul, and nothing is copied
FUSE_MAX_BYTES = 256 * 2**20


@dataclass
class _Layer:
    """One decoder layer's weights: the module's own tensors, and the fused projections."""

    input_norm: Tensor  # (E,)
    qkv: Projection  # to ((Hq + 2 Hkv) D) outputs
    qk_norm: Tensor | None  # (Hq + Hkv, D), Qwen3's per-head q_norm / k_norm weights
    o_proj_t: Tensor  # (Hq D, E), a transposed view: x + a @ o_proj_t is one addmm
    o_bias: Tensor | None  # (E,)
    post_norm: Tensor  # (E,)
    gate_up: Projection  # to (2 I) outputs
    down_t: Tensor  # (I, E), a transposed view


@dataclass
class _Weights:
    """Every weight a decode reads, in the compute dtype."""

    embed: Tensor  # (V, E)
    layers: list[_Layer]
    norm: Tensor  # (E,) the final RMSNorm
    head: tuple[Tensor, Tensor | None]  # lm_head (V, E) and its bias


def _projection(linears: list[nn.Module], fuse: bool, dtype: torch.dtype) -> Projection:
    """`linears` as one matmul on their concatenated weights (a copy), or one each (no copy unless
    LoRA or the dtype needs one)."""
    pairs = [linear_weights(x, dtype) for x in linears]
    if not fuse:
        return pairs
    bias = None
    if any(b is not None for _, b in pairs):
        bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])
    return [(torch.cat([w for w, _ in pairs]), bias)]


def _project(h: Tensor, projection: Projection) -> Tensor:
    """(N, E) -> (N, sum of the out features)."""
    if len(projection) == 1:
        return F.linear(h, *projection[0])
    return torch.cat([F.linear(h, w, b) for w, b in projection], dim=-1)


class FastDecoder:
    """Sample from a Qwen2/Qwen3 ``*ForCausalLM`` without calling its forward.

    Args:
        model: the Hugging Face module, or a peft LoRA model (see :func:`unsupported_reason`); kept
            by reference, its weights are read afresh by every :meth:`generate` (derived copies:
            refreshed when a parameter changed).
        dtype: the compute dtype (mixed precision: bfloat16 over float32 parameters); default: the
            embeddings' dtype.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FastDecoder does not support this model: {reason}")
        hf: Any = base_model(model)  # transformers modules: attributes mypy cannot see
        self.source = model
        self.model = hf
        self.dtype = dtype if dtype is not None else hf.model.embed_tokens.weight.dtype
        self._cached: tuple[tuple[Any, ...], _Weights] | None = None
        config = hf.config
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(hf.model.layers[0].self_attn.head_dim)
        self.intermediate_size = int(config.intermediate_size)
        self.eps = float(config.rms_norm_eps)

    def _weights(self) -> _Weights:
        """The current weights; derived copies (LoRA merged, another dtype) are reused until a
        parameter or the adapters' state changed."""
        derived = self._derives()
        if not derived:
            return self._read_weights()
        key = (
            tuple((p.data_ptr(), p._version) for p in self.source.parameters()),
            adapter_state(self.model),
            self.dtype,
        )
        if self._cached is None or self._cached[0] != key:
            self._cached = None  # free the old copies before making the new ones
            self._cached = (key, self._read_weights())
        return self._cached[1]

    def _derives(self) -> bool:
        """Whether any weight is a derived copy: a LoRA layer, or a parameter not in the compute dtype."""
        return any(is_lora_linear(m) for m in self.model.modules()) or any(
            p.dtype != self.dtype for p in self.model.parameters() if p.is_floating_point()
        )

    def _read_weights(self) -> _Weights:
        base, dtype = self.model.model, self.dtype
        head = self.model.lm_head
        return _Weights(
            embed=base.embed_tokens.weight.to(dtype),
            layers=self._layers(),
            norm=base.norm.weight.to(dtype),
            head=(head.weight.to(dtype), head.bias.to(dtype) if head.bias is not None else None),
        )

    def _layers(self) -> list[_Layer]:
        """The current weights of every layer (QKV and gate/up concatenated now, when small enough)."""
        fused = [
            (x.base_layer if is_lora_linear(x) else x).weight
            for layer in self.model.model.layers
            for x in (*self._qkv(layer), layer.mlp.gate_proj, layer.mlp.up_proj)
        ]
        size = torch.finfo(self.dtype).bits // 8
        fuse = sum(w.numel() * size for w in fused) <= FUSE_MAX_BYTES
        dtype = self.dtype
        layers = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            qk_norm = None
            if hasattr(a, "q_norm"):  # Qwen3: RMSNorm over D on every q and k head
                qk_norm = torch.cat(
                    [a.q_norm.weight.expand(self.num_heads, -1), a.k_norm.weight.expand(self.num_kv_heads, -1)]
                ).to(dtype)
            o_weight, o_bias = linear_weights(a.o_proj, dtype)
            down_weight, _ = linear_weights(m.down_proj, dtype)
            layers.append(
                _Layer(
                    input_norm=layer.input_layernorm.weight.to(dtype),
                    qkv=_projection(self._qkv(layer), fuse, dtype),
                    qk_norm=qk_norm,
                    o_proj_t=o_weight.t(),
                    o_bias=o_bias,
                    post_norm=layer.post_attention_layernorm.weight.to(dtype),
                    gate_up=_projection([m.gate_proj, m.up_proj], fuse, dtype),
                    down_t=down_weight.t(),
                )
            )
        return layers

    @staticmethod
    def _qkv(layer: Any) -> list[nn.Module]:
        return [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]

    def _norm(self, x: Tensor, weight: Tensor | None) -> Tensor:
        """Qwen2RMSNorm over the last dim: in float32, cast back, then scaled (``torch.rms_norm``
        computes exactly that for float32 input)."""
        if x.dtype == torch.float32:
            return torch.rms_norm(x, (x.shape[-1],), weight, self.eps)
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return h if weight is None else weight * h

    def _logits(self, h: Tensor, w: _Weights) -> Tensor:
        """Final norm and ``lm_head``: (..., E) hidden states -> (..., V) float32 logits."""
        return F.linear(self._norm(h, w.norm), *w.head).float()

    @torch.no_grad()
    def generate(
        self, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams, eos_token_id: int, pad_token_id: int
    ) -> tuple[Tensor, Tensor]:
        """Sample continuations of left-padded prompts.

        Args:
            prompt_ids: (B, P) long, left-padded.
            prompt_mask: (B, P), 1 = a real prompt token.
            params: sampling parameters (``n`` is ignored: rows are already repeated).
            eos_token_id: ends a row; later steps of that row produce ``pad_token_id``.
            pad_token_id: what finished rows continue with.

        Returns:
            ``(response_ids (B, T) long, logprobs (B, T) float32)``, on the model's device, where
            ``T <= max_new_tokens`` is the number of steps until every row had produced EOS;
            ``logprobs`` is ``log_softmax(logits / temperature)`` at each produced token.
        """
        weights = self._weights()
        embed, layers = weights.embed, weights.layers  # (V, E)
        device, dtype = embed.device, embed.dtype
        ids, mask = prompt_ids.to(device), prompt_mask.to(device).bool()
        b, p = ids.shape
        t_max = params.max_new_tokens
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim

        # one cache per layer, keys then values: (B, 2 Hkv, S, D); the n samples of a prompt share
        # its prefill, so each distinct prompt runs once
        kv_cache = [torch.empty(b, 2 * hkv, p + t_max, d, dtype=dtype, device=device) for _ in layers]
        distinct, rows = torch.unique(torch.cat([ids, mask.long()], 1), dim=0, return_inverse=True)  # (U, 2P), (B,)
        logits = self._prefill(distinct[:, :p], distinct[:, p:].bool(), weights, rows, kv_cache)  # (B, V)

        # generated token s sits at position (prompt length + s) and in cache slot p + s
        cos, sin = self._rope(mask.sum(-1)[:, None] + torch.arange(t_max, device=device), dtype)  # (B, T, D)
        cos, sin = cos.transpose(0, 1)[:, :, None], sin.transpose(0, 1)[:, :, None]  # (T, B, 1, D)
        # RoPE over all Hq + 2 Hkv heads of a step: the identity on the value heads (cos 1, sin 0),
        # so that rotated keys and values are adjacent and reach the cache in one copy
        cos_step = torch.ones(b, hq + 2 * hkv, d, dtype=dtype, device=device)
        sin_step = torch.zeros(b, hq + 2 * hkv, d, dtype=dtype, device=device)
        bias = torch.zeros(b, 1, 1, p + t_max, dtype=dtype, device=device)  # additive, over cache slots
        bias[..., :p].masked_fill_(~mask[:, None, None, :], float("-inf"))  # padding is never attended

        out_ids = torch.full((b, t_max), pad_token_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros(b, t_max, dtype=torch.float32, device=device)
        unfinished = torch.ones(b, dtype=torch.bool, device=device)
        pad = torch.tensor(pad_token_id, device=device)
        for s in range(t_max):
            if s > 0:  # feed token s - 1
                cos_step[:, : hq + hkv] = cos[s - 1]
                sin_step[:, : hq + hkv] = sin[s - 1]
                x = F.embedding(out_ids[:, s - 1], embed)  # (B, E)
                h = self._decode_step(x, layers, cos_step, sin_step, kv_cache, bias, p + s - 1)
                logits = self._logits(h, weights)
            tokens, scores, log_z = sample_step(logits, params)  # (B,), (B, V), (B, 1)
            tokens = torch.where(unfinished, tokens, pad)
            out_ids[:, s] = tokens
            out_logprobs[:, s : s + 1] = scores.gather(-1, tokens[:, None]) - log_z
            unfinished &= tokens != eos_token_id
            if not bool(unfinished.any()):
                return out_ids[:, : s + 1], out_logprobs[:, : s + 1]
        return out_ids, out_logprobs

    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` (..., D) at integer `positions` (...), as Qwen2RotaryEmbedding computes them
        (float32 angles, then cast), with rotate_half's sign folded into ``sin``: RoPE(x) is
        ``x * cos + roll(x, D / 2) * sin``."""
        inv_freq = self.model.model.rotary_emb.inv_freq.to(device=positions.device, dtype=torch.float32)
        freqs = positions[..., None].float() * inv_freq  # (..., D/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (..., D)
        sin = emb.sin()
        half = self.head_dim // 2
        return emb.cos().to(dtype), torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).to(dtype)

    def _prefill(self, ids: Tensor, mask: Tensor, weights: _Weights, rows: Tensor, kv_cache: list[Tensor]) -> Tensor:
        """Run the U distinct prompts `ids` (U, P) (`mask` (U, P) bool); fill cache slots ``[0, P)``
        of row r with prompt ``rows[r]``'s keys and values; return the (B, V) last-position logits."""
        u, p = ids.shape
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = F.embedding(ids, weights.embed).flatten(0, 1)  # (U P, E)
        cos, sin = self._rope((mask.long().cumsum(-1) - 1).clamp(min=0).flatten(), x.dtype)  # (U P, D)
        cos, sin = cos[:, None], sin[:, None]  # (U P, 1, D)
        # causal over the real keys; each query also sees itself, so that padding rows stay finite
        allowed = torch.ones(p, p, dtype=torch.bool, device=ids.device).tril()[None] & mask[:, None, :]
        allowed = (allowed | torch.eye(p, dtype=torch.bool, device=ids.device))[:, None]  # (U, 1, P, P)
        for i, w in enumerate(weights.layers):
            qkv = _project(self._norm(x, w.input_norm), w.qkv).view(u * p, hq + 2 * hkv, d)
            qk, v = qkv[:, : hq + hkv], qkv[:, hq + hkv :]
            if w.qk_norm is not None:
                qk = self._norm(qk, None) * w.qk_norm
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)  # RoPE, (U P, Hq + Hkv, D)
            q, k = qk[:, :hq].view(u, p, hq, d).transpose(1, 2), qk[:, hq:].view(u, p, hkv, d).transpose(1, 2)
            v = v.view(u, p, hkv, d).transpose(1, 2)  # q, k, v: (U, H, P, D)
            kv_cache[i][:, :hkv, :p] = k[rows]
            kv_cache[i][:, hkv:, :p] = v[rows]
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=hq != hkv)  # (U, Hq, P, D)
            x = self._residual(x, attn.transpose(1, 2).reshape(u * p, hq * d), w)
        return self._logits(x.view(u, p, -1)[:, -1], weights)[rows]  # (B, V)

    def _decode_step(
        self, x: Tensor, layers: list[_Layer], cos: Tensor, sin: Tensor, kv_cache: list[Tensor], bias: Tensor, slot: int
    ) -> Tensor:
        """One token per row: embeddings `x` (B, E) written at cache `slot`; returns the (B, E) hidden
        states before the final norm. `cos`, `sin` (B, Hq + 2 Hkv, D); `bias` (B, 1, 1, S) additive."""
        b = x.shape[0]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        bias = bias[..., : slot + 1]
        for i, w in enumerate(layers):
            qkv = _project(self._norm(x, w.input_norm), w.qkv).view(b, hq + 2 * hkv, d)
            if w.qk_norm is not None:
                qkv[:, : hq + hkv] = self._norm(qkv[:, : hq + hkv], None) * w.qk_norm
            qkv = torch.addcmul(qkv * cos, qkv.roll(d // 2, -1), sin)  # RoPE on q and k, v unchanged
            kv = kv_cache[i]
            kv[:, :, slot] = qkv[:, hq:]
            attn = F.scaled_dot_product_attention(  # the G query heads of a KV head as its G query rows
                qkv[:, :hq].view(b, hkv, hq // hkv, d), kv[:, :hkv, : slot + 1], kv[:, hkv:, : slot + 1], attn_mask=bias
            )  # (B, Hkv, G, D)
            x = self._residual(x, attn.view(b, hq * d), w)
        return x

    def _residual(self, x: Tensor, attn: Tensor, w: _Layer) -> Tensor:
        """The rest of a layer for (N, E) hidden states `x` and (N, Hq D) attention outputs: o_proj
        and the residual, then the SwiGLU MLP ``down(silu(gate(h)) * up(h))`` and its residual."""
        x = torch.addmm(x, attn, w.o_proj_t)
        if w.o_bias is not None:
            x = x + w.o_bias
        gate, up = _project(self._norm(x, w.post_norm), w.gate_up).chunk(2, dim=-1)
        return torch.addmm(x, F.silu(gate) * up, w.down_t)


def sample_step(logits: Tensor, params: SamplingParams) -> tuple[Tensor, Tensor, Tensor]:
    """One step of ``generate``'s token choice on (B, V) float32 raw logits.

    Returns:
        ``(tokens (B,), scores (B, V), log_z (B, 1))``: the token picked, ``logits / temperature``
        (temperature 1 when greedy) and ``logsumexp(scores)``, so that the recorded log-prob
        ``log_softmax(scores)`` at a token ``t`` is ``scores[t] - log_z``. Greedy = ``argmax``;
        sampling = a draw from the ``softmax`` of :func:`warp`'s scores (the distribution
        ``generate``'s ``multinomial`` draws from; :func:`draw` draws it, so seeded draws differ).
    """
    temperature = params.logprob_temperature
    scores = logits / temperature if temperature != 1.0 else logits
    if not params.do_sample:
        return torch.argmax(logits, dim=-1), scores, torch.logsumexp(scores, dim=-1, keepdim=True)
    if params.top_k == 0 and params.top_p == 1.0:  # nothing cut: the draw's total is the normaliser too
        top = scores.amax(dim=-1, keepdim=True)  # (B, 1)
        tokens, total = draw((scores - top).exp_())
        return tokens, scores, top + total.log().to(scores.dtype)
    tokens, _ = draw(F.softmax(warp(scores, params), dim=-1))
    return tokens, scores, torch.logsumexp(scores, dim=-1, keepdim=True)


def warp(scores: Tensor, params: SamplingParams) -> Tensor:
    """transformers' TopKLogitsWarper then TopPLogitsWarper on (B, V) temperature-scaled scores
    (``min_tokens_to_keep=1``, ties kept as they keep them); cut tokens get ``-inf``."""
    if params.top_k > 0:
        k = min(params.top_k, scores.shape[-1])
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - params.top_p)
        remove[..., -1:] = False  # keep at least one token
        scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), float("-inf"))
    return scores


def draw(weights: Tensor) -> tuple[Tensor, Tensor]:
    """One token per row of `weights` (B, V) >= 0, with probability proportional to its weight, by
    inverting the CDF; returns ``(tokens (B,), total weight (B, 1) float64)``.

    ``torch.multinomial(probs, 1)`` draws V exponentials per row (B V random numbers, most of a
    small model's decode step on a CPU); this draws one uniform per row. The CDF is summed in
    float64 so that rounding cannot shift mass between tokens, and the uniform is kept below the
    total, so a token of weight 0 (cut by top-k/top-p) is never drawn: the first index whose CDF
    exceeds the uniform always carries weight.
    """
    cdf = weights.double().cumsum(dim=-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    # total (1 - 2^-52) is at least one ulp under the total, so rand * it stays under after rounding
    u = torch.rand(total.shape, dtype=torch.float64, device=weights.device) * (total * (1 - 2.0**-52))
    return torch.searchsorted(cdf, u, right=True).squeeze(1), total
