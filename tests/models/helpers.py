"""Tiny GGUF files for the convert-gguf tests: random Llama and Gemma 3 models written with gguf's own
``GGUFWriter`` in llama.cpp's tensor layout (convert_hf_to_gguf.py: Q/K rows permuted for Llama, ``1 +``
folded into Gemma's norm weights), tensors stored as F32, F16 or quantised, and a reference
dequantiser per type written from ggml's block layouts (ggml-quants.c ``dequantize_row_*``; llama.cpp,
MIT) so the loader's dequantisation is checked against an independent implementation.

Types gguf.quants can quantise (Q4_1, Q5_0, Q8_0) quantise the model's own weights; for the K-quants
(Q4_K, Q6_K), which it cannot quantise, the blocks are random bytes with finite scales, a valid
encoding of some weight matrix, and the reference model takes the weights they decode to.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

MERGES = ["h e", "l l", "he ll", "Ġ w", "o r"]
EOS = "<|endoftext|>"
SP_PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "lo", "llo", "ello", "▁hello", "▁w", "or", "▁wor"]
QK_K = 256  # elements per K-quant block


# --- reference dequantisers: one block row at a time, float32 in ggml's order of operations ---


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 from (..., 2) bytes, as float32."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _deq_q4_1(b: np.ndarray) -> np.ndarray:  # block: d f16, m f16, qs[16]
    d, m, qs = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None], b[:, 4:20]
    return np.concatenate([(qs & 0xF) * d + m, (qs >> 4) * d + m], axis=1)


def _deq_q5_0(b: np.ndarray) -> np.ndarray:  # block: d f16, qh u32, qs[16]
    d, qs = _f16(b[:, 0:2])[:, None], b[:, 6:22].astype(np.int32)
    qh = np.ascontiguousarray(b[:, 2:6]).view("<u4").astype(np.int64)  # (nb, 1)
    j = np.arange(16)
    xh_0 = ((qh >> j) << 4) & 0x10
    xh_1 = (qh >> (j + 12)) & 0x10
    x0 = ((qs & 0x0F) | xh_0) - 16
    x1 = ((qs >> 4) | xh_1) - 16
    return np.concatenate([x0 * d, x1 * d], axis=1).astype(np.float32)


def _deq_q8_0(b: np.ndarray) -> np.ndarray:  # block: d f16, qs int8[32]
    return b[:, 2:34].view(np.int8).astype(np.float32) * _f16(b[:, 0:2])[:, None]


def _scale_min_k4(scales: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4: the 6-bit scale and min of sub-block `j` from the 12 packed bytes."""
    if j < 4:
        return scales[:, j] & 63, scales[:, j + 4] & 63
    sc = (scales[:, j + 4] & 0xF) | ((scales[:, j - 4] >> 6) << 4)
    mn = (scales[:, j + 4] >> 4) | ((scales[:, j] >> 6) << 4)
    return sc, mn


def _deq_q4_k(b: np.ndarray) -> np.ndarray:  # block: d f16, dmin f16, scales[12], qs[128]
    d, dmin, scales, qs = _f16(b[:, 0:2]), _f16(b[:, 2:4]), b[:, 4:16], b[:, 16:144]
    out = []
    for chunk in range(4):  # 64 values: the low nibbles of 32 bytes, then their high nibbles
        q = qs[:, 32 * chunk : 32 * chunk + 32]
        for half, nibbles in enumerate((q & 0xF, q >> 4)):
            sc, mn = _scale_min_k4(scales, 2 * chunk + half)
            d1, m1 = (d * sc.astype(np.float32))[:, None], (dmin * mn.astype(np.float32))[:, None]
            out.append(d1 * nibbles.astype(np.float32) - m1)
    return np.concatenate(out, axis=1)


