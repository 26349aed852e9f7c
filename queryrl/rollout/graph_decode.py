"""The fast decode path's token step with static shapes, captured once in a CUDA graph and replayed per token.

Notation as in :mod:`queryrl.rollout.fast_decode` (`B` rows, `P` prompt width, `T` new tokens, `S`
cache slots, `V` vocabulary, `Hq`/`Hkv` query/key-value heads, `D` head dim, `W` a sliding window).

Why: on a GPU a decode step of a small model costs its kernel launches, not its arithmetic: ``make
gpu-check`` measured 64-94 ms a token step at 32 rows of a 0.5B model in bf16, on either decode path,
where the weights stream through an H200 in well under a millisecond. A CUDA graph records the
step's few hundred kernels once and replays them with one launch (``torch.cuda.CUDAGraph``; vLLM and
SGLang capture their decode steps the same way). A graph replays the same kernels on the same
memory, so nothing in the step may depend on the token index through Python:

- rows: B fixed at capture. A later micro-batch of fewer rows (at least half as many) reuses the
  graph with copies of its last row appended, finished from the start, and dropped from the output.
- the KV cache: S slots (prompt width plus new tokens, rounded up to :data:`SLOT_MULTIPLE`, so that
  prompts of other widths reuse the graph), zeros where nothing is written yet, attended over all S
  slots with an additive mask (B, 1, 1, S) that the step itself unmasks at its slot (``index_fill_``
  with the slot as a tensor); a sliding-window layer also masks the slots at or before slot - W. A
  masked slot adds an exact zero to attention, so the step computes what the dynamic path's slice of
  the cache computes (up to the order of a float sum).
- the token index: a counter tensor that the step increments itself; the cache slot is the prompt
  width (a tensor) plus the index minus one; RoPE's (cos, sin) come from per-call tables, read at the
  index.
- sampling: :func:`~queryrl.rollout.fast_decode.draw`'s uniforms, drawn for all T steps (one
  ``torch.rand``) before the loop; tokens and log-probs are written at the index into (B, T) buffers.
  The host reads one flag per step (is any row unfinished) and stops as the dynamic path does.
- weights: the tensors the decode reads are captured by address. The module's own tensors, and the
  fast path's cached base copies (cast or fused, rebuilt only when a base parameter changed), are
  taken as they are: when one of them is another tensor at the next call (a full fine-tuning step on
  a mixed-precision model, FSDP's gathered parameters), the graph is captured anew. The copies the
  fast path makes afresh for every call (LoRA adapters, fused projections of an uncached model) are
  copied into buffers of the graph's own before it replays.

On a CPU the same static step runs eagerly (no graph): slower than the dynamic path (every step
attends all S slots), and there only to test the step. The graph and its buffers (the KV cache for
B x S, the outputs) stay allocated between calls; one set is kept, built anew when the shapes or the
sampling settings change.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from queryrl.rollout.base import SamplingParams
from queryrl.rollout.fast_decode import FastDecoder, _project, sample_step
from queryrl.rollout.fast_decode_arch import Weights, rope_tables

__all__ = ["GRAPH_MODES", "SLOT_MULTIPLE", "GraphDecoder", "graph_on"]

GRAPH_MODES = ("off", "on", "auto")
# cache slots are allocated in multiples of this, so that prompts of other widths reuse a captured graph
SLOT_MULTIPLE = 64


def graph_on(mode: str, device: torch.device) -> bool:
    """Whether ``rollout.decode_graph`` `mode` decodes with the static step on `device`: ``on`` everywhere
    (a CUDA graph on a GPU, eagerly on a CPU), ``auto`` on a GPU only, ``off`` never."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"decode_graph must be one of {', '.join(GRAPH_MODES)} (got {mode!r})")
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def _map(x: Any, fn: Any) -> Any:
    """`x` (Weights, Layer, lists and tuples of them) with every tensor `t` replaced by ``fn(t)``."""
    if isinstance(x, Tensor):
        return fn(x)
    if isinstance(x, list):
        return [_map(v, fn) for v in x]
    if isinstance(x, tuple):
        return tuple(_map(v, fn) for v in x)
    if is_dataclass(x) and not isinstance(x, type):
        return replace(x, **{f.name: _map(getattr(x, f.name), fn) for f in fields(x)})
    return x


