"""benchmarks/real_model.py's published adapters: ``work/adapters/warmup`` and ``work/adapters/grpo`` (bf16), written
after GRPO and recorded in the bench JSON; ``--write-adapters WORK`` on an earlier run's folder, whose warm-up
folder may predate ``adapter/`` (the adapter is then recovered from the merged weights)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import real_model as bench  # benchmarks/real_model.py (benchmarks/ is on the tests' path: pyproject.toml)
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.config import load_config
from queryrl.models.adapters import load_with_adapters
from queryrl.models.loading import resolve_model_path
from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg


def _work(tmp_path: Path, model_cache: Path) -> tuple[Path, Path]:
    """A bench work folder in miniature: ``warmup/`` (SFT with LoRA, merged, with adapter/) and ``grpo_run/``
    (GRPO with a new LoRA from it); and the base model."""
    base = resolve_model_path(load_config(None, [f"model.cache_dir={model_cache}"]).model)
    work = tmp_path / "work"
    rows = tmp_path / "sft.jsonl"
    row = {"data_source": "t/sft", "prompt": [{"role": "user", "content": "Say hello."}]}
    rows.write_text(json.dumps(row | {"extra_info": {"sft_target": "hello world"}}) + "\n")
    args = ["sft", f"model.path={base}", f"sft.train_files=[{rows}]", f"sft.output_dir={work / 'warmup'}"]
    args += [f"trainer.output_dir={tmp_path}", "trainer.logger=[jsonl]", "sft.max_steps=2", "sft.lr=1e-2"]
    args += ["sft.batch_size=1", "sft.micro_batch_size=1", "model.lora.rank=4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    grpo = ("trainer.total_steps=1", "model.lora.rank=4", f"model.path={work / 'warmup'}")
    Trainer(make_cfg(work, model_cache, *grpo, "trainer.experiment_name=grpo_run")).fit()
    return work, base


def test_the_run_publishes_its_two_adapters_and_an_old_run_gets_them_too(tmp_path: Path, model_cache: Path) -> None:
    work, base = _work(tmp_path, model_cache)
    records = bench.write_adapters(work)
    assert set(records) == {"warmup", "grpo"}
    for name, record in records.items():
        folder = work / "adapters" / name
        assert record["path"] == str(folder)
        assert sorted(record["files"]) == ["adapter_config.json", "adapter_model.safetensors"]
        assert record["size_mb"] == round(sum(f.stat().st_size for f in folder.iterdir()) / 2**20, 3)
        assert {t.dtype for t in load_file(folder / "adapter_model.safetensors").values()} == {torch.bfloat16}
    assert records["warmup"]["base_model_name_or_path"] == base.name
    assert records["grpo"]["base_model_name_or_path"] == "warmup"  # it goes on the merged warm-up model
    assert records["warmup"]["source"].endswith("(queryrl sft)")

    # an earlier run's folder, its warm-up written before sft kept adapter/: recovered, and recorded in its JSON
    shutil.rmtree(work / "warmup" / "adapter")
    out = tmp_path / "real_model_tiny.json"
    out.write_text(json.dumps({"final_eval": {"grpo": {"recall@5": 0.5}}}))
    assert bench.main(["--write-adapters", str(work), "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["final_eval"] == {"grpo": {"recall@5": 0.5}}
    assert saved["adapters"]["warmup"]["source"].startswith(f"recovered from {work / 'warmup'}")
    assert saved["adapters"]["warmup"]["r"] == 4
    warm = work / "adapters" / "warmup"
    merged = AutoModelForCausalLM.from_pretrained(work / "warmup").state_dict()
    rebuilt = load_with_adapters(base, [warm], torch.float32).state_dict()
    for k in merged:
        torch.testing.assert_close(rebuilt[k], merged[k], atol=2e-4, rtol=0, msg=k)
