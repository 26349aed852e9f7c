"""LoRA checkpoints (adapters and their optimizer state only), bitwise resume, export, save_last, sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from queryrl.trainer.checkpoint import checkpoint_dirs, folder_sizes_mb, read_checkpoint
from queryrl.trainer.export import export_checkpoint
from queryrl.trainer.loop import Trainer
from tests.helpers import assert_same_params, make_cfg, metrics_of

LORA = ("model.lora.rank=4", "actor.use_kl_loss=true", "actor.ppo_epochs=2", "actor.ppo_mini_batch_size=2")


@pytest.mark.slow
def test_lora_checkpoint_holds_the_adapters_and_resumes_bitwise(tmp_path: Path, model_cache: Path) -> None:
    straight = Trainer(make_cfg(tmp_path / "a", model_cache, "trainer.total_steps=4", *LORA))
    straight.fit()

    first = Trainer(make_cfg(tmp_path / "b", model_cache, "trainer.total_steps=4", *LORA))
    first.fit(max_steps=2)
    trainable = {n for n, p in first.c.policy.model.named_parameters() if p.requires_grad}
    del first
    folder = tmp_path / "b" / "toy_grpo" / "checkpoints" / "step_2"

    # the adapters only: no base weights in the folder, no optimizer state for frozen parameters
    assert not list((folder / "actor").glob("model*.safetensors"))
    adapter = load_file(folder / "actor" / "adapter_model.safetensors")
    assert adapter
    assert all("lora_" in k for k in adapter)
    assert len(adapter) == len(trainable)
    _, optim, _ = read_checkpoint(folder)
    assert len(optim["actor"]["state"]) == len(trainable)
    assert all(s["exp_avg"].shape == s["exp_avg_sq"].shape for s in optim["actor"]["state"].values())
    sizes = folder_sizes_mb(folder)
    assert sizes["actor"] < 0.2  # adapters (+ the tiny tokenizer), never the model

    resumed = Trainer(make_cfg(tmp_path / "b", model_cache, "trainer.total_steps=4", *LORA))
    assert resumed.step == 2
    resumed.fit()
    assert_same_params(straight.c.policy.model, resumed.c.policy.model)
    assert [r["step"] for r in metrics_of(tmp_path / "b" / "toy_grpo")] == [1, 2, 3, 4]


def test_export_of_a_lora_checkpoint_merges(tmp_path: Path, model_cache: Path) -> None:
    from transformers import AutoModelForCausalLM

    trainer = Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=1", "model.lora.rank=4"))
    trainer.fit()
    out = export_checkpoint(tmp_path / "toy_grpo", tmp_path / "merged")
    assert (out / "model.safetensors").is_file()
    assert not (out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    policy = trainer.c.policy.model.eval()
    ids = torch.tensor([[5, 9, 17, 33, 2, 41]])
    with torch.no_grad():
        expected = policy(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("save_last", "expected"), [("true", ["step_2", "step_3"]), ("false", ["step_2"])])
def test_save_last_controls_the_checkpoint_at_the_last_step(
    tmp_path: Path, model_cache: Path, save_last: str, expected: list[str]
) -> None:
    cfg = make_cfg(
        tmp_path, model_cache, "trainer.total_steps=3", "trainer.save_every=2", f"trainer.save_last={save_last}"
    )
    Trainer(cfg).fit()
    assert [p.name for p in checkpoint_dirs(tmp_path / "toy_grpo" / "checkpoints")] == expected


def test_an_interrupted_run_saves_even_without_save_last(tmp_path: Path, model_cache: Path) -> None:
    """``fit(max_steps=...)`` stops early to be resumed: it checkpoints whatever save_last says."""
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=3", "trainer.save_last=false")).fit(max_steps=1)
    assert [p.name for p in checkpoint_dirs(tmp_path / "toy_grpo" / "checkpoints")] == ["step_1"]


def test_checkpoint_size_is_logged_and_a_metric(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = make_cfg(
        tmp_path, model_cache, "trainer.total_steps=2", "trainer.save_every=1", "trainer.logger=[console,jsonl]"
    )
    Trainer(cfg).fit()
    run = tmp_path / "toy_grpo"
    rows = metrics_of(run)
    step2 = run / "checkpoints" / "step_2"
    total = sum(f.stat().st_size for f in step2.rglob("*") if f.is_file()) / 1e6
    assert [r["step"] for r in rows if r["checkpoint/size_mb"] > 0] == [1, 2]
    assert rows[1]["checkpoint/size_mb"] == pytest.approx(total, rel=1e-9)
    out = capsys.readouterr().out
    assert f"checkpoint {step2}: {total:.1f} MB (actor " in out
    assert json.loads((step2 / "state.json").read_text())["step"] == 2
