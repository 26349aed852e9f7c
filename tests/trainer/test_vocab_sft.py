"""model.vocab.restrict in SFT and in a GRPO run from its folder: the loss is the full cross-entropy restricted to
the kept ids and renormalised, a run writes its kept ids beside the full-vocabulary model, a GRPO run keeps them."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.config import load_config
from queryrl.models.loading import resolve_model_path
from queryrl.models.vocab import VOCAB_FILE, VocabError, read_vocab_ids, restrict_head, write_vocab_ids
from queryrl.trainer.loop import Trainer
from queryrl.trainer.sft import build_sft_data, train_sft
from queryrl.trainer.sft_batch import IGNORE_INDEX, collate, sum_prompt_and_target_loss, sum_target_loss
from queryrl.trainer.vocab import model_folder_vocab, run_vocab_ids
from tests.helpers import make_cfg as grpo_cfg
from tests.helpers import make_sft_cfg, write_sft_rows
from tests.rollout.helpers import with_lora

CPU = torch.device("cpu")
# a target whose words appear in no prompt: its tokens are kept because it is a target
TARGET = "zebra quartz xylophone"


def _renormalised_ce(model: Any, batch: dict[str, torch.Tensor], kept: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(target sum, prompt sum) of -log p over the FULL model's logits restricted to `kept` and renormalised."""
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits[:, :-1]
    logp = torch.log_softmax(logits.float()[..., kept], dim=-1)
    index = torch.full((int(logits.shape[-1]),), -1, dtype=torch.long)
    index[torch.tensor(kept)] = torch.arange(len(kept))
    nxt, mask = batch["input_ids"][:, 1:], batch["attention_mask"]
    target = batch["labels"][:, 1:] != IGNORE_INDEX
    prompt = (mask[:, :-1] * mask[:, 1:]).bool() & ~target
    assert bool((index[nxt][target | prompt] >= 0).all())  # every scored token is kept
    ce = -logp.gather(-1, index[nxt].clamp(min=0)[..., None]).squeeze(-1)
    return (ce * target).sum(), (ce * prompt).sum()


def test_the_restricted_sft_loss_is_the_renormalised_full_cross_entropy(tmp_path: Path, tiny_bundle: Any) -> None:
    """The target loss (and the prompt loss of sft.prompt_loss_weight) with the restricted head, and their
    gradients in the LoRA adapters, equal those of the full logits restricted to the kept ids."""
    tok = tiny_bundle.tokenizer
    data = write_sft_rows(tmp_path / "train.jsonl", prompts=["Hi", "Say hello to the whole world now."], target=TARGET)
    examples = build_sft_data([str(data)], tok, "extra_info.sft_target", 64, 16).examples
    full = with_lora(tiny_bundle.model).train()
    restricted = copy.deepcopy(full)
    vocab = int(tiny_bundle.model.config.vocab_size)
    used = {t for e in examples for t in [*e.prompt_ids, *e.target_ids]} | {tok.pad_token_id}
    kept = sorted(set(range(0, vocab, 7)) | used)
    assert len(kept) < vocab // 4
    restrict_head(restricted, kept)
    batch = collate(examples, tok.pad_token_id)

    expected_target, expected_prompt = _renormalised_ce(full, batch, kept)
    loss, count = sum_target_loss(restricted, batch, CPU)
    assert count == sum(len(e.target_ids) for e in examples)
    torch.testing.assert_close(loss, expected_target, atol=1e-4, rtol=1e-5)
    both = sum_prompt_and_target_loss(restricted, batch, CPU)
    torch.testing.assert_close(both[0], expected_target, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(both[2], expected_prompt, atol=1e-4, rtol=1e-5)

    (expected_target + 0.5 * expected_prompt).backward()
    (both[0] + 0.5 * both[2]).backward()
    grads = {k: p.grad for k, p in full.named_parameters() if p.grad is not None}
    mine = {k: p.grad for k, p in restricted.named_parameters() if p.grad is not None}
    assert grads
    assert grads.keys() == mine.keys()
    assert all("lora_" in k for k in grads)
    for k, g in grads.items():
        torch.testing.assert_close(mine[k], g, atol=1e-5, rtol=1e-4, msg=k)


def test_a_restricted_sft_run_trains_and_writes_its_kept_ids(tmp_path: Path, model_cache: Path) -> None:
    """LoRA SFT with the option: the adapters learn, the folder holds the full-vocabulary model and the kept ids
    (every prompt and target token, EOS included), the kept count is a metric."""
    data = write_sft_rows(tmp_path / "train.jsonl", target=TARGET)
    cfg = make_sft_cfg(
        tmp_path, model_cache, data, "model.lora.rank=4", "sft.max_steps=3", "sft.lr=1e-2", "model.vocab.restrict=true"
    )
    result = train_sft(cfg)
    out = tmp_path / "out"
    kept = read_vocab_ids(out / VOCAB_FILE)
    assert json.loads((out / VOCAB_FILE).read_text())["kept"] == len(kept) == len(set(kept))
    assert kept == sorted(kept)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    vocab = model.config.vocab_size
    assert model.get_output_embeddings().weight.shape[0] == vocab  # the saved model is the full one
    assert len(kept) < vocab
    built = build_sft_data([str(data)], tok, "extra_info.sft_target", 512, 256).examples
    target = set(tok(TARGET, add_special_tokens=False)["input_ids"]) | {tok.eos_token_id}
    assert target <= set(kept)
    assert {t for e in built for t in e.prompt_ids} <= set(kept)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["data/vocab_kept"] for r in rows] == [len(kept)] * 3
    assert all(r["timing_s/step"] > 0 for r in rows)  # each step's time (benchmarks/vocab_head_stages.py)
    assert result.losses[-1] < result.losses[0]
    assert (out / "adapter" / "adapter_config.json").is_file()


