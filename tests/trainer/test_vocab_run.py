"""model.vocab.restrict in a run: the kept set covers the data, a run trains, checkpoints, resumes bitwise and
exports the full-vocabulary model; bad settings are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from queryrl.config import ConfigError
from queryrl.models.vocab import VOCAB_FILE, read_vocab_ids, vocab_ids
from queryrl.trainer.export import export_checkpoint
from queryrl.trainer.loop import Trainer
from queryrl.trainer.vocab import target_texts
from tests.helpers import assert_same_params, make_cfg, metrics_of, params

RESTRICT = ("model.lora.rank=4", "actor.use_kl_loss=true", "actor.ppo_epochs=2", "model.vocab.restrict=true")


def test_the_kept_set_holds_every_token_of_the_data(tmp_path: Path, model_cache: Path) -> None:
    """(e) every prompt token, every target's tokens, the extra files' and the template's are kept."""
    extra = tmp_path / "glossary.txt"
    extra.write_text("zebra quartz\nxylophone\n", encoding="utf-8")
    trainer = Trainer(make_cfg(tmp_path, model_cache, *RESTRICT, f"model.vocab.extra_files=[{extra}]"))
    tok, kept = trainer.c.policy.tokenizer, set(trainer.c.vocab_ids or [])
    datasets = [*trainer.c.loader.datasets, *trainer.c.val_datasets]
    prompt_tokens = {t for d in datasets for item in d.items for t in item.input_ids}
    targets = list(target_texts(datasets, "extra_info.sft_target"))
    assert targets  # the toy rows' ground truths
    target_tokens = {t for text in targets for t in tok(text, add_special_tokens=False)["input_ids"]}
    extra_tokens = {
        t for line in ("zebra quartz", "xylophone") for t in tok(line, add_special_tokens=False)["input_ids"]
    }
    assert prompt_tokens | target_tokens | extra_tokens | {tok.eos_token_id, tok.pad_token_id} <= kept
    assert len(kept) < trainer.c.policy.model.config.vocab_size
    assert trainer.c.vocab_ids == sorted(kept)
    assert read_vocab_ids(tmp_path / "toy_grpo" / VOCAB_FILE) == trainer.c.vocab_ids


def test_an_application_adds_its_texts() -> None:
    """The query rewriter's embedded RAG corpus is kept (its names are what a rewrite copies)."""
    from queryrl.apps.query_rewrite.plugin import QueryRewriteApp
    from queryrl.apps.query_rewrite.reward.rag import corpus_documents

    cfg = OmegaConf.create({"app": {"query_rewrite": {"rag": {"url": None, "corpus": "sales_demo"}}}})
    texts = list(QueryRewriteApp().vocab_texts(cfg))
    docs = corpus_documents("sales_demo")
    assert texts == [t for d in docs for t in (d.title, d.content)]
    cfg.app.query_rewrite.rag.url = "http://rag"  # an external service: its corpus is not ours to read
    assert list(QueryRewriteApp().vocab_texts(cfg)) == []


@pytest.mark.slow
def test_a_restricted_run_trains_checkpoints_resumes_bitwise_and_exports_full(
    tmp_path: Path, model_cache: Path
) -> None:
    """(d) LoRA GRPO with the restricted head: the adapters learn, the checkpoint holds the kept ids, a run
    resumed at step 2 ends where a straight one does (bit for bit), and the export is the full-vocab model."""
    straight = Trainer(make_cfg(tmp_path / "a", model_cache, "trainer.total_steps=4", *RESTRICT))
    before = params(straight.c.policy.model)
    straight.fit()
    after = params(straight.c.policy.model)
    assert any(not torch.equal(before[k], after[k]) for k in after if "lora_" in k)
    assert straight.c.policy.model.get_output_embeddings().out_features == len(straight.c.vocab_ids or [])

    first = Trainer(make_cfg(tmp_path / "b", model_cache, "trainer.total_steps=4", *RESTRICT))
    first.fit(max_steps=2)
    folder = tmp_path / "b" / "toy_grpo" / "checkpoints" / "step_2"
    assert read_vocab_ids(folder / VOCAB_FILE) == first.c.vocab_ids
    assert "vocab_ids.json" in json.loads((folder / "manifest.json").read_text())["files"]
    del first
    resumed = Trainer(make_cfg(tmp_path / "b", model_cache, "trainer.total_steps=4", *RESTRICT))
    assert resumed.step == 2
    assert resumed.c.vocab_ids == straight.c.vocab_ids
    assert torch.equal(vocab_ids(resumed.c.policy.model), torch.tensor(straight.c.vocab_ids))
    resumed.fit()
    assert_same_params(straight.c.policy.model, resumed.c.policy.model)
    assert [r["step"] for r in metrics_of(tmp_path / "b" / "toy_grpo")] == [1, 2, 3, 4]
    assert metrics_of(tmp_path / "b" / "toy_grpo")[-1]["data/vocab_kept"] == len(straight.c.vocab_ids or [])

    from transformers import AutoModelForCausalLM

    out = export_checkpoint(tmp_path / "b" / "toy_grpo", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    vocab = merged.config.vocab_size
    assert merged.get_output_embeddings().weight.shape[0] == vocab
    ids = torch.tensor([[5, 9, 17, 33, 2, 41]])
    with torch.no_grad():
        full = merged(input_ids=ids).logits
        restricted = resumed.c.policy.model.eval()(input_ids=ids).logits
    kept = resumed.c.vocab_ids or []
    assert full.shape[-1] == vocab
    assert restricted.shape[-1] == len(kept)
    torch.testing.assert_close(restricted, full[..., kept], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("model.lora.rank=0",), "needs a frozen output head: set model.lora.rank > 0"),
        (("model.lora.rank=4", "model.lora.target_modules=[q_proj,lm_head]"), "LoRA on lm_head"),
        (("model.lora.rank=4", "rollout.backend=vllm"), "trainer.backend=local and rollout.backend=hf"),
    ],
)
def test_bad_settings_are_one_line(tmp_path: Path, model_cache: Path, overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_cfg(tmp_path, model_cache, "model.vocab.restrict=true", *overrides)


def test_a_missing_extra_file_is_named(tmp_path: Path, model_cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.vocab.extra_files: .*nowhere.txt: FileNotFoundError"):
        Trainer(make_cfg(tmp_path, model_cache, *RESTRICT, f"model.vocab.extra_files=[{tmp_path / 'nowhere.txt'}]"))
