"""``queryrl convert-gguf`` on quantised files: tiny random Llama and Gemma 3 models written with gguf's
``GGUFWriter`` in the tensor types of the two real models the project uses (SmolLM2-135M: Q4_1, Q8_0,
F32; Gemma 3 270M Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0, F32) plus F16. The converted folder must give the
logits of the model transformers loads from the file directly (bit for bit: the same tensors, saved),
and those of a reference model whose weights come from tests/models/helpers.py's own dequantisers.

Types covered: F32, F16, Q4_1, Q5_0, Q8_0 (quantised by gguf.quants), Q4_K and Q6_K (random valid
blocks: gguf.quants cannot quantise K-quants)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

gguf = pytest.importorskip("gguf", reason="convert-gguf needs the gguf package (pip install 'queryrl[gguf]')")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from queryrl.cli import app  # noqa: E402
from queryrl.models import gguf as gguf_mod  # noqa: E402
from tests.models.helpers import (  # noqa: E402
    bpe_vocabulary,
    dequantize_reference,
    encode,
    logits,
    reference_model,
    sp_vocabulary,
    tiny_gemma3,
    tiny_llama,
    write_gguf,
)

# the roles' types in the two real files (gguf_source.json of each), output as llama.cpp's Q4_K_M writes it
SMOLLM_TYPES = {
    "token_embd": Q.Q8_0,
    "attn_q": Q.Q4_1,
    "attn_k": Q.Q4_1,
    "attn_v": Q.F16,
    "attn_output": Q.Q4_K,
    "ffn_gate": Q.Q4_1,
    "ffn_up": Q.Q4_1,
    "ffn_down": Q.Q6_K,
    "output": Q.Q6_K,
}
GEMMA_TYPES = {
    "token_embd": Q.Q8_0,
    "attn_q": Q.Q5_0,
    "attn_k": Q.Q5_0,
    "attn_v": Q.Q8_0,
    "attn_output": Q.Q4_K,
    "ffn_gate": Q.Q5_0,
    "ffn_up": Q.Q5_0,
    "ffn_down": Q.Q6_K,
    "output": Q.Q6_K,
}


def convert(src: Path, out: Path) -> str:
    result = CliRunner().invoke(app, ["convert-gguf", str(src), str(out)])
    assert result.exit_code == 0, result.output
    return result.output


def direct(gguf_file: Path) -> torch.nn.Module:
    """The model transformers loads from the GGUF file itself."""
    return AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32).eval()


def check_three_ways(model: torch.nn.Module, gguf_file: Path, out: Path, stored: dict, vocab: int) -> torch.nn.Module:
    """Converted folder == direct GGUF load (exactly) == reference dequantisation (float32 rounding)."""
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    loaded, ref = direct(gguf_file), reference_model(model, stored)
    ids = torch.randint(0, vocab, (2, 17), generator=torch.Generator().manual_seed(1))
    got = logits(converted, ids)
    assert torch.equal(got, logits(loaded, ids))
    torch.testing.assert_close(got, logits(ref, ids), rtol=1e-5, atol=1e-5)
    for name, weight in ref.state_dict().items():  # and weight by weight, exactly
        torch.testing.assert_close(converted.state_dict()[name], weight, rtol=0, atol=0, msg=name)
    return converted


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K])
def test_reference_dequantisers_match_gguf(qtype: Q) -> None:
    rng = np.random.default_rng(int(qtype))
    data = rng.normal(0, 0.05, (8, 512)).astype(np.float32)
    raw = encode(data, qtype, rng)
    ours = dequantize_reference(raw, qtype, data.shape)
    np.testing.assert_array_equal(ours, gguf.quants.dequantize(raw, qtype).reshape(data.shape))
    if qtype in (Q.Q4_K, Q.Q6_K):  # random blocks: weights of the intended size, not all one value
        assert 0.005 < float(np.abs(ours).mean()) < 0.5
        assert len(np.unique(ours)) > 100
    else:  # quantised from `data`: within half a step of a 4-bit (or finer) grid of each block's range
        step = 2 * float(np.abs(data).max()) / 15
        assert float(np.abs(ours - data).max()) < step


@pytest.mark.parametrize("tie", [True, False])
def test_quantised_llama_converts_exactly(tmp_path: Path, tie: bool) -> None:
    tokens, _ = bpe_vocabulary()
    model = tiny_llama(len(tokens), tie, hidden=256, intermediate=256)  # rows of whole K-quant blocks
    stored = write_gguf(model, tmp_path / "tiny.gguf", store_output=not tie, types=SMOLLM_TYPES)
    output = convert(tmp_path / "tiny.gguf", tmp_path / "hf")
    converted = check_three_ways(model, tmp_path / "tiny.gguf", tmp_path / "hf", stored, len(tokens))

    expected = ["F16", "F32", "Q4_1", "Q4_K", "Q6_K", "Q8_0"]
    assert f"GGUF tensor types {'/'.join(expected)}" in output
    source = json.loads((tmp_path / "hf" / gguf_mod.SOURCE_FILE).read_text())
    assert source["gguf_tensor_types"] == expected
    assert source["tied_embeddings"] == tie
    shared = converted.get_output_embeddings().weight is converted.get_input_embeddings().weight
    assert shared == tie
    assert source["licence"]["stated"] == ["apache-2.0"]


@pytest.mark.slow
@pytest.mark.parametrize("tie", [True, False])
def test_quantised_gemma3_converts_exactly(tmp_path: Path, tie: bool) -> None:
    tokens, _, _ = sp_vocabulary()
    model = tiny_gemma3(len(tokens), tie)
    stored = write_gguf(model, tmp_path / "tiny.gguf", store_output=not tie, types=GEMMA_TYPES)
    output = convert(tmp_path / "tiny.gguf", tmp_path / "hf")
    assert "Gemma3ForCausalLM (gemma3_text)" in output
    converted = check_three_ways(model, tmp_path / "tiny.gguf", tmp_path / "hf", stored, len(tokens))

    config = converted.config
    assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert config.sliding_window == 4
    assert config.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
    assert config.head_dim == 256
    assert config.tie_word_embeddings == tie
    source = json.loads((tmp_path / "hf" / gguf_mod.SOURCE_FILE).read_text())
    assert source["gguf_tensor_types"] == ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]
    assert source["tied_embeddings"] == tie
    # Gemma's norms: the file holds 1 + w, the folder w again
    norm = stored["blk.0.attn_norm.weight"].raw
    torch.testing.assert_close(
        converted.model.layers[0].input_layernorm.weight, torch.from_numpy(norm - np.float32(1)), rtol=0, atol=0
    )

    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tok("hello world")["input_ids"]
    assert ids[0] == tok.bos_token_id == 2
    assert tok.decode(ids, skip_special_tokens=True) == "hello world"