def _leaves(weights: Weights) -> list[Tensor]:
    out: list[Tensor] = []
    _map(weights, out.append)
    return out


def _ptr(t: Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


@dataclass
class _Static:
    """Everything the captured step reads and writes, at fixed addresses."""

    key: tuple[Any, ...]  # what a reuse must match besides rows and slots
    rows: int  # B
    slots: int  # S
    weights: Weights  # the captured weights: stable tensors as given, the rest the graph's own copies
    owned: list[int]  # indices into _leaves(weights) of the graph's own copies
    cache: list[Tensor]  # per layer (B, 2 Hkv, S, D), keys then values
    bias: Tensor  # (B, 1, 1, S) additive mask
    slot_ids: Tensor  # (S,) 0 .. S - 1
    tables: dict[str, tuple[Tensor, Tensor]]  # per RoPE table: (cos, sin) (T, B, 1, D) at each token's position
    rope: dict[str, tuple[Tensor, Tensor]]  # per RoPE table: the step's (cos, sin) (B, Hq + 2 Hkv, D)
    uniforms: Tensor  # (T, B, 1) float64
    out_ids: Tensor  # (B, T) long
    out_logprobs: Tensor  # (B, T) float32
    unfinished: Tensor  # (B,) bool
    alive: Tensor  # (T,) bool: any row unfinished after the token at each index
    index: Tensor  # (1,) long: the token the next step produces
    width: Tensor  # (1,) long: the prompt width P of this call
    graph: Any = None  # torch.cuda.CUDAGraph once captured


class GraphDecoder(FastDecoder):
    """:class:`~queryrl.rollout.fast_decode.FastDecoder` whose token steps run as one static step: captured
    in a CUDA graph on a GPU (`capture` None: where the model is on CUDA), eagerly otherwise.

    Attributes:
        captures: how many graphs this decoder has captured (a new one per change of shapes, sampling
            settings or captured weights).
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None, capture: bool | None = None) -> None:
        super().__init__(model, dtype)
        self.capture = capture
        self.captures = 0
        self._static: _Static | None = None

    def _stable(self) -> set[int]:
        """Storages that stay put between calls: the module's parameters and buffers, the cached base copies."""
        ptrs = {_ptr(t) for t in (*self.source.parameters(), *self.source.buffers())}
        if self._cached is not None:
            ptrs |= {_ptr(t) for t in _leaves(self._cached[1])}
        return ptrs

    @staticmethod
    def _key(
        weights: Weights, stable: set[int], params: SamplingParams, t_max: int, eos: int, pad: int
    ) -> tuple[Any, ...]:
        """What a kept graph must match: the steps, the sampling, each weight's shape, layout and, for a stable
        one, its address."""
        leaves = tuple(
            (x.shape, x.stride(), x.dtype, x.data_ptr() if _ptr(x) in stable else -1) for x in _leaves(weights)
        )
        sampling = (params.do_sample, params.logprob_temperature, params.top_k, params.top_p)
        return (t_max, eos, pad, sampling, str(weights.embed.device), leaves)

    def _state(
        self, weights: Weights, stable: set[int], key: tuple[Any, ...], b: int, s_need: int, t_max: int
    ) -> _Static:
        """The kept buffers when they fit this call (same key, b <= B < 2b rows, s_need <= S <= 2 s_need slots),
        else new ones (the old freed first)."""
        st = self._static
        if st is not None and st.key == key and b <= st.rows < 2 * b and s_need <= st.slots <= 2 * s_need:
            return st
        self._static = None
        leaves = _leaves(weights)
        owned = [i for i, x in enumerate(leaves) if _ptr(x) not in stable]
        copies = {i: leaves[i].clone() for i in owned}
        counter = iter(range(len(leaves)))
        static_weights = _map(weights, lambda x: copies.get(next(counter), x))
        device, dtype = weights.embed.device, weights.embed.dtype
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim

        def pair(*shape: int) -> tuple[Tensor, Tensor]:
            return torch.ones(*shape, dtype=dtype, device=device), torch.zeros(*shape, dtype=dtype, device=device)

        keys = {layer.rope for layer in weights.layers}
        self._static = _Static(
            key=key,
            rows=b,
            slots=s_need,
            weights=static_weights,
            owned=owned,
            cache=[torch.zeros(b, 2 * hkv, s_need, d, dtype=dtype, device=device) for _ in weights.layers],
            bias=torch.zeros(b, 1, 1, s_need, dtype=dtype, device=device),
            slot_ids=torch.arange(s_need, device=device),
            tables={k: pair(t_max, b, 1, d) for k in keys},
            rope={k: pair(b, hq + 2 * hkv, d) for k in keys},
            uniforms=torch.zeros(t_max, b, 1, dtype=torch.float64, device=device),
            out_ids=torch.zeros(b, t_max, dtype=torch.long, device=device),
            out_logprobs=torch.zeros(b, t_max, dtype=torch.float32, device=device),
            unfinished=torch.zeros(b, dtype=torch.bool, device=device),
            alive=torch.zeros(t_max, dtype=torch.bool, device=device),
            index=torch.ones(1, dtype=torch.long, device=device),
            width=torch.zeros(1, dtype=torch.long, device=device),
        )
        return self._static

    def _generate(
        self, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams, eos_token_id: int, pad_token_id: int
    ) -> tuple[Tensor, Tensor]:
        """As :meth:`FastDecoder._generate` (same arguments, same outputs), the token steps static."""
        weights = self._weights()
        device = weights.embed.device
        ids, mask = prompt_ids.to(device), prompt_mask.to(device).bool()
        b, p = ids.shape
        t_max = params.max_new_tokens
        s_need = -(-(p + t_max) // SLOT_MULTIPLE) * SLOT_MULTIPLE
        stable = self._stable()
        key = self._key(weights, stable, params, t_max, eos_token_id, pad_token_id)
        st = self._state(weights, stable, key, b, s_need, t_max)
        fresh, static = _leaves(weights), _leaves(st.weights)
        for i in st.owned:  # this call's adapters (and other per-call copies) into the graph's buffers
            static[i].copy_(fresh[i])
        extra = st.rows - b  # copies of the last row, finished from the start
        if extra:
            ids = torch.cat([ids, ids[-1:].expand(extra, -1)])
            mask = torch.cat([mask, mask[-1:].expand(extra, -1)])
        capture = self.capture if self.capture is not None else device.type == "cuda"
        if capture and st.graph is None and t_max > 1:
            self._capture(st, params, eos_token_id, pad_token_id)

        # this call's state: the prompt's slots unmasked where real, every later slot masked until written
        st.bias.fill_(float("-inf"))
        st.bias[..., :p].masked_fill_(mask[:, None, None, :], 0.0)
        positions = mask.sum(-1)[:, None] + torch.arange(t_max, device=device)  # (B, T)
        tables = rope_tables(self.model)
        for name, table in tables.items():
            cos, sin = self._rope(positions, weights.embed.dtype, table)  # (B, T, D)
            st.tables[name][0].copy_(cos.transpose(0, 1)[:, :, None])
            st.tables[name][1].copy_(sin.transpose(0, 1)[:, :, None])
        if params.do_sample:
            st.uniforms.copy_(torch.rand(st.uniforms.shape, dtype=torch.float64, device=device))
        st.out_ids.fill_(pad_token_id)
        st.out_logprobs.zero_()
        st.unfinished.fill_(True)
        st.unfinished[b:] = False
        st.alive.fill_(False)
        st.width.fill_(p)

        distinct, rows = torch.unique(torch.cat([ids, mask.long()], 1), dim=0, return_inverse=True)  # (U, 2P), (B,)
        logits = self._prefill(distinct[:, :p], distinct[:, p:].bool(), st.weights, rows, st.cache, tables)
        self._choose(st, logits, torch.zeros_like(st.index), params, eos_token_id, pad_token_id)
        st.index.fill_(1)
        steps = t_max
        if not bool(st.alive[0]):
            steps = 1
        for s in range(1, steps):
            if st.graph is not None:
                st.graph.replay()
            else:
                self._step(st, params, eos_token_id, pad_token_id)
            if not bool(st.alive[s]):
                steps = s + 1
                break
        return st.out_ids[:b, :steps], st.out_logprobs[:b, :steps]

    def _capture(self, st: _Static, params: SamplingParams, eos: int, pad: int) -> None:
        """Warm the step up on a side stream, then record it (PyTorch's recipe for ``torch.cuda.graph``); the
        state both leave behind is reset by the caller."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                st.index.fill_(1)
                self._step(st, params, eos, pad)
        torch.cuda.current_stream().wait_stream(stream)
        st.index.fill_(1)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step(st, params, eos, pad)
        st.graph = graph
        self.captures += 1

    def _choose(self, st: _Static, logits: Tensor, index: Tensor, params: SamplingParams, eos: int, pad: int) -> None:
        """The token at `index` (a (1,) tensor) from (B, V) `logits`: written with its log-prob, rows finished."""
        uniforms = st.uniforms.index_select(0, index)[0] if params.do_sample else None
        tokens, scores, log_z = sample_step(logits, params, uniforms)  # (B,), (B, V), (B, 1)
        pad_t = torch.full_like(tokens, pad)
        vocab = st.weights.vocab
        if vocab is not None:  # a restricted head: (B, K) scores, an index -> its token id
            logprobs = scores.gather(-1, tokens[:, None]) - log_z
            tokens = torch.where(st.unfinished, vocab[tokens], pad_t)
        else:
            tokens = torch.where(st.unfinished, tokens, pad_t)
            logprobs = scores.gather(-1, tokens[:, None]) - log_z
        st.out_ids.index_copy_(1, index, tokens[:, None])
        st.out_logprobs.index_copy_(1, index, logprobs.float())
        st.unfinished &= tokens != eos
        st.alive.index_copy_(0, index, st.unfinished.any()[None])

    def _step(self, st: _Static, params: SamplingParams, eos: int, pad: int) -> None:
        """Feed the token at ``index - 1`` and choose the one at ``index``: nothing here reads a tensor's value
        on the host, so a CUDA graph can record it."""
        w, b = st.weights, st.rows
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        fed = st.index - 1
        slot = st.width + fed  # (1,)
        for key, (cos, sin) in st.tables.items():
            st.rope[key][0][:, : hq + hkv] = cos.index_select(0, fed)[0]
            st.rope[key][1][:, : hq + hkv] = sin.index_select(0, fed)[0]
        st.bias.index_fill_(-1, slot, 0.0)
        masks: dict[int | None, Tensor] = {None: st.bias}
        for window in {layer.window for layer in w.layers if layer.window is not None}:
            masks[window] = st.bias.masked_fill(st.slot_ids <= slot - window, float("-inf"))
        x = self._embed(st.out_ids.index_select(1, fed)[:, 0], w)  # (B, E)
        for i, layer in enumerate(w.layers):
            qkv = _project(self._norm(x, layer.input_norm), layer.qkv, layer.qkv_lora).view(b, hq + 2 * hkv, d)
            if layer.qk_norm is not None:
                qkv[:, : hq + hkv] = self._norm(qkv[:, : hq + hkv], layer.qk_norm)
            cos, sin = st.rope[layer.rope]
            qkv = torch.addcmul(qkv * cos, qkv.roll(d // 2, -1), sin)  # RoPE on q and k, v unchanged
            kv = st.cache[i]
            kv.index_copy_(2, slot, qkv[:, hq:, None])
            attn = F.scaled_dot_product_attention(  # the G query heads of a KV head as its G query rows
                qkv[:, :hq].view(b, hkv, hq // hkv, d),
                kv[:, :hkv],
                kv[:, hkv:],
                attn_mask=masks[layer.window],
                scale=self.plan.scaling,
            )  # (B, Hkv, G, D)
            x = self._residual(x, attn.reshape(b, hq * d), layer)
        self._choose(st, self._logits(x, w), st.index, params, eos, pad)
        st.index.add_(1)
