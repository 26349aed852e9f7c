"""The command line, end to end on the tiny model: train, prepare, export, plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from queryrl.cli import app

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
runner = CliRunner()


def small(tmp_path: Path, model_cache: Path) -> list[str]:
    return [
        f"trainer.output_dir={tmp_path}",
        f"model.cache_dir={model_cache}",
        "trainer.logger=[console,jsonl]",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "rollout.n=2",
        "data.max_val_samples=4",
    ]


@pytest.mark.slow
def test_train_export_plot(tmp_path: Path, model_cache: Path) -> None:
    args = [
        "train",
        "--config",
        str(REPO / "configs" / "toy_grpo.yaml"),
        *small(tmp_path, model_cache),
        "trainer.total_steps=2",
        "model.lora.rank=4",
        "trainer.eval_every=1",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    run = tmp_path / "toy_grpo"
    assert "step 2/2" in result.output
    assert "done:" in result.output
    assert {p.name for p in (run / "plots").glob("*.png")} >= {"reward.png", "validation.png"}
    machine = json.loads((run / "machine.json").read_text(encoding="utf-8"))  # what the run ran on, said once
    assert machine["matmul_gflops"]["float32"] > 0
    assert result.output.count(f"machine: {machine['cpu']}, {machine['capability']}, ") == 1

    out = tmp_path / "exported"
    result = runner.invoke(app, ["export", str(run / "checkpoints" / "step_2"), str(out)])
    assert result.exit_code == 0, result.output
    from transformers import AutoModelForCausalLM

    from queryrl.config import load_config
    from queryrl.models import load_policy
    from queryrl.trainer.checkpoint import load_model_weights

    exported = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in k for k in exported.state_dict()), "LoRA must be merged"
    cfg = load_config(None, [f"model.cache_dir={model_cache}", "model.lora.rank=4"])
    bundle = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False)
    load_model_weights(bundle.model, run / "checkpoints" / "step_2" / "actor")
    ids = torch.tensor([[5, 17, 33, 60, 2]])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, bundle.model(ids).logits, atol=1e-5, rtol=1e-4)

    result = runner.invoke(app, ["export", str(run / "checkpoints" / "step_2"), str(out)])
    assert result.exit_code == 2
    assert "already exists" in result.output

    (run / "plots" / "reward.png").unlink()
    result = runner.invoke(app, ["plot", str(run)])
    assert result.exit_code == 0
    assert (run / "plots" / "reward.png").is_file()


def test_train_rejects_an_unknown_key(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "actor.learning_rate=1e-6"])
    assert result.exit_code == 2
    assert "learning_rate" in result.output


@pytest.mark.skipif(not GSM8K.is_file(), reason=f"GSM8K data not found at {GSM8K} (../shared/data beside the repo)")
def test_prepare_gsm8k_and_train_the_gsm8k_preset_one_step(tmp_path: Path, model_cache: Path) -> None:
    sample = tmp_path / "test.jsonl"
    sample.write_text("".join(GSM8K.read_text().splitlines(keepends=True)[:12]))
    result = runner.invoke(app, ["prepare", "gsm8k", "--input", str(sample), "--out", str(tmp_path / "gsm8k")])
    assert result.exit_code == 0, result.output
    parquet = tmp_path / "gsm8k" / "test.parquet"
    args = [
        "train",
        "--config",
        str(REPO / "configs" / "gsm8k_grpo.yaml"),
        *small(tmp_path, model_cache),
        f"data.train_files=[{parquet}]",
        f"data.val_files=[{parquet}]",
        "data.max_response_length=8",
        "model.dtype=float32",
        "trainer.total_steps=1",
        "trainer.logger=[jsonl]",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (tmp_path / "gsm8k_grpo" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["reward/failed"] == 0
    assert "val/openai/gsm8k/score/mean" in rows[-1]
    assert "actor/kl_loss" in rows[-1]


def test_prepare_gsm8k_reports_a_bad_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a #### 1"}\n{not json}\n')
    result = runner.invoke(app, ["prepare", "gsm8k", "--input", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "bad.jsonl" in result.output
    assert "line 2" in result.output


@pytest.mark.slow
def test_serve_judge_runs_as_a_real_process_and_answers_the_official_sdk() -> None:
    import httpx

    from queryrl.rewards.judge import JudgeClient
    from tests.loopback import serve_judge_process

    with serve_judge_process("constant", startup_s=30) as url:
        models = httpx.get(f"{url}/models", timeout=5).json()
        assert models["data"]
        client = JudgeClient(url, model="judge", api_key_env=None, max_retries=0)
        result = client.judge_sync([{"role": "user", "content": "compare A and B"}])
        assert result.verdict is not None
        assert result.verdict["better"] == "same"


def test_train_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path, model_cache: Path) -> None:
    out = tmp_path / "runs"
    args = ["train", "--dry-run", "--config", str(REPO / "configs" / "toy_grpo.yaml"), f"trainer.output_dir={out}"]
    result = runner.invoke(app, [*args, f"model.cache_dir={model_cache}"])
    assert result.exit_code == 0, result.output
    for line in ("backend      local", "roles", "model        the built-in tiny Qwen2", "memory/GPU", "data/train"):
        assert line in result.output, line
    assert "builtin://toy_target_string/train: built in" in result.output
    assert f"output       {out / 'toy_grpo'} (new)" in result.output
    assert "problems     none" in result.output
    assert not out.exists()
    result = runner.invoke(app, [*args, "model.path=/nowhere/Qwen3-8B"])
    assert result.exit_code == 2
    assert "not found locally" in result.output


def test_sft_dry_run_prints_the_plan_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "sft"
    args = ["sft", "--dry-run", "--config", str(REPO / "configs" / "query_rewrite_demo.yaml"), f"sft.output_dir={out}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "queryrl sft --dry-run" in result.output
    assert "SFT: the policy only" in result.output
    assert f"output       {out} (new)" in result.output
    assert not out.exists()


def test_train_reports_every_bad_key_at_once_and_writes_nothing(tmp_path: Path) -> None:
    bad = [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.rollout.nn=5",
    ]
    result = runner.invoke(app, ["train", *bad, f"trainer.output_dir={tmp_path / 'runs'}"])
    assert result.exit_code == 2
    assert "3 problems in the config" in result.output
    assert "did you mean actor_rollout_ref.rollout.n" in result.output
    assert not (tmp_path / "runs").exists()


def test_a_bad_data_file_stops_the_run_before_its_folder_is_written(tmp_path: Path, model_cache: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no prompt column"}\n')
    args = [
        "train",
        "--config",
        str(REPO / "configs" / "toy_grpo.yaml"),
        f"model.cache_dir={model_cache}",
        f"data.train_files=[{bad}]",
        f"trainer.output_dir={tmp_path / 'runs'}",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "bad.jsonl" in result.output
    assert "prompt" in result.output
    assert not (tmp_path / "runs").exists(), "the run folder was written before the data loaded"
