"""trainer.backend=ray on CPU: Ray workers (one CPU each, gloo) against the local backend.

What the parity tests prove: with ``ray.rollout=driver`` generation, rewards and advantages run
in the driver in both backends (the driver's policy copy generates and receives rank 0's weights
after every update), so both runs sample the same responses; the log-probs (old and reference),
values and every optimizer step are computed by the workers on their shares of each mini-batch
with the mini-batch's global loss normaliser, and their gradients summed over a gloo process
group. Equal parameters after the steps therefore test the distributed compute and update path.
The tolerance is that of float re-ordering amplified by Adam: the local backend with a different
micro-batch size differs from itself by the same order (about 1e-4 after two steps).

Distributed sampling (``ray.rollout=workers``, the default) draws different random numbers from
the local backend's, so it is tested on its own terms: every block of prompts is sampled exactly
as a local rollout seeded with the block's seed samples it, the samples are on-policy (the
trainer's recomputed probabilities equal the rollout's), and a run resumed from a checkpoint
ends where the uninterrupted run does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'queryrl[ray]'): the ray tests are skipped")

from queryrl.distributed.ray_group import RayRollout, RayWorkers  # noqa: E402
from queryrl.distributed.worker_group import WorkerDiedError  # noqa: E402
from queryrl.rollout import HFRollout, SamplingParams  # noqa: E402
from queryrl.trainer.loop import Trainer  # noqa: E402
from tests.distributed.helpers import COMMON  # noqa: E402
from tests.helpers import make_cfg  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


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
            checksums = trainer.c.workers.checksums() if isinstance(trainer.c.workers, RayWorkers) else None
            info = trainer.c.workers.group.info if isinstance(trainer.c.workers, RayWorkers) else None
        return {"start": start, "end": end}, (checksums, info), trainer.run_dir  # type: ignore[return-value]


@pytest.mark.timeout(600)
def test_two_ray_workers_end_with_the_parameters_of_the_local_backend(tmp_path: Path, model_cache: Path) -> None:
    local, _, local_dir = _train(tmp_path / "local", model_cache, "trainer.backend=local")
    t0 = time.perf_counter()
    dist, (checksums, info), ray_dir = _train(
        tmp_path / "ray", model_cache, "trainer.backend=ray", "trainer.n_gpus_per_node=2", "ray.rollout=driver"
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
def test_a_worker_that_crashes_mid_update_fails_the_run_with_a_clear_error(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_cfg(tmp_path, model_cache, *COMMON, "trainer.backend=ray", "trainer.n_gpus_per_node=2")
    original = RayWorkers.optimizer_step
    killed: list[int] = []

    def kill_rank_1_first(self: RayWorkers, *args: Any) -> Any:
        # rank 1's process crashes (a segfault, as a native bug gives) just before the update: rank 0 then enters
        # the gradient all-reduce with a dead peer, the situation that would hang without a fail-fast driver
        if not killed:
            assert self.group is not None
            pid = int(self.group.info[1]["pid"])
            os.kill(pid, signal.SIGSEGV)
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
    assert "Fatal Python error: Segmentation fault" in str(err.value)  # the worker's last words, from its log
    assert elapsed < 60, f"the driver took {elapsed:.0f}s to notice"
    assert trainer.c.workers.group is None  # the surviving worker was stopped, not left in the collective
    assert not ray.is_initialized()  # the cluster started for the run was shut down


@pytest.mark.timeout(600)
def test_separate_reference_and_critic_pools_match_the_local_backend(tmp_path: Path, model_cache: Path) -> None:
    """PPO (GAE) with a KL loss: actor pool of 2, a reference pool and a critic pool of 1 each."""
    gae = ("algo.adv_estimator=gae", "critic.lr=1e-3")
    cfg_local = make_cfg(tmp_path / "local", model_cache, *COMMON, *gae, "trainer.backend=local")
    cfg_ray = make_cfg(
        tmp_path / "ray",
        model_cache,
        *COMMON,
        *gae,
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        "ray.rollout=driver",
        "ray.ref_workers=1",
        "ray.critic_workers=1",
    )
    ends = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cfg in (cfg_local, cfg_ray):
            with Trainer(cfg) as trainer:
                assert trainer.c.critic is not None
                critic_start = {k: v.detach().clone() for k, v in trainer.c.critic.named_parameters()}
                trainer.fit()
                ends.append(
                    {
                        "policy": {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters()},
                        "critic": {k: v.detach().clone() for k, v in trainer.c.critic.named_parameters()},
                    }
                )
                moved = max((ends[-1]["critic"][k] - v).abs().max().item() for k, v in critic_start.items())
                assert moved > 1e-3, "the critic did not train"
                if isinstance(trainer.c.workers, RayWorkers):
                    groups = trainer.c.workers.groups
                    pools = {role: (g.pool.name, g.roles, g.world_size) for role, g in groups.items()}
                    pids = {i["pid"] for g in groups.values() for i in g.info}
    assert pools == {
        "actor": ("actor", ("actor",), 2),
        "ref": ("ref", ("ref",), 1),
        "critic": ("critic", ("critic",), 1),
    }
    assert len(pids | {os.getpid()}) == 5  # four worker processes besides the driver
    for part in ("policy", "critic"):
        local, dist = ends[0][part], ends[1][part]
        diff = max((local[k] - dist[k]).abs().max().item() for k in local)
        # (the critic pool has one worker: the same arithmetic as the local backend, so often exactly equal)
        print(f"{part}: max |local - ray| {diff:.3e}")
        assert diff < 1e-3


@pytest.mark.timeout(300)
def test_a_reference_pool_of_its_own_serves_a_lora_policy(tmp_path: Path, model_cache: Path) -> None:
    """LoRA: the colocated reference is the base with the adapters off; a reference pool holds the base alone."""
    lora = ("model.lora.rank=4", "actor.lr=1e-2", "actor.kl_loss_coef=1.0")
    runs = {
        "local": ("trainer.backend=local",),
        "ray": ("trainer.backend=ray", "trainer.n_gpus_per_node=1", "ray.ref_workers=1", "ray.rollout=driver"),
    }
    ends, kl = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, extra in runs.items():
            with Trainer(make_cfg(tmp_path / name, model_cache, *COMMON, *lora, *extra)) as trainer:
                kl.append(trainer.fit()["actor/kl_loss"])
                ends.append(
                    {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters() if v.requires_grad}
                )
    assert kl[0] > 1e-4  # the adapters moved the policy away from its reference
    assert kl[1] == pytest.approx(kl[0], rel=1e-4)
    diff = max((ends[0][k] - ends[1][k]).abs().max().item() for k in ends[0])
    print(f"kl_loss {kl}, max |local - ray| {diff:.3e}")
    assert diff < 1e-5


@pytest.mark.timeout(300)
def test_worker_rollouts_sample_what_a_local_rollout_samples_with_each_blocks_seed(
    tmp_path: Path, model_cache: Path
) -> None:
    """Five prompts, n=2, 4 sequences per worker call: blocks of 2, 2 and 1 prompts over 2 ranks."""
    cfg = make_cfg(
        tmp_path, model_cache, *COMMON, "trainer.backend=ray", "trainer.n_gpus_per_node=2", "rollout.micro_batch_size=4"
    )
    params = SamplingParams(temperature=1.0, n=2, max_new_tokens=12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Trainer(cfg) as trainer:
            rollout = trainer.c.rollout
            assert isinstance(rollout, RayRollout)
            prompts = [it.input_ids for it in trainer.c.loader.datasets[0].items[:5]]
            torch.manual_seed(7)
            chunks = list(rollout.generate_chunks(prompts, params))
            torch.manual_seed(7)
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
            local = HFRollout(trainer.c.policy.model, trainer.c.policy.tokenizer, micro_batch_size=4)
            assert [c.prompt_index.tolist() for c in chunks] == [[0, 0, 1, 1], [2, 2, 3, 3], [4, 4]]
            for b, (start, chunk) in enumerate(zip([0, 2, 4], chunks, strict=True)):
                torch.manual_seed(seed + b)
                expected = local.generate(prompts[start : start + 2], params)
                assert torch.equal(chunk.response_ids, expected.response_ids), f"block {b}"
                assert torch.allclose(chunk.rollout_logprobs, expected.rollout_logprobs, atol=1e-5)
                assert torch.equal(chunk.prompt_ids, expected.prompt_ids)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def existing_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Ray cluster started by `ray start --head`, as a user would, outside the test process."""
    port = _free_port()
    ray_cli = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [
            str(ray_cli),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=4",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={tmp_path_factory.mktemp('ray')}",
        ],
        env=_driver_env(RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0"),  # stop at once when the fixture ends
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "Ray runtime started" in line:
            break
    else:
        pytest.fail("ray start --head did not start:\n" + "".join(seen[-20:]))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _driver_env(**extra: str) -> dict[str, str]:
    repo = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)
    # a cluster without token authentication, so that the driver needs no token file
    return dict(os.environ, RAY_AUTH_MODE="disabled", OMP_NUM_THREADS="1", PYTHONPATH=path, **extra)


