"""`make gpu-check` stays runnable: its script on CPU (``--smoke``: gloo, tiny sizes), every check passing.

On a GPU machine the same code runs at full size (docs/gpus.md, GPU check); here it proves the checks are
wired (the worker joins a group and shards with FSDP2, the stand-in engine takes the weights, the
GRPO steps run with the worker generating, the LoRA step's memory check computes a finite loss).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_check import CHECKS  # benchmarks/ is on the tests' path (pyproject.toml)
from gpu_compare import PROJECTIONS, QWEN3_8B, step_flops
from gpu_trl import SKIPPED, prompt_texts

from queryrl.trainer.plan import ModelShape, count_lora_parameters, count_parameters

REPO = Path(__file__).resolve().parents[2]
HAS_TRL = all(importlib.util.find_spec(p) is not None for p in ("trl", "datasets"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_check_smoke_runs_every_check(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--smoke", "--steps", "2", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    # without TRL (make gpu-wheels carries it to a GPU; the dev install has none) its check alone fails, by name
    assert proc.returncode == (0 if HAS_TRL else 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    # the workers' optimizers step, the driver's scheduler only sets their rate: no torch warning about it
    assert "Detected call of `lr_scheduler.step()`" not in proc.stderr
    report = json.loads(out.read_text())
    assert report["ok"] == HAS_TRL
    assert report["finished"]
    assert report["smoke"]
    assert [name for name in CHECKS if not report[name]["ok"]] == ([] if HAS_TRL else ["trl_step"])
    if not HAS_TRL:
        assert report["trl_step"]["skipped"] == SKIPPED
    graph = report["decode_graph"]
    assert graph["float32"]["rows_with_equal_greedy_tokens"] == graph["float32"]["prompts"] == 4
    for rows in (2, 4):
        assert all(graph[f"rows_{rows}"][path]["tokens_per_s"] > 0 for path in ("graph", "fast", "generate"))
    assert report["matmul_rate"]["tflops"] > 0
    assert report["memory_8b"]["measured_matmul_rate"] == {k: v for k, v in report["matmul_rate"].items()
                                                         if k not in ("ok", "wall_s")}  # fmt: skip
    assert len(report["memory_8b"]["warm_steps_s"]) == 2
    assert report["memory_8b"]["share_of_measured_matmul_rate"] > 0
    assert report["decode"]["float32"]["rows_with_equal_greedy_tokens"] == report["decode"]["float32"]["prompts"]
    assert report["decode"]["float32"]["fast"]["tokens_per_s"] > 0
    assert report["grpo"]["worker"]["fsdp"] is True
    assert [s["step"] for s in report["grpo"]["steps"]] == [1, 2]
    assert report["grpo"]["merged_weights_vs_checkpoint_max_diff"] < 1e-6
    variants = [k for k in report["sync"] if k not in ("ok", "wall_s")]
    assert len(variants) == 1  # --smoke: one; tests/distributed/test_fsdp_sync.py runs them all
    for name in variants:
        assert [c["stage"] for c in report["sync"][name]["checks"]] == [
            "start-up",
            "after an optimizer step",
            "after a checkpoint load",
        ]
    assert report["memory_8b"]["sequences"] == 40  # the 2-GPU preset's 8 prompts x 5 samples


def test_gpu_check_refuses_without_a_gpu_unless_smoke() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "gpu-check needs a CUDA GPU (none is visible); --smoke runs it on CPU" in proc.stderr


def test_the_step_flops_count_the_weights_plan_counts() -> None:
    """step_flops' weights per token (from its total with attention and the head taken out) are the model's
    parameters less the embeddings, the lm_head and the norms, and its LoRA weights are plan's count."""
    n, p, t, rank = 40, 1024, 256, 64
    shape = ModelShape.from_hf_config({**QWEN3_8B, "model_type": "qwen3"})
    flops = step_flops(QWEN3_8B, rank, n, p, t)
    e, layers, vocab = QWEN3_8B["hidden_size"], QWEN3_8B["num_hidden_layers"], QWEN3_8B["vocab_size"]
    norms = layers * (2 * e + 2 * QWEN3_8B["head_dim"]) + e
    weights = count_parameters(shape) - 2 * vocab * e - norms
    lora = count_lora_parameters(shape, rank, PROJECTIONS)
    m, h = n * (p + t), n * (t + 1)
    attention = layers * 4 * QWEN3_8B["num_attention_heads"] * QWEN3_8B["head_dim"] * (p + t + 1) / 2
    assert flops["total"] == pytest.approx((8 * weights + 8 * lora + 5 * attention) * m + 6 * vocab * e * h)
    assert flops["lora_backward"] == pytest.approx(4 * lora * m)
    assert flops["reference_forward"] == pytest.approx(2 * weights * m + attention * m + 2 * vocab * e * h)


def test_trl_prompts_have_the_exact_length(tiny_bundle: Any) -> None:
    texts = prompt_texts(tiny_bundle.tokenizer, 3, 40)
    assert len(set(texts)) == 3
    assert [len(tiny_bundle.tokenizer(x, add_special_tokens=False)["input_ids"]) for x in texts] == [40, 40, 40]
