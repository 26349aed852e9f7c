"""A generation-only forward for Qwen2, Qwen3, Llama and Gemma 3 causal LMs: prefill, then one token at a time.

Notation: `B` sequences, `U` distinct prompts among them, `P` prompt tokens (left-padded), `T`
response tokens, `S = P + T` cache slots, `V` vocabulary, `E` hidden size, `I` MLP width, `Hq`
query heads, `Hkv` key/value heads, `G = Hq / Hkv`, `D` head dim.

Architectures (:mod:`queryrl.rollout.fast_decode_arch` says what differs between them and why a
model is refused): ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``LlamaForCausalLM`` (SmolLM2;
default, linear, llama3 or yarn RoPE; attention and MLP biases) and text-only ``Gemma3ForCausalLM``
(sliding-window layers with a local RoPE base, full layers with the global one, ``1 + weight``
norms around attention and MLP, scaled embeddings, tanh-GELU).

Why: on a small model a decode step of ``model.generate`` costs transformers' Python and
dispatch overhead (module calls, mask building, cache objects, output classes, logits
processors), not arithmetic. This computes the same function with about fifteen torch ops per
layer: one fused QKV matmul; RoPE from a table built once per batch, applied to all heads of the
step at once (the identity on the value heads) so that keys and values reach the cache in one
copy; a preallocated KV cache written in place (a sliding-window layer reads only its last W
slots); ``scaled_dot_product_attention`` with the G query heads of a KV head folded into its query
rows (GQA without repeating K/V); RMSNorm; one fused gate/up matmul; ``addmm`` for each projection
and its residual; the (tied or not) ``lm_head``. The n samples of a prompt share one prefill
(``generate`` runs it n times), and distinct prompts that start with the same tokens (a system prompt)
run those once (:func:`shared_prefix`), each prompt's own tokens attending to the shared keys.

Weights are read from the Hugging Face module by every :meth:`FastDecoder.generate`: the QKV and
gate/up matrices are concatenated afresh (a few ``torch.cat``; not at all when those copies would
exceed ``FUSE_MAX_BYTES``, then each projection keeps its own matmul), the rest are the module's
own tensors, so a colocated optimizer step made in place on the module is always seen, with
nothing to refresh in ``update_weights``.

LoRA (a peft ``PeftModel``, or LoRA layers injected in place) runs as peft's forward does: each
adapted projection (or fused group) adds ``(x A^T) B^T`` (B times the adapter's scaling; adapters
summed) to the base projection's output, two small matmuls. The base weights, fused and cast to the
compute dtype, are derived copies kept between calls: they are rebuilt only when a parameter other
than the adapters' changed (the key is those parameters' storage and torch's in-place version
counter, which an optimizer step, ``load_state_dict`` or any ``copy_`` bumps), so an adapter-only
step costs no copy of the model; the adapters themselves are read afresh by every call (enabled,
active, scaling). A compute dtype other than the parameters' (mixed precision: float32 master
weights, bfloat16 decoding) casts the base once per change and the adapters per call; ``quantize`` makes
the decoder projections' copies int8 (:mod:`queryrl.rollout.int8`), the adapters staying as they are. The
trained module is never modified (no ``merge_adapter``).

Sampling is ``generate``'s as :mod:`queryrl.rollout.hf` calls it: ``log_softmax(raw logits /
temperature)`` is recorded at the chosen token; greedy = ``argmax``; sampling = temperature,
top-k, top-p (transformers' warpers: same order, same ties) and a draw from the softmax. The draw
inverts the CDF with one uniform per row instead of ``torch.multinomial`` (which draws V
exponentials per row, most of a small model's step): the same distribution, other random numbers,
so a seeded run samples other tokens than ``generate``. Finished rows continue with the pad token;
decoding stops when every row has produced EOS.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from queryrl.padding import shared_prefix
from queryrl.rollout.base import SamplingParams
from queryrl.rollout.fast_decode_arch import (
    SUPPORTED_ARCHITECTURES,
    Layer,
    Lora,
    Plan,
    Weights,
    quantized,
    read_weights,
    rope_tables,
    unsupported_reason,
    with_lora,
)
from queryrl.rollout.int8 import Int8Linear
from queryrl.rollout.peft_weights import base_model, lora_parameters

__all__ = ["SUPPORTED_ARCHITECTURES", "FastDecoder", "draw", "sample_step", "unsupported_reason", "warp"]


# A float32 matrix of at least WIDE_MIN_ELEMENTS entries (8 MiB) and at least WIDE_RATIO times as tall as it is
# wide (the fused gate/up of a 0.5B model, any large vocabulary's lm_head) times 2 to SKINNY_ROWS rows of a CPU
# batch runs as ``(W h^T)^T``: MKL's sgemm is 1.1-1.6x faster in that orientation than in ``h W^T`` (F.linear's)
# on this project's CPU, one thread (8 rows: 13.2 against 8.3 ms for 9,728 x 896, 3.0 against 2.3 ms for
# 4,096 x 640, 235 against 159 ms for the 151,936 x 896 head; experiments/skinny_matmul.py). Smaller
# matrices are slower that way (3,072 x 576: 1.35 against 2.13 ms; the tiny model's 2-3x), as are square or
# narrow ones, and one row gains nothing: they keep F.linear.
WIDE_RATIO = 4
WIDE_MIN_ELEMENTS = 1 << 21
SKINNY_ROWS = 64


def _linear(h: Tensor, weight: Tensor | Int8Linear, bias: Tensor | None = None) -> Tensor:
    """``F.linear(h, weight, bias)`` for (N, in) `h`, in the faster orientation for a wide matrix (see WIDE_RATIO);
    an int8 `weight` (``rollout.quantize=int8``) by its own GEMM."""
    if isinstance(weight, Int8Linear):
        return weight(h) if bias is None else weight(h) + bias
    if (
        h.dim() == 2
        and h.device.type == "cpu"
        and weight.dtype == torch.float32
        and 1 < h.shape[0] <= SKINNY_ROWS
        and weight.shape[0] >= WIDE_RATIO * weight.shape[1]
        and weight.numel() >= WIDE_MIN_ELEMENTS
    ):
        out = torch.mm(weight, h.t()).t().contiguous()
        return out if bias is None else out + bias
    return F.linear(h, weight, bias)


def _project(h: Tensor, projection: list[tuple[Tensor | Int8Linear, Tensor | None]], lora: Lora | None) -> Tensor:
    """(N, E) -> (N, sum of the out features), the LoRA adapters' ``(h A^T) B^T`` added."""
    if len(projection) == 1:
        out = _linear(h, *projection[0])
    else:
        out = torch.cat([_linear(h, w, b) for w, b in projection], dim=-1)
    return out if lora is None else _add_lora(out, h, lora)