# a driver process of its own, as a user's would be: train (or resume) and save where it ended
DRIVER = """
import sys, warnings
from pathlib import Path
import ray, torch
from tests.helpers import make_cfg
from queryrl.trainer.loop import Trainer

out, cache, max_steps, *overrides = sys.argv[1:]
warnings.simplefilter("ignore")
with Trainer(make_cfg(Path(out), Path(cache), *overrides)) as trainer:
    start = trainer.step
    trainer.fit(max_steps=int(max_steps) or None)
    end = {
        "start": start,
        "params": {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters()},
        "checksums": trainer.c.workers.checksums(),
        "gcs_address": ray.get_runtime_context().gcs_address,
    }
assert not ray.is_initialized()  # the driver disconnected; the cluster lives on
torch.save(end, Path(out) / "end.pt")
"""


def _drive(out: Path, model_cache: Path, max_steps: int, *overrides: str) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(out), str(model_cache), str(max_steps), *overrides],
        env=_driver_env(),
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = torch.load(out / "end.pt")
    return result


@pytest.mark.timeout(600)
def test_a_run_on_an_existing_cluster_resumes_where_the_uninterrupted_run_ends(
    tmp_path: Path, model_cache: Path, existing_cluster: str
) -> None:
    """Worker rollouts on a cluster started outside the run: 2 steps, against 1 + resume + 1 (the resumed step
    starts from the checkpoint's weights, AdamW state and data position: one step proves each is restored)."""
    run = (
        *COMMON,
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        f"ray.address={existing_cluster}",
        "trainer.total_steps=2",
    )
    whole = _drive(tmp_path / "whole", model_cache, 0, *run)
    first = _drive(tmp_path / "resumed", model_cache, 1, *run)  # the same cluster serves a second driver
    resumed = _drive(tmp_path / "resumed", model_cache, 0, *run, "trainer.resume=auto")
    assert (whole["start"], first["start"], resumed["start"]) == (0, 0, 1)
    assert whole["checksums"][0] == whole["checksums"][1]
    port = existing_cluster.rsplit(":", 1)[1]
    assert all(r["gcs_address"].endswith(f":{port}") for r in (whole, first, resumed))  # joined, not started one
    metrics = [
        json.loads(line) for line in (tmp_path / "whole" / "toy_grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == [1, 2]
    # the workers sampled with the weights they train: on-policy up to float noise
    assert max(m["training/rollout_probs_diff_max"] for m in metrics) < 1e-4
    moved = max((whole["params"][k] - first["params"][k]).abs().max().item() for k in whole["params"])
    diff = max((whole["params"][k] - resumed["params"][k]).abs().max().item() for k in whole["params"])
    print(f"max |param change in step 2| {moved:.3e}, max |whole - resumed| {diff:.3e}")
    assert moved > 1e-3  # the resumed step had work to do
    assert diff < 1e-6
