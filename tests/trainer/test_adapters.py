"""LoRA adapters written for publishing: ``queryrl sft``'s ``adapter/`` beside the merged model, and
``queryrl export RUN OUT --adapter-only``: bf16 safetensors, an adapter config naming the base by its folder's
name, and the same model once merged."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.config import load_config
from queryrl.models.adapters import adapter_problem, extract_adapter, load_with_adapters
from queryrl.models.loading import resolve_model_path
from queryrl.trainer.loop import Trainer
from queryrl.trainer.manifest import write_manifest
from tests.helpers import make_cfg

TARGET = "hello world"
PROMPTS = ["Say hello.", "Greet the world.", "What do you say?", "Reply please."]


def _sft_rows(path: Path) -> Path:
    rows = [
        {"data_source": "t/sft", "prompt": [{"role": "user", "content": p}], "extra_info": {"sft_target": TARGET}}
        for p in PROMPTS
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_with_lora_writes_the_bf16_adapter_beside_the_merged_model(tmp_path: Path, model_cache: Path) -> None:
    from transformers import AutoModelForCausalLM

    data = _sft_rows(tmp_path / "train.jsonl")
    args = ["sft", f"model.cache_dir={model_cache}", f"sft.train_files=[{data}]", f"sft.output_dir={tmp_path / 'out'}"]
    args += [f"trainer.output_dir={tmp_path}", "trainer.logger=[jsonl]", "sft.max_steps=3", "sft.lr=1e-2"]
    args += ["sft.batch_size=4", "sft.micro_batch_size=4", "model.lora.rank=4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out, adapter = tmp_path / "out", tmp_path / "out" / "adapter"
    tensors = load_file(adapter / "adapter_model.safetensors")
    assert tensors
    assert all("lora_" in k for k in tensors)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    config = json.loads((adapter / "adapter_config.json").read_text())
    base = resolve_model_path(load_config(None, [f"model.cache_dir={model_cache}"]).model)
    assert config["base_model_name_or_path"] == base.name  # the folder's name, no path of this machine
    assert config["r"] == 4
    assert adapter_problem(adapter, base) is None

    # base + the adapter, merged in float32, is the merged model up to the adapter's bf16 rounding
    merged = AutoModelForCausalLM.from_pretrained(out).state_dict()
    rebuilt = load_with_adapters(base, [adapter], torch.float32).state_dict()
    original = AutoModelForCausalLM.from_pretrained(base).state_dict()
    changed = [k for k in merged if not torch.equal(merged[k], original[k])]
    assert changed
    for k in merged:
        torch.testing.assert_close(rebuilt[k], merged[k], atol=2e-4, rtol=0, msg=k)

    # a merged folder without its adapter/: the adapter recovered from the difference (rank 4, SVD) rebuilds it too
    targets = list(load_config(None, []).model.lora.target_modules)
    extracted = extract_adapter(base, out, tmp_path / "extracted", 4, targets)
    assert adapter_problem(extracted, base) is None
    config = json.loads((extracted / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 4, base.name)
    assert {t.dtype for t in load_file(extracted / "adapter_model.safetensors").values()} == {torch.bfloat16}
    recovered = load_with_adapters(base, [extracted], torch.float32).state_dict()
    for k in merged:
        torch.testing.assert_close(recovered[k], merged[k], atol=2e-4, rtol=0, msg=k)


def test_export_adapter_only_writes_the_runs_adapter_in_bf16(tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=1", "model.lora.rank=4")).fit()
    step = tmp_path / "toy_grpo" / "checkpoints" / "step_1"
    out = tmp_path / "adapter"
    result = CliRunner().invoke(app, ["export", str(tmp_path / "toy_grpo"), str(out), "--adapter-only"])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    trained = load_file(step / "actor" / "adapter_model.safetensors")
    written = load_file(out / "adapter_model.safetensors")
    assert written.keys() == trained.keys()
    for k, v in written.items():
        assert v.dtype == torch.bfloat16
        torch.testing.assert_close(v, trained[k].to(torch.bfloat16), atol=0, rtol=0, msg=k)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == Path(config["base_model_name_or_path"]).name != ""
    assert not list(out.glob("model*.safetensors"))

    again = CliRunner().invoke(app, ["export", str(step), str(out), "--adapter-only"])
    assert again.exit_code == 2
    assert "already exists" in again.output
    assert "Traceback" not in again.output


def test_export_adapter_only_of_a_full_model_checkpoint_is_one_clear_line(tmp_path: Path) -> None:
    step = tmp_path / "run" / "checkpoints" / "step_3"
    (step / "actor").mkdir(parents=True)
    (step / "state.json").write_text(json.dumps({"step": 3, "config": {"model": {"path": None}}}))
    (step / "actor" / "model.safetensors").write_bytes(b"")
    for name in ("optim.pt", "rng.pt"):  # an intact checkpoint otherwise: its manifest vouches for every file
        (step / name).write_bytes(b"")
    write_manifest(step)
    result = CliRunner().invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "a"), "--adapter-only"])
    assert result.exit_code == 2
    assert "holds no LoRA adapter" in result.output
    assert "without --adapter-only" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()