def _deq_q6_k(b: np.ndarray) -> np.ndarray:  # block: ql[128], qh[64], scales int8[16], d f16
    ql, qh, sc, d = b[:, 0:128], b[:, 128:192], b[:, 192:208].view(np.int8), _f16(b[:, 208:210])
    out = np.empty((b.shape[0], QK_K), np.float32)
    for n in range(2):  # two halves of 128 values
        lo, hi, h, s = ql[:, 64 * n : 64 * n + 32], ql[:, 64 * n + 32 : 64 * n + 64], qh[:, 32 * n : 32 * n + 32], sc
        quads = (
            ((lo & 0xF) | (((h >> 0) & 3) << 4)),
            ((hi & 0xF) | (((h >> 2) & 3) << 4)),
            ((lo >> 4) | (((h >> 4) & 3) << 4)),
            ((hi >> 4) | (((h >> 6) & 3) << 4)),
        )
        for k, q in enumerate(quads):
            for l16 in range(2):  # is = l / 16: one scale per 16 values
                scale = s[:, 8 * n + l16 + 2 * k].astype(np.float32)
                cols = slice(128 * n + 32 * k + 16 * l16, 128 * n + 32 * k + 16 * l16 + 16)
                qv = q[:, 16 * l16 : 16 * l16 + 16].astype(np.int32) - 32
                out[:, cols] = (d * scale)[:, None] * qv.astype(np.float32)
    return out


DEQUANT = {Q.Q4_1: _deq_q4_1, Q.Q5_0: _deq_q5_0, Q.Q8_0: _deq_q8_0, Q.Q4_K: _deq_q4_k, Q.Q6_K: _deq_q6_k}