def test_full_fine_tuning_with_a_restricted_head_is_refused(tmp_path: Path, model_cache: Path) -> None:
    data = write_sft_rows(tmp_path / "train.jsonl")
    args = ["sft", f"model.cache_dir={model_cache}", f"sft.train_files=[{data}]", "model.vocab.restrict=true"]
    result = CliRunner().invoke(app, [*args, f"sft.output_dir={tmp_path / 'out'}", "model.lora.rank=0"])
    assert result.exit_code == 2
    assert "needs a frozen output head" in result.output
    assert not (tmp_path / "out").exists()


def _sft_folder(tmp_path: Path, model_cache: Path, ids: list[int]) -> Path:
    """The tiny model's folder with a kept-vocabulary file, as a restricted ``queryrl sft`` leaves it."""
    folder = tmp_path / "sft"
    shutil.copytree(resolve_model_path(load_config(None, [f"model.cache_dir={model_cache}"]).model), folder)
    write_vocab_ids(folder / VOCAB_FILE, ids)
    return folder


def test_grpo_from_a_restricted_sft_keeps_the_union(tmp_path: Path, model_cache: Path) -> None:
    """GRPO with the option from a folder carrying vocab_ids.json keeps the SFT's ids and its own."""
    restrict = ("model.lora.rank=4", "model.vocab.restrict=true")
    plain = grpo_cfg(tmp_path / "plain", model_cache, *restrict)
    folder = _sft_folder(tmp_path, model_cache, [])
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    sft_ids = [3, 5, vocab - 2, vocab - 1]
    write_vocab_ids(folder / VOCAB_FILE, sft_ids)
    trainer = Trainer(grpo_cfg(tmp_path / "run", model_cache, *restrict, f"model.path={folder}"))
    datasets = [*trainer.c.loader.datasets, *trainer.c.val_datasets]
    own = run_vocab_ids(plain, trainer.c.policy.tokenizer, datasets, vocab)
    assert not {vocab - 2, vocab - 1} <= set(own)  # the SFT's ids are not the run's own
    assert trainer.c.vocab_ids == sorted(set(own) | set(sft_ids))
    assert read_vocab_ids(tmp_path / "run" / "toy_grpo" / VOCAB_FILE) == trainer.c.vocab_ids


def test_a_damaged_vocab_file_in_the_model_folder_is_named(tmp_path: Path, model_cache: Path) -> None:
    folder = _sft_folder(tmp_path, model_cache, [1, 2])
    (folder / VOCAB_FILE).write_text("{not json", encoding="utf-8")
    cfg = grpo_cfg(tmp_path / "run", model_cache, "model.lora.rank=4", "model.vocab.restrict=true")
    cfg.model.path = str(folder)
    with pytest.raises(VocabError, match=rf"{folder / VOCAB_FILE}: not a kept-vocabulary file"):
        model_folder_vocab(cfg)
