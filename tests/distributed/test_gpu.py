"""trainer.backend=ray on a GPU: one NCCL worker with FSDP (marked gpu: skipped without CUDA)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.gpu
def test_one_gpu_ray_run_with_fsdp(tmp_path: Any, model_cache: Any) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'queryrl[ray]')")
    from queryrl.trainer.loop import Trainer
    from tests.trainer.test_loop import make_cfg

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
