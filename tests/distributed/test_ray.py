"""trainer.backend=ray on CPU: two Ray workers (one CPU each, gloo) against the local backend.

What the parity test proves: generation, rewards and advantages run in the driver in both
backends (the driver's policy copy generates and receives rank 0's weights after every update),
so both runs sample the same responses; the log-probs (old and reference) and every optimizer
step are computed by the two workers on their halves of each mini-batch with the mini-batch's
global loss normaliser, and their gradients summed over a gloo process group. Equal parameters
after the steps therefore test the distributed compute and update path, not distributed sampling.
The tolerance is that of float re-ordering amplified by Adam: the local backend with a different
micro-batch size differs from itself by the same order (about 1e-4 after two steps).
"""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'queryrl[ray]'): the ray tests are skipped")

from queryrl.distributed.ray_group import RayWorkers, WorkerDiedError  # noqa: E402
from queryrl.trainer.loop import Trainer  # noqa: E402
from tests.trainer.test_loop import make_cfg  # noqa: E402

pytestmark = pytest.mark.ray

# two optimizer steps per training step (two mini-batches) so the old log-probs are computed too,
# and a KL loss so the reference log-probs are: every worker computation is on the path
COMMON = (
    "trainer.resume=disable",
    "actor.use_kl_loss=true",
    "actor.ppo_mini_batch_size=2",
    "ray.num_cpus_per_worker=1",
    "ray.num_threads=1",
)


def _grad_norms(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["actor/grad_norm"] for line in lines]


def _train(tmp_path: Path, model_cache: Path, *overrides: str) -> tuple[dict[str, torch.Tensor], Any, Path]:
    cfg = make_cfg(tmp_path, model_cache, *COMMON, *overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Trainer(cfg) as trainer:
            start = {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters()}
            trainer.fit()
            end = {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters()}
            checksums = trainer.c.workers.checksums() if trainer.c.workers is not None else None
            info = trainer.c.workers.group.info if trainer.c.workers is not None else None
        return {"start": start, "end": end}, (checksums, info), trainer.run_dir  # type: ignore[return-value]


@pytest.mark.timeout(600)
def test_two_ray_workers_end_with_the_parameters_of_the_local_backend(tmp_path: Path, model_cache: Path) -> None:
    local, _, local_dir = _train(tmp_path / "local", model_cache, "trainer.backend=local")
    t0 = time.perf_counter()
    dist, (checksums, info), ray_dir = _train(
        tmp_path / "ray", model_cache, "trainer.backend=ray", "trainer.n_gpus_per_node=2"
    )
    print(f"ray run: {time.perf_counter() - t0:.1f}s")
    assert [i["backend"] for i in info] == ["gloo", "gloo"]
    assert len({i["pid"] for i in info} | {os.getpid()}) == 3  # two worker processes besides the driver
    assert checksums[0] == checksums[1]  # the ranks took identical steps
    moved = max((local["end"][k] - local["start"][k]).abs().max().item() for k in local["end"])
    diff = max((local["end"][k] - dist["end"][k]).abs().max().item() for k in local["end"])
    print(f"max |param change| {moved:.3e}, max |local - ray| {diff:.3e}")
    assert moved > 5e-3  # the steps changed the parameters well beyond the tolerance
    assert diff < 1e-3
    # a gradient summed wrongly (averaged, or one shard's) changes its norm: compare it every step
    assert _grad_norms(ray_dir) == pytest.approx(_grad_norms(local_dir), rel=1e-4)


@pytest.mark.timeout(300)
def test_a_worker_that_dies_mid_update_fails_the_run_with_a_clear_error(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_cfg(tmp_path, model_cache, *COMMON, "trainer.backend=ray", "trainer.n_gpus_per_node=2")
    original = RayWorkers.optimizer_step
    killed: list[int] = []

    def kill_rank_1_first(self: RayWorkers, *args: Any) -> Any:
        # rank 1's process is killed just before the update: rank 0 then enters the gradient
        # all-reduce with a dead peer, the situation that would hang without a fail-fast driver
        if not killed:
            assert self.group is not None
            pid = int(self.group.info[1]["pid"])
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return original(self, *args)

    monkeypatch.setattr(RayWorkers, "optimizer_step", kill_rank_1_first)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(cfg)
        try:
            t0 = time.perf_counter()
            with pytest.raises(WorkerDiedError, match=r"worker 1 \(pid \d+\) died during 'update_actor") as err:
                trainer.fit()
            elapsed = time.perf_counter() - t0
        finally:
            trainer.close()
    print(f"after {elapsed:.1f}s: {err.value}")
    assert str(killed[0]) in str(err.value)
    assert elapsed < 60, f"the driver took {elapsed:.0f}s to notice"
    assert trainer.c.workers.group is None  # the surviving worker was stopped, not left in the collective
    assert not ray.is_initialized()  # the cluster started for the run was shut down