def _add_lora(out: Tensor, h: Tensor, lora: Lora) -> Tensor:
    """``out + (h A^T) B^T`` for (N, in) inputs `h` and (N, out) outputs `out`."""
    return torch.addmm(out, h @ lora[0].t(), lora[1].t())


class FastDecoder:
    """Sample from a supported ``*ForCausalLM`` (see :func:`unsupported_reason`) without calling its forward.

    Args:
        model: the Hugging Face module, or a peft LoRA model; kept by reference, its weights are read
            afresh by every :meth:`generate` (derived copies: refreshed when a parameter changed).
        dtype: the compute dtype (mixed precision: bfloat16 over float32 parameters); default: the
            embeddings' dtype.
        quantize: the decoder projections as int8 copies, kept with the derived base copies (``rollout.quantize``).
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None, quantize: bool = False) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FastDecoder does not support this model: {reason}")
        hf: Any = base_model(model)  # transformers modules: attributes mypy cannot see
        self.source = model
        self.model = hf
        self.dtype = dtype if dtype is not None else hf.model.embed_tokens.weight.dtype
        self.quantize = quantize
        self._cached: tuple[tuple[Any, ...], Weights] | None = None
        plan = self.plan = Plan.of(hf)
        self.num_heads, self.num_kv_heads, self.head_dim = plan.num_heads, plan.num_kv_heads, plan.head_dim

    def _weights(self) -> Weights:
        """The current weights; derived base copies (fused and cast) are reused until a parameter other
        than the LoRA adapters' changed; the adapters are read afresh."""
        adapters = lora_parameters(self.model)  # one pass over the LoRA layers: their A and B
        casts = any(p.dtype != self.dtype for p in self.model.parameters() if p.is_floating_point())
        if not (adapters or casts or self.quantize):
            return read_weights(self.model, self.plan, self.dtype)
        key = (tuple((p.data_ptr(), p._version) for p in self.source.parameters() if id(p) not in adapters), self.dtype)
        if self._cached is None or self._cached[0] != key:
            self._cached = None  # free the old copies before making the new ones
            base = read_weights(self.model, self.plan, self.dtype, lora=False)
            self._cached = (key, quantized(base) if self.quantize else base)
        return with_lora(self._cached[1], self.model, self.dtype) if adapters else self._cached[1]

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        """RMSNorm over the last dim of `x`, `weight` (..., last dim) broadcast: normalised in float32, then
        scaled and cast (a float32 weight: Gemma3RMSNorm's order, and any order in float32) or cast and
        scaled (a weight in the compute dtype: Qwen2RMSNorm / LlamaRMSNorm's)."""
        if weight.dtype == torch.float32:
            if weight.dim() == 1:  # torch.rms_norm scales as the last step
                return torch.rms_norm(x.float(), (x.shape[-1],), weight, self.plan.eps).to(x.dtype)
            return (torch.rms_norm(x.float(), (x.shape[-1],), None, self.plan.eps) * weight).to(x.dtype)
        h = x.float()
        return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.plan.eps)).to(x.dtype)

    def _logits(self, h: Tensor, w: Weights) -> Tensor:
        """Final norm, ``lm_head`` and softcapping: (..., E) hidden states -> (..., V) float32 logits."""
        logits = _linear(self._norm(h, w.norm), *w.head)
        if self.plan.softcap is not None:
            logits = torch.tanh(logits / self.plan.softcap) * self.plan.softcap
        return logits.float()

    def _embed(self, ids: Tensor, w: Weights) -> Tensor:
        """(...) token ids -> (..., E) embeddings (Gemma 3's times sqrt(E), in the compute dtype)."""
        x = F.embedding(ids, w.embed)
        return x if w.embed_scale is None else x * w.embed_scale

    def generate(
        self, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams, eos_token_id: int, pad_token_id: int
    ) -> tuple[Tensor, Tensor]:
        """:meth:`_generate` under ``torch.inference_mode`` (no version counters or view tracking on its
        ~400 small ops a decode step), its outputs copied out as normal tensors: the update gathers with
        the response ids, and autograd cannot save an inference tensor."""
        with torch.inference_mode():
            response_ids, logprobs = self._generate(prompt_ids, prompt_mask, params, eos_token_id, pad_token_id)
        return response_ids.clone(), logprobs.clone()

    def _generate(
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
        tables = rope_tables(self.model)

        # one cache per layer, keys then values: (B, 2 Hkv, S, D); the n samples of a prompt share
        # its prefill, so each distinct prompt runs once
        kv_cache = [torch.empty(b, 2 * hkv, p + t_max, d, dtype=dtype, device=device) for _ in layers]
        distinct, rows = torch.unique(torch.cat([ids, mask.long()], 1), dim=0, return_inverse=True)  # (U, 2P), (B,)
        logits = self._prefill(distinct[:, :p], distinct[:, p:].bool(), weights, rows, kv_cache, tables)  # (B, V)

        # generated token s sits at position (prompt length + s) and in cache slot p + s
        positions = mask.sum(-1)[:, None] + torch.arange(t_max, device=device)  # (B, T)
        # per RoPE table: (cos, sin) (T, B, 1, D), and the step's (B, Hq + 2 Hkv, D) over all heads: the
        # identity on the value heads (cos 1, sin 0), so that rotated keys and values are adjacent
        # and reach the cache in one copy
        rope, steps = {}, {}
        for key, table in tables.items():
            cos, sin = self._rope(positions, dtype, table)  # (B, T, D)
            rope[key] = cos.transpose(0, 1)[:, :, None], sin.transpose(0, 1)[:, :, None]
            steps[key] = (
                torch.ones(b, hq + 2 * hkv, d, dtype=dtype, device=device),
                torch.zeros(b, hq + 2 * hkv, d, dtype=dtype, device=device),
            )
        bias = torch.zeros(b, 1, 1, p + t_max, dtype=dtype, device=device)  # additive, over cache slots
        bias[..., :p].masked_fill_(~mask[:, None, None, :], float("-inf"))  # padding is never attended

        out_ids = torch.full((b, t_max), pad_token_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros(b, t_max, dtype=torch.float32, device=device)
        unfinished = torch.ones(b, dtype=torch.bool, device=device)
        pad = torch.tensor(pad_token_id, device=device)
        for s in range(t_max):
            if s > 0:  # feed token s - 1
                for key, (cos, sin) in rope.items():
                    steps[key][0][:, : hq + hkv] = cos[s - 1]
                    steps[key][1][:, : hq + hkv] = sin[s - 1]
                x = self._embed(out_ids[:, s - 1], weights)  # (B, E)
                h = self._decode_step(x, layers, steps, kv_cache, bias, p + s - 1)
                logits = self._logits(h, weights)
            tokens, scores, log_z = sample_step(logits, params)  # (B,), (B, V), (B, 1)
            if weights.vocab is not None:  # a restricted head: (B, K) scores, an index -> its token id
                out_logprobs[:, s : s + 1] = scores.gather(-1, tokens[:, None]) - log_z
                tokens = torch.where(unfinished, weights.vocab[tokens], pad)
            else:
                tokens = torch.where(unfinished, tokens, pad)
                out_logprobs[:, s : s + 1] = scores.gather(-1, tokens[:, None]) - log_z
            out_ids[:, s] = tokens
            unfinished &= tokens != eos_token_id
            if not bool(unfinished.any()):
                return out_ids[:, : s + 1], out_logprobs[:, : s + 1]
        return out_ids, out_logprobs

    def _rope(self, positions: Tensor, dtype: torch.dtype, table: tuple[Tensor, float]) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` (..., D) at integer `positions` (...) for `table` ``(inv_freq, attention_scaling)``,
        as transformers' rotary modules compute them (float32 angles, scaled, then cast), with
        rotate_half's sign folded into ``sin``: RoPE(x) is ``x * cos + roll(x, D / 2) * sin``."""
        inv_freq = table[0].to(device=positions.device, dtype=torch.float32)
        freqs = positions[..., None].float() * inv_freq  # (..., D/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (..., D)
        cos, sin = emb.cos(), emb.sin()
        if table[1] != 1.0:
            cos, sin = cos * table[1], sin * table[1]
        half = self.head_dim // 2
        return cos.to(dtype), torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).to(dtype)

    def _prefill(
        self,
        ids: Tensor,
        mask: Tensor,
        weights: Weights,
        rows: Tensor,
        kv_cache: list[Tensor],
        tables: dict[str, tuple[Tensor, float]],
    ) -> Tensor:
        """Run the U distinct prompts `ids` (U, P) (`mask` (U, P) bool); fill cache slots ``[0, P)``
        of row r with prompt ``rows[r]``'s keys and values; return the (B, V) last-position logits.

        The C tokens every distinct prompt starts with (:func:`shared_prefix`: a system prompt, few-shot
        examples) run once, as a sequence of their own; then each prompt's last P - C columns
        (``ids[:, C:]``, left-padded: the prompt's own tokens) attend to those keys and their own. The
        cache has ``generate``'s layout either way: a row's real tokens fill its last slots.
        """
        u, p = ids.shape
        c = shared_prefix(ids, mask)
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        pad = p - mask.sum(-1, keepdim=True)  # (U, 1) padding slots left of each prompt
        first = int(pad[0])
        rest = (mask[:, : p - c].long().cumsum(-1) - 1).clamp(min=0) + c  # positions of the last P - C columns
        positions = torch.cat([torch.arange(c, device=ids.device), rest.flatten()])  # (N,) = (C + U (P - C),)
        x = self._embed(torch.cat([ids[0, first : first + c], ids[:, c:].flatten()]), weights)  # (N, E)
        rope = {}
        for key, table in tables.items():
            cos, sin = self._rope(positions, x.dtype, table)  # (N, D)
            rope[key] = cos[:, None], sin[:, None]  # (N, 1, D)
        # causal over the real keys (and, in a sliding-window layer, over the last W slots); each query
        # also sees its own slot, so that padding rows stay finite; the last P - C columns sit in slots [C, P)
        slot = torch.arange(p, device=ids.device)
        behind = slot[:, None] - slot[None, :]  # (P, P) query slot - key slot
        masks = {}
        for window in {w.window for w in weights.layers}:
            near = (behind >= 0) if window is None else (behind >= 0) & (behind < window)
            masks[window] = (((near[None] & mask[:, None, :]) | (behind == 0))[:, None, c:], near[:c, :c])
        # with a prefix, slot s of prompt i holds prefix token s - pad_i for s in [pad_i, pad_i + C), else column s
        # of [prefix, rest]
        in_prefix = (slot >= pad) & (slot < pad + c)
        source = torch.where(in_prefix, slot - pad, slot)[:, None, :, None].expand(u, hkv, p, d) if c else None
        for i, w in enumerate(weights.layers):
            qkv = _project(self._norm(x, w.input_norm), w.qkv, w.qkv_lora).view(-1, hq + 2 * hkv, d)
            qk, v = qkv[:, : hq + hkv], qkv[:, hq + hkv :]
            if w.qk_norm is not None:
                qk = self._norm(qk, w.qk_norm)
            cos, sin = rope[w.rope]
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)  # RoPE, (N, Hq + Hkv, D)
            q, k, v = (t[c:].view(u, p - c, -1, d).transpose(1, 2) for t in (qk[:, :hq], qk[:, hq:], v))
            attn = []
            if c:  # the prefix's own causal attention, then its keys and values placed in each prompt's slots
                pq, pk, pv = (t[:c].transpose(0, 1)[None] for t in (qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv :]))
                out = F.scaled_dot_product_attention(
                    pq, pk, pv, attn_mask=masks[w.window][1], scale=self.plan.scaling, enable_gqa=hq != hkv
                )  # (1, Hq, C, D)
                attn.append(out[0].transpose(0, 1).reshape(c, hq * d))
                assert source is not None
                k = torch.cat([pk.expand(u, -1, -1, -1), k], 2).gather(2, source)  # (U, Hkv, P, D)
                v = torch.cat([pv.expand(u, -1, -1, -1), v], 2).gather(2, source)
            kv_cache[i][:, :hkv, :p] = k[rows]
            kv_cache[i][:, hkv:, :p] = v[rows]
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=masks[w.window][0], scale=self.plan.scaling, enable_gqa=hq != hkv
            )  # (U, Hq, P - C, D)
            attn.append(out.transpose(1, 2).reshape(u * (p - c), hq * d))
            x = self._residual(x, torch.cat(attn) if c else attn[0], w)
        return self._logits(x[c:].view(u, p - c, -1)[:, -1], weights)[rows]  # (B, V)

    def _decode_step(
        self,
        x: Tensor,
        layers: list[Layer],
        steps: dict[str, tuple[Tensor, Tensor]],
        kv_cache: list[Tensor],
        bias: Tensor,
        slot: int,
    ) -> Tensor:
        """One token per row: embeddings `x` (B, E) written at cache `slot`; returns the (B, E) hidden
        states before the final norm. `steps`: (cos, sin) (B, Hq + 2 Hkv, D) per RoPE table; `bias`
        (B, 1, 1, S) additive."""
        b = x.shape[0]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        for i, w in enumerate(layers):
            qkv = _project(self._norm(x, w.input_norm), w.qkv, w.qkv_lora).view(b, hq + 2 * hkv, d)
            if w.qk_norm is not None:
                qkv[:, : hq + hkv] = self._norm(qkv[:, : hq + hkv], w.qk_norm)
            cos, sin = steps[w.rope]
            qkv = torch.addcmul(qkv * cos, qkv.roll(d // 2, -1), sin)  # RoPE on q and k, v unchanged
            kv = kv_cache[i]
            kv[:, :, slot] = qkv[:, hq:]
            start = 0 if w.window is None else max(0, slot + 1 - w.window)  # the last W slots only
            attn = F.scaled_dot_product_attention(  # the G query heads of a KV head as its G query rows
                qkv[:, :hq].view(b, hkv, hq // hkv, d),
                kv[:, :hkv, start : slot + 1],
                kv[:, hkv:, start : slot + 1],
                attn_mask=bias[..., start : slot + 1],
                scale=self.plan.scaling,
            )  # (B, Hkv, G, D)
            x = self._residual(x, attn.reshape(b, hq * d), w)
        return x

    def _residual(self, x: Tensor, attn: Tensor, w: Layer) -> Tensor:
        """The rest of a layer for (N, E) hidden states `x` and (N, Hq D) attention outputs: o_proj
        and the residual, then the gated MLP ``down(act(gate(h)) * up(h))`` and its residual (Gemma 3:
        each output normed before its residual)."""
        x = self._add_projected(x, attn, w.o_proj_t, w.o_bias, w.o_lora, w.post_attn_norm)
        gate, up = _project(self._norm(x, w.pre_mlp_norm), w.gate_up, w.gate_up_lora).chunk(2, dim=-1)
        h = self.plan.act(gate) * up  # (N, I)
        return self._add_projected(x, h, w.down_t, w.down_bias, w.down_lora, w.post_mlp_norm)

    def _add_projected(
        self,
        x: Tensor,
        h: Tensor,
        weight_t: Tensor | Int8Linear,
        bias: Tensor | None,
        lora: Lora | None,
        post_norm: Tensor | None,
    ) -> Tensor:
        """``x + h W^T`` (+ bias, + LoRA; the sum normed by `post_norm` first where given): one ``addmm`` on the
        transposed view `weight_t`, or an int8 copy's GEMM."""
        if isinstance(weight_t, Int8Linear):
            out = _linear(h, weight_t, bias)
            out = out if lora is None else _add_lora(out, h, lora)
            return x + (out if post_norm is None else self._norm(out, post_norm))
        if post_norm is None:
            x = torch.addmm(x, h, weight_t)
            if lora is not None:
                x = _add_lora(x, h, lora)
            return x if bias is None else x + bias
        out = h @ weight_t if bias is None else torch.addmm(bias, h, weight_t)
        return x + self._norm(out if lora is None else _add_lora(out, h, lora), post_norm)


def sample_step(
    logits: Tensor, params: SamplingParams, uniforms: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """One step of ``generate``'s token choice on (B, V) float32 raw logits (`uniforms`: :func:`draw`'s).

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
        tokens, total = draw((scores - top).exp_(), uniforms)
        return tokens, scores, top + total.log().to(scores.dtype)
    tokens, _ = draw(F.softmax(warp(scores, params), dim=-1), uniforms)
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


def draw(weights: Tensor, uniforms: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One token per row of `weights` (B, V) >= 0, with probability proportional to its weight, by
    inverting the CDF; returns ``(tokens (B,), total weight (B, 1) float64)``. `uniforms` (B, 1) float64
    in [0, 1): the draws to use (a CUDA graph's, drawn before it replays), default fresh ``torch.rand``.

    ``torch.multinomial(probs, 1)`` draws V exponentials per row (B V random numbers, most of a
    small model's decode step on a CPU); this draws one uniform per row. The CDF is summed in
    float64 so that rounding cannot shift mass between tokens, and the uniform is kept below the
    total, so a token of weight 0 (cut by top-k/top-p) is never drawn: the first index whose CDF
    exceeds the uniform always carries weight.
    """
    cdf = weights.double().cumsum(dim=-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    # total (1 - 2^-52) is at least one ulp under the total, so rand * it stays under after rounding
    if uniforms is None:
        uniforms = torch.rand(total.shape, dtype=torch.float64, device=weights.device)
    u = uniforms * (total * (1 - 2.0**-52))
    return torch.searchsorted(cdf, u, right=True).squeeze(1), total
