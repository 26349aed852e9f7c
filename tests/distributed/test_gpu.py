"""trainer.backend=ray on a GPU: one NCCL worker with FSDP (marked gpu: skipped without CUDA)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.gpu
@pytest.mark.slow
def test_one_gpu_ray_run_with_fsdp(tmp_path: Any, model_cache: Any) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'queryrl[ray]')")
    from queryrl.trainer.loop import Trainer
    from tests.helpers import make_cfg

    cfg = make_cfg(
        tmp_path, model_cache, "trainer.backend=ray", "trainer.n_gpus_per_node=1", "ray.use_gpu=true", "ray.fsdp=true"
    )
    with Trainer(cfg) as trainer:
        before = {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters()}
        metrics = trainer.fit()
        assert trainer.c.workers.group.info[0]["backend"] == "nccl"
        moved = max((v - before[k]).abs().max().item() for k, v in trainer.c.policy.model.named_parameters())
    assert moved > 0  # the FSDP worker's update reached the driver's policy (weight sync)
    assert metrics["actor/grad_norm"] > 0


@pytest.mark.gpu
@pytest.mark.slow
def test_one_gpu_ray_run_with_vllm_rollouts_in_the_worker(tmp_path: Any, model_cache: Any) -> None:
    """The actor worker generates with vLLM (colocated, asleep while training) and pushes weights after updates."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'queryrl[ray]')")
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'queryrl[vllm]')")
    from queryrl.trainer.loop import Trainer
    from tests.helpers import make_cfg, metrics_of

    cfg = make_cfg(
        tmp_path,
        model_cache,
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=1",
        "ray.use_gpu=true",
        "rollout.backend=vllm",
        "actor.ppo_mini_batch_size=2",  # two mini-batches: the old log-probs (and the probs diff) are computed
        "trainer.total_steps=3",
    )
    with Trainer(cfg) as trainer:
        trainer.fit()
    rows = metrics_of(trainer.run_dir)
    for row in rows:
        tokens = row["response_length/mean"] * cfg.data.train_batch_size * cfg.rollout.n
        print(
            f"step {row['step']}: gen {row['timing_s/gen']:.3f}s ({tokens / row['timing_s/gen']:.0f} tokens/s), "
            f"step {row['timing_s/step']:.3f}s, probs diff mean {row['training/rollout_probs_diff_mean']:.2e} "
            f"max {row['training/rollout_probs_diff_max']:.2e}"
        )
    # vLLM samples with the weights the worker trains: after every update the probabilities still agree
    assert max(r["training/rollout_probs_diff_mean"] for r in rows) < 1e-2
