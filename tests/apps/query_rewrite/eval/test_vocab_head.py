"""``queryrl eval --vocab-ids``: a model system decodes with a vocabulary-restricted head, greedy tokens are the full
head's wherever its argmax is kept, and the eval JSON says how each system decoded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.eval.generation import generate_replies, vocab_files
from queryrl.apps.query_rewrite.eval.samples import EvalError, load_samples
from queryrl.cli import app
from queryrl.models.vocab import VOCAB_FILE, write_vocab_ids
from queryrl.rollout.base import SamplingParams

DATA = "builtin://sales_demo/test"
GREEDY = SamplingParams(do_sample=False, max_new_tokens=8)


def _full_greedy_ids(folder: Path, prompts: list[list[dict[str, str]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(response ids, mask) of the full-head model's greedy replies, one prompt at a time."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from queryrl.config import ModelConfig
    from queryrl.data.prompts import encode_prompt
    from queryrl.models.loading import load_tokenizer
    from queryrl.rollout.hf import HFRollout

    tokenizer = load_tokenizer(OmegaConf.structured(ModelConfig(path=str(folder))))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = HFRollout(model, tokenizer, micro_batch_size=1).generate(
        [encode_prompt(tokenizer, p) for p in prompts], GREEDY
    )
    return out.response_ids, out.response_mask.bool()


def test_greedy_gives_the_full_heads_tokens_where_they_are_kept(tiny_cfg: DictConfig, model_cache: Path) -> None:
    """Kept: every greedy choice of the full head (and every 5th id): the same replies. A kept-ids file without
    any of the prompts' tokens: still the same replies, since the evaluated prompts' own tokens stay reachable
    (the tiny model's greedy replies copy prompt tokens, as a rewrite copies from its conversation)."""
    from omegaconf import OmegaConf

    from queryrl.config import ModelConfig
    from queryrl.data.prompts import encode_prompt
    from queryrl.models.loading import load_tokenizer, resolve_model_path

    folder = resolve_model_path(tiny_cfg.model)
    prompts = [s.prompt for s in load_samples(DATA, 4, str(model_cache))]
    full = generate_replies(folder, prompts, GREEDY, batch_size=4, device="cpu")
    ids, mask = _full_greedy_ids(folder, prompts)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    chosen = {int(t) for t in ids[mask]}
    kept = sorted(set(range(0, vocab, 5)) | chosen)
    assert len(kept) < vocab // 2
    assert generate_replies(folder, prompts, GREEDY, batch_size=4, device="cpu", vocab=kept) == full

    tokenizer = load_tokenizer(OmegaConf.structured(ModelConfig(path=str(folder))))
    prompt_tokens = set().union(*(encode_prompt(tokenizer, p) for p in prompts))
    assert chosen <= prompt_tokens, "the tiny model's greedy replies no longer copy prompt tokens: pick other rows"
    bare = sorted(set(range(0, vocab, 5)) - prompt_tokens)
    assert generate_replies(folder, prompts, GREEDY, batch_size=4, device="cpu", vocab=bare) == full


def test_the_eval_json_says_how_each_system_decoded(tmp_path: Path, tiny_cfg: DictConfig, model_cache: Path) -> None:
    """``--vocab-ids cut=FOLDER``: ``cut`` decodes with the folder's kept ids, ``full`` with the full head; each
    one's entry of ``settings.systems`` says so (with the kept count and the file)."""
    from queryrl.models.loading import resolve_model_path

    folder = resolve_model_path(tiny_cfg.model)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    ids_dir = tmp_path / "sft"
    ids_dir.mkdir()
    write_vocab_ids(ids_dir / VOCAB_FILE, list(range(0, vocab, 2)))
    out = tmp_path / "eval.json"
    args = ["eval", "--data", DATA, "--systems", f"raw_turn,full={folder},cut={folder}", "--out", str(out)]
    args += ["--max-samples", "2", "--max-new-tokens", "4", "--bootstrap", "20", f"model.cache_dir={model_cache}"]
    result = CliRunner().invoke(app, [*args, "--vocab-ids", f"cut={ids_dir}"])
    assert result.exit_code == 0, result.output
    systems = {s["name"]: s for s in json.loads(out.read_text())["settings"]["systems"]}
    assert "head" not in systems["raw_turn"]
    assert systems["full"]["head"] == "full"
    assert "vocab_kept" not in systems["full"]
    assert systems["cut"] | {"path": None} == {
        "name": "cut",
        "kind": "model",
        "path": None,
        "head": "restricted",
        "vocab_kept": len(range(0, vocab, 2)),
        "vocab_ids": str(ids_dir / VOCAB_FILE),
    }
    bad = CliRunner().invoke(app, [*args, "--vocab-ids", f"nobody={ids_dir}"])
    assert bad.exit_code == 2
    assert "'nobody=" in bad.output
    assert "model systems (full, cut)" in bad.output


def test_vocab_files_names_what_is_wrong(tmp_path: Path) -> None:
    file = write_vocab_ids(tmp_path / VOCAB_FILE, [1, 2, 3])
    assert vocab_files(None, ["a"]) == {}
    assert vocab_files(str(file), ["a", "b"]) == {"a": file, "b": file}  # one FILE: every model system
    assert vocab_files(f"b={tmp_path}", ["a", "b"]) == {"b": file}  # a folder holding one
    with pytest.raises(EvalError, match=r"--vocab-ids: 'c=.*' is not NAME=FILE with NAME one of the model systems"):
        vocab_files(f"a={file},c={file}", ["a", "b"])
    with pytest.raises(EvalError, match="a system is named twice"):
        vocab_files(f"a={file},a={file}", ["a", "b"])
    with pytest.raises(EvalError, match=r"--vocab-ids: a: .*nowhere.json: no such file"):
        vocab_files(f"a={tmp_path / 'nowhere.json'}", ["a"])
    (tmp_path / "bad.json").write_text("[1, 2]", encoding="utf-8")
    from queryrl.apps.query_rewrite.eval.generation import read_vocab

    with pytest.raises(EvalError, match=r"--vocab-ids: .*bad.json: not a kept-vocabulary file"):
        read_vocab(tmp_path / "bad.json")
