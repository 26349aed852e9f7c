"""Dispatch/collect, resource-pool checks and the Ray-less paths (no Ray needed)."""

from __future__ import annotations

import sys

import pytest
import torch
from omegaconf import OmegaConf

from queryrl.config import ConfigError, load_config
from queryrl.distributed import collect, dispatch, shard_ranges
from queryrl.engine.batch import Batch


def _batch(n: int) -> Batch:
    return Batch(
        prompt_ids=torch.arange(n * 3).view(n, 3),
        prompt_mask=torch.ones(n, 3, dtype=torch.long),
        response_ids=torch.arange(n * 2).view(n, 2),
        response_attention_mask=torch.ones(n, 2, dtype=torch.long),
        response_mask=torch.ones(n, 2),
        group_ids=torch.arange(n),
        non_tensor={"row": [{"i": i} for i in range(n)]},
    )


@pytest.mark.parametrize(("rows", "world"), [(8, 2), (7, 2), (5, 3), (1, 2), (0, 2), (6, 1)])
def test_shards_cover_the_rows_in_order_and_balanced(rows: int, world: int) -> None:
    ranges = shard_ranges(rows, world)
    assert len(ranges) == world
    assert [i for r in ranges for i in r] == list(range(rows))
    sizes = [len(r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_dispatch_then_collect_gives_back_the_batch_order() -> None:
    batch = _batch(7)
    shards = dispatch(batch, 3)
    assert [len(s) for s in shards] == [3, 2, 2]
    assert all(s.non_tensor == {} for s in shards)  # workers get tensors only
    assert torch.equal(collect([s.prompt_ids for s in shards]), batch.prompt_ids)


def test_world_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="world_size"):
        shard_ranges(4, 0)


def test_a_pool_larger_than_the_cluster_is_a_clear_error() -> None:
    from queryrl.distributed.worker_group import ResourcePool

    pool = ResourcePool(nnodes=2, workers_per_node=4, use_gpu=True, cpus_per_worker=1.0)
    assert pool.world_size == 8
    assert pool.bundles()[0] == {"CPU": 1.0, "GPU": 1.0}
    with pytest.raises(RuntimeError, match=r"has 16 CPUs and 4 GPUs left.*actor worker pool.*needs 8 CPUs.*and 8 GPUs"):
        pool.check({"CPU": 16.0, "GPU": 4.0})
    actor = ResourcePool(1, 2, use_gpu=False, cpus_per_worker=1.0)
    actor.check({"CPU": 2.0})
    # pools are checked one after the other against what the previous ones leave
    ref = ResourcePool(1, 1, False, 1.0, name="ref", sized_by="ray.ref_workers=1")
    with pytest.raises(RuntimeError, match=r"has 0 CPUs and 0 GPUs left; the ref worker pool \(ray.ref_workers=1\)"):
        ref.check(actor.take({"CPU": 2.0}))
    ref.check(actor.take({"CPU": 3.0}))


def test_without_ray_the_ray_backend_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from queryrl.distributed.worker_group import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'queryrl\[ray\]'"):
        import_ray()


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("ray.placement_strategy=NEAR", "ray.placement_strategy"),
        ("ray.use_gpu=maybe", "ray.use_gpu"),
        ("ray.num_cpus_per_worker=0", "ray.num_cpus_per_worker"),
        ("trainer.nnodes=0", "trainer.nnodes"),
        ("ray.rollout=gpu", "ray.rollout"),
        ("ray.ref_workers=-1", "ray.ref_workers"),
        ("ray.critic_workers=-2", "ray.critic_workers"),
    ],
)
def test_ray_settings_are_validated(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_ray_defaults_start_a_local_cluster() -> None:
    cfg = load_config(None, ["trainer.backend=ray"])
    assert cfg.ray.address == ""  # "" = a local cluster started for the run
    assert OmegaConf.select(cfg, "ray.use_gpu") == "auto"
    assert (cfg.ray.rollout, cfg.ray.ref_workers, cfg.ray.critic_workers) == ("workers", 0, 0)
