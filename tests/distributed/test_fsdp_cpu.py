"""FSDP on CPU: two Ray workers (gloo) shard the policy with torch's FSDP2 (``ray.fsdp_on_cpu``).

The parity test is the Ray parity test of :mod:`tests.distributed.test_ray` with the workers'
modules sharded: ``ray.rollout=driver`` makes both backends sample the same responses, so equal
parameters after the steps test FSDP's sharded path: forward and backward on gathered weights,
gradients reduce-scattered over the ranks (scaled from FSDP's average to the normaliser's sum),
the gradient norm clipped over the shards (the clip threshold is set below the gradient norms,
so every step clips), AdamW over the shards, and the full weights and optimizer state gathered
back to the driver. A gradient left unreduced, averaged instead of summed, or clipped by one
shard's norm changes the reported gradient norms or the parameters beyond the tolerance.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("ray", reason="Ray is not installed (pip install 'queryrl[ray]'): the ray tests are skipped")

from queryrl.distributed.ray_group import RayWorkers
from queryrl.trainer.loop import Trainer
from tests.distributed.helpers import COMMON
from tests.helpers import make_cfg

pytestmark = [pytest.mark.ray, pytest.mark.slow]

FSDP = ("trainer.backend=ray", "trainer.n_gpus_per_node=2", "ray.fsdp=true", "ray.fsdp_on_cpu=true")
CLIP = "actor.grad_clip=0.05"  # far below every step's gradient norm (above 1): every step clips


def _train(out: Path, model_cache: Path, *overrides: str) -> dict[str, Any]:
    """Train; the end parameters, the driver's optimizer state (rank 0's, pulled), the workers' facts."""
    cfg = make_cfg(out, model_cache, *COMMON, CLIP, *overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Trainer(cfg) as trainer:
            c = trainer.c
            start = {k: v.detach().clone() for k, v in c.policy.model.named_parameters()}
            trainer.fit()
            workers = c.workers
            if isinstance(workers, RayWorkers):
                workers.pull_state(c)  # what a checkpoint does: the gathered weights and AdamW state
            result = {
                "start": start,
                "end": {k: v.detach().clone() for k, v in c.policy.model.named_parameters()},
                "exp_avg_sq": [s["exp_avg_sq"].clone() for s in c.optimizer.state_dict()["state"].values()],
                "info": workers.group.info if isinstance(workers, RayWorkers) else None,
                "checksums": workers.checksums() if isinstance(workers, RayWorkers) else None,
            }
    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    result["grad_norms"] = [json.loads(line)["actor/grad_norm"] for line in lines]
    return result


@pytest.mark.timeout(600)
def test_two_fsdp_cpu_workers_end_with_the_parameters_of_the_local_backend(tmp_path: Path, model_cache: Path) -> None:
    local = _train(tmp_path / "local", model_cache, "trainer.backend=local")
    fsdp = _train(tmp_path / "fsdp", model_cache, *FSDP, "ray.rollout=driver")
    info = fsdp["info"]
    assert [(i["backend"], i["fsdp"]) for i in info] == [("gloo", True), ("gloo", True)]
    assert fsdp["checksums"][0] == fsdp["checksums"][1]
    print(f"grad norms: local {local['grad_norms']}, fsdp {fsdp['grad_norms']}")
    assert min(local["grad_norms"]) > 0.05 * 1.5  # the clip was active on every step
    # a gradient not reduced over the ranks, averaged instead of summed, or clipped per shard differs here
    assert fsdp["grad_norms"] == pytest.approx(local["grad_norms"], rel=1e-4)
    moved = max((local["end"][k] - local["start"][k]).abs().max().item() for k in local["end"])
    diff = max((local["end"][k] - fsdp["end"][k]).abs().max().item() for k in local["end"])
    print(f"max |param change| {moved:.3e}, max |local - fsdp| {diff:.3e}")
    assert moved > 5e-3  # the steps changed the parameters well beyond the tolerance
    assert diff < 1e-3
    # the AdamW state gathered from the shards (for checkpoints) is the local optimizer's
    assert len(fsdp["exp_avg_sq"]) == len(local["exp_avg_sq"])
    for a, b in zip(local["exp_avg_sq"], fsdp["exp_avg_sq"], strict=True):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-9)


