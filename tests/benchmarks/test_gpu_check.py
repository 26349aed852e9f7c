"""`make gpu-check` stays runnable: its script on CPU (``--smoke``: gloo, tiny sizes), every check passing.

On a GPU machine the same code runs at full size (docs/gpus.md, GPU check); here it proves the checks are
wired (the worker joins a group and shards with FSDP2, the stand-in engine takes the weights, the
GRPO steps run with the worker generating, the LoRA step's memory check computes a finite loss).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the workers' optimizers step, the driver's scheduler only sets their rate: no torch warning about it
    assert "Detected call of `lr_scheduler.step()`" not in proc.stderr
    report = json.loads(out.read_text())
    assert report["ok"]
    assert report["smoke"]
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
