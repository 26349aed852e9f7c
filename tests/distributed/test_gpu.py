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


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize(
    "precision", [("model.dtype=float32", "model.compute_dtype=bfloat16"), ("model.dtype=bfloat16",)], ids=str
)
def test_fsdp_nccl_lora_sync_hands_merged_weights_and_keeps_the_shards(
    tmp_path: Any, model_cache: Any, tiny_bundle: Any, precision: tuple[str, ...]
) -> None:
    """The two bugs this caught on CPU, on a GPU: DTensor shards handed to the engine (its loader copies
    into full-size parameters) and LoRA unmerged from the shards (the trainer's weights moved at each sync)."""
    import json
    import socket

    import torch.multiprocessing as mp
    from omegaconf import OmegaConf

    from tests.distributed.fsdp_ranks import rank_main
    from tests.helpers import FAKE_VLLM, make_cfg

    lora = ("model.lora.rank=4", "model.lora.alpha=8", "model.lora.target_modules=[q_proj,v_proj,up_proj]")
    cfg = make_cfg(tmp_path, model_cache, "ray.fsdp=true", "rollout.backend=vllm", *lora, *precision)
    out = tmp_path / "result.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runs = [(port, OmegaConf.to_container(cfg, resolve=True), str(out))]
    mp.spawn(rank_main, args=(1, runs, str(FAKE_VLLM)), nprocs=1)
    checks = json.loads(out.read_text())["checks"]
    for row in checks:
        assert row["changed_by_sync"] == [], row
        assert row["engine_diff"] < 2**-7, row


@pytest.mark.gpu
@pytest.mark.slow
def test_one_gpu_ray_run_with_lora_fsdp_and_vllm_in_bf16(tmp_path: Any, model_cache: Any) -> None:
    """The preset's combination at one GPU: LoRA over a bf16 base, FSDP2, vLLM rollouts in the worker."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'queryrl[gpu]')")
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'queryrl[gpu]')")
    from queryrl.trainer.loop import Trainer
    from tests.helpers import make_cfg, metrics_of

    cfg = make_cfg(
        tmp_path,
        model_cache,
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=1",
        "ray.use_gpu=true",
        "ray.fsdp=true",
        "rollout.backend=vllm",
        "model.dtype=bfloat16",
        "model.lora.rank=8",
        "model.lora.alpha=16",
        "actor.ppo_mini_batch_size=2",
        "actor.use_kl_loss=true",
        "trainer.total_steps=3",
    )
    with Trainer(cfg) as trainer:
        trainer.fit()
        checksums = trainer.c.workers.checksums()
        trainer.c.workers.sync_rollout()  # a sync never changes the trainer's weights
        assert trainer.c.workers.checksums() == checksums
    rows = metrics_of(trainer.run_dir)
    assert all(r["actor/kl_loss"] == r["actor/kl_loss"] for r in rows)  # finite, not NaN
    assert max(r["training/rollout_probs_diff_mean"] for r in rows) < 1e-2