def _run(out: Path, model_cache: Path, max_steps: int | None, *overrides: str) -> tuple[dict[str, torch.Tensor], int]:
    """Train (or resume) up to `max_steps`; the driver's end parameters and the step it started from."""
    cfg = make_cfg(out, model_cache, *COMMON, *FSDP, *overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Trainer(cfg) as trainer:
            start = trainer.step
            trainer.fit(max_steps=max_steps)
            assert isinstance(trainer.c.workers, RayWorkers)
            checksums = trainer.c.workers.checksums()
            assert checksums[0] == checksums[1]
            return {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters()}, start


@pytest.mark.timeout(600)
def test_fsdp_cpu_worker_rollouts_are_on_policy_and_a_resumed_run_ends_where_the_whole_run_does(
    tmp_path: Path, model_cache: Path
) -> None:
    """Rollouts in the FSDP workers, 2 steps, against 1 step + resume (the driver's checkpoint loaded into the
    shards) + 1: the resumed step needs the checkpoint's weights, AdamW state and data position. One block of 4
    prompts per step (``rollout.micro_batch_size=16``): rank 0 generates, rank 1 gets an empty block, so the ranks
    run different numbers of forward passes on the gathered weights."""
    run = ("trainer.total_steps=2", "trainer.save_every=1", "rollout.micro_batch_size=16")
    whole, _ = _run(tmp_path / "whole", model_cache, None, *run)
    metrics = [
        json.loads(line) for line in (tmp_path / "whole" / "toy_grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == [1, 2]
    # the workers sampled with the weights they train: on-policy up to float noise
    assert max(m["training/rollout_probs_diff_max"] for m in metrics) < 1e-4
    half, first = _run(tmp_path / "resumed", model_cache, 1, *run)
    resumed, start = _run(tmp_path / "resumed", model_cache, None, *run, "trainer.resume=auto")
    assert (first, start) == (0, 1)
    moved = max((whole[k] - half[k]).abs().max().item() for k in whole)
    diff = max((whole[k] - resumed[k]).abs().max().item() for k in whole)
    print(f"max |param change in step 2| {moved:.3e}, max |whole - resumed| {diff:.3e}")
    assert moved > 1e-3  # the resumed step had work to do
    assert diff < 1e-6


LORA = ("model.lora.rank=4", "model.lora.alpha=8", "model.lora.target_modules=[q_proj,v_proj,up_proj]")


def _export_weights(run_dir: Path, out: Path) -> dict[str, torch.Tensor]:
    """The merged weights `queryrl export` writes for the run's latest checkpoint."""
    from safetensors.torch import load_file

    from queryrl.trainer.export import export_checkpoint

    export_checkpoint(run_dir, out)
    return load_file(out / "model.safetensors")


@pytest.mark.timeout(900)
def test_fsdp_lora_checkpoints_and_export_equal_the_local_backends(tmp_path: Path, model_cache: Path) -> None:
    """The users' configuration (LoRA under FSDP2) against the local backend on the same rollouts
    (``ray.rollout=driver``). The FSDP run's checkpoint holds what its workers hold, and its export is the merged
    model of those adapters to 1e-6; the two runs' adapters, AdamW states and exports agree up to the float
    noise of summing gradients in another order (relative to how far the adapters moved)."""
    from queryrl.distributed.worker import load_trainable_state
    from queryrl.models import load_policy
    from queryrl.rollout.sync import rollout_weights
    from queryrl.trainer.checkpoint import latest_checkpoint, load_model_weights

    run = (*LORA, "trainer.save_every=2", "actor.lr=2e-2")
    local = _train(tmp_path / "local", model_cache, "trainer.backend=local", *run)
    fsdp = _train(tmp_path / "fsdp", model_cache, *FSDP, "ray.rollout=driver", *run)
    adapters = [k for k in local["end"] if "lora_" in k]
    moved = max((local["end"][k] - local["start"][k]).abs().max().item() for k in adapters)
    diff = max((local["end"][k] - fsdp["end"][k]).abs().max().item() for k in local["end"])
    print(f"LoRA: max |adapter change| {moved:.3e}, max |local - fsdp| {diff:.3e}")
    assert moved > 1e-3
    assert diff < 1e-3 * moved
    for a, b in zip(local["exp_avg_sq"], fsdp["exp_avg_sq"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-12)

    cfg = make_cfg(tmp_path / "fsdp", model_cache, *run)
    policy = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False).model
    load_model_weights(policy, latest_checkpoint(tmp_path / "fsdp" / "toy_grpo" / "checkpoints") / "actor")
    saved = {k: v for k, v in policy.named_parameters() if v.requires_grad}
    assert all(torch.equal(saved[k], fsdp["end"][k]) for k in adapters)  # the checkpoint is the workers' state
    load_trainable_state(policy, {k: fsdp["end"][k] for k in adapters})
    merged = dict(rollout_weights(policy))
    exported = {
        name: _export_weights(tmp_path / name / "toy_grpo", tmp_path / f"{name}-export") for name in ("local", "fsdp")
    }
    assert max((exported["fsdp"][k] - merged[k]).abs().max().item() for k in exported["fsdp"]) < 1e-6
    worst = max((exported["local"][k] - exported["fsdp"][k]).abs().max().item() for k in exported["local"])
    print(f"exported merged weights: max |local - fsdp| {worst:.3e}")
    assert worst < 1e-3 * moved


@pytest.mark.timeout(900)
def test_fsdp_lora_workers_generate_with_vllm_on_policy_after_every_sync(
    tmp_path: Path, model_cache: Path, fake_vllm: Any
) -> None:
    """Each FSDP worker runs its own engine (the vLLM stand-in, loading weights as vLLM does) and syncs it after
    every update: the engine's log-probs of the tokens it sampled equal the trainer's recomputed ones (a stale
    or corrupted sync shows up here), and the workers' shards stay in step."""
    cfg = make_cfg(
        tmp_path, model_cache, *COMMON, *FSDP, *LORA, "rollout.backend=vllm", "trainer.total_steps=3", "actor.lr=2e-2"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Trainer(cfg) as trainer:
            trainer.fit()
            assert isinstance(trainer.c.workers, RayWorkers)
            checksums = trainer.c.workers.checksums()
    assert checksums[0] == checksums[1]
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    print([r["training/rollout_probs_diff_max"] for r in rows])
    assert max(r["training/rollout_probs_diff_max"] for r in rows) < 1e-4