def dequantize_reference(raw: np.ndarray, qtype: Q, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 matrix of `shape` (rows, cols) that the stored `raw` bytes of type `qtype` encode."""
    if qtype == Q.F32:
        return raw.astype(np.float32).reshape(shape)
    if qtype == Q.F16:
        return raw.astype(np.float32).reshape(shape)
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = np.ascontiguousarray(raw).reshape(-1, block_bytes)
    return DEQUANT[qtype](blocks).reshape(shape)


def encode(data: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """What the file stores for float32 `data` (rows, cols) as `qtype`: quantised by gguf.quants where it
    can; for Q4_K and Q6_K random blocks (random bytes, float16 scales in a range that gives weights of
    about 0.01-0.1) of the same shape, since gguf.quants cannot quantise them."""
    if qtype == Q.F32:
        return data.astype(np.float32)
    if qtype == Q.F16:
        return data.astype(np.float16)
    if qtype not in (Q.Q4_K, Q.Q6_K):
        return gguf.quants.quantize(data.astype(np.float32), qtype)
    rows, cols = data.shape
    assert cols % QK_K == 0, f"a {qtype.name} row holds whole blocks of {QK_K}, not {cols}"
    nb, size = cols // QK_K, gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    scales = rng.uniform(6.2e-5, 2e-4, (rows, nb, 2)).astype(np.float16).view(np.uint8).reshape(rows, nb, 4)
    if qtype == Q.Q4_K:
        blocks[..., 0:4] = scales  # d, dmin
    else:
        blocks[..., 208:210] = scales[..., 0:2]  # d
    return blocks.reshape(rows, nb * size)


# --- tiny models and their GGUF files ---


def bpe_vocabulary() -> tuple[list[str], list[int]]:
    """A byte-level BPE vocabulary: the 256 byte symbols, the merges' results, one control token."""
    tokens = list(bytes_to_unicode().values())
    tokens += ["".join(m.split(" ")) for m in MERGES]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    return [*tokens, EOS], [*types, gguf.TokenType.CONTROL]


def sp_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """A Gemma-style sentencepiece vocabulary: pad, eos, bos, unk, the 256 byte pieces, a few words."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    byte_pieces = [f"<0x{i:02X}>" for i in range(256)]
    tokens = specials + byte_pieces + SP_PIECES
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN] + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * len(SP_PIECES)
    scores = [0.0] * (len(specials) + 256) + [-float(i) for i in range(len(SP_PIECES))]
    return tokens, scores, types


def _randomise_norms(model: torch.nn.Module, low: float, high: float) -> None:
    with torch.no_grad():  # norms start at 1 (Gemma: 0): make them random too, so a mixed-up tensor shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(low, high)


def tiny_llama(vocab_size: int, tie: bool, hidden: int = 64, intermediate: int = 96, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: K is permuted with its own head count
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
        bos_token_id=vocab_size - 1,
        eos_token_id=vocab_size - 1,
    )
    model = LlamaForCausalLM(config).eval()
    _randomise_norms(model, 0.5, 1.5)
    return model


def tiny_gemma3(vocab_size: int, tie: bool, seed: int = 0) -> Gemma3ForCausalLM:
    """Six layers, so the default pattern makes layer 5 full attention (rope 1e6) and 0-4 sliding (rope 1e4,
    window 4, shorter than the test inputs); head_dim 256 like Gemma 3 270M's, which is what transformers
    assumes for query_pre_attn_scalar (a GGUF file does not carry it)."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=4,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    model = Gemma3ForCausalLM(config).eval()
    _randomise_norms(model, -0.5, 0.5)  # Gemma's norms scale by 1 + weight
    return model


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order of a Q/K projection (convert_hf_to_gguf.LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of :func:`permute`."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class Stored:
    """One tensor as written: its Hugging Face name, GGUF type, bytes and float shape."""

    hf_name: str
    qtype: Q
    raw: np.ndarray
    shape: tuple[int, ...]


def _metadata(writer: gguf.GGUFWriter, model: torch.nn.Module, arch: str, licence: str | None) -> None:
    cfg = model.config
    writer.add_name(f"tiny-{arch}-test")
    if licence is not None:
        writer.add_license(licence)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch == "llama":
        writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
        writer.add_rope_freq_base(10000.0)
        writer.add_vocab_size(cfg.vocab_size)
        tokens, types = bpe_vocabulary()
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(MERGES)
        writer.add_bos_token_id(len(tokens) - 1)
        writer.add_eos_token_id(len(tokens) - 1)
    else:  # gemma3, as llama.cpp's Gemma3Model writes it
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
        writer.add_rope_freq_base(1_000_000.0)
        writer.add_sliding_window(cfg.sliding_window)
        tokens, scores, sp_types = sp_vocabulary()
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(sp_types)
        writer.add_bos_token_id(2)
        writer.add_eos_token_id(1)
        writer.add_unk_token_id(3)
        writer.add_pad_token_id(0)
        writer.add_add_bos_token(True)


def write_gguf(
    model: torch.nn.Module,
    path: Path,
    store_output: bool,
    types: dict[str, Q] | None = None,
    seed: int = 0,
    licence: str | None = "apache-2.0",
) -> dict[str, Stored]:
    """`model` (a tiny Llama or Gemma 3) as a GGUF file; `types` maps a GGUF tensor role (``token_embd``,
    ``attn_q``, ``ffn_down``, ``output``, ...) to its type (default F32; 1-D tensors are always F32);
    `store_output`: write ``output.weight`` even when it is tied; `licence`: ``general.license``.
    Returns what was stored, by GGUF name."""
    arch = "llama" if isinstance(model, LlamaForCausalLM) else "gemma3"
    cfg, types, rng = model.config, types or {}, np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    _metadata(writer, model, arch, licence)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if not types else gguf.LlamaFileType.MOSTLY_Q4_K_M)
    arch_id = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(arch_id, cfg.num_hidden_layers)
    state = model.state_dict()
    if cfg.tie_word_embeddings and not store_output:
        state.pop("lm_head.weight")
    stored: dict[str, Stored] = {}
    for hf_name, tensor in state.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        data = tensor.detach().float().numpy().copy()
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            data = permute(data, cfg.num_attention_heads)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            data = permute(data, cfg.num_key_value_heads)
        elif arch == "gemma3" and hf_name.endswith("norm.weight"):
            data = data + 1  # llama.cpp folds Gemma's (1 + w) into the stored weight
        role = name.split(".")[-2]
        qtype = types.get(role, Q.F32) if data.ndim == 2 else Q.F32
        raw = encode(data, qtype, rng)
        writer.add_tensor(name, raw, raw_dtype=qtype if qtype not in (Q.F32, Q.F16) else None)
        stored[name] = Stored(hf_name, qtype, raw, data.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def reference_model(model: torch.nn.Module, stored: dict[str, Stored]) -> torch.nn.Module:
    """A copy of `model` holding the weights the stored tensors decode to, by :func:`dequantize_reference`
    and the inverse of llama.cpp's layout changes."""
    cfg, gemma = copy.deepcopy(model.config), isinstance(model, Gemma3ForCausalLM)
    cfg.tie_word_embeddings = "output.weight" not in stored  # what transformers' loader decides
    ref = type(model)(cfg).eval()
    state = {}
    for s in stored.values():
        w = dequantize_reference(s.raw, s.qtype, s.shape)
        if not gemma and s.hf_name.endswith("q_proj.weight"):
            w = unpermute(w, cfg.num_attention_heads)
        elif not gemma and s.hf_name.endswith("k_proj.weight"):
            w = unpermute(w, cfg.num_key_value_heads)
        elif gemma and s.hf_name.endswith("norm.weight"):
            w = w - np.float32(1)
        state[s.hf_name] = torch.from_numpy(np.ascontiguousarray(w))
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    return ref


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits
