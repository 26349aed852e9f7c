"""The Ray backend (``trainer.backend=ray``): worker groups (:mod:`.worker_group`), the trainer's calls on
them, and generation on the workers.

verl's single controller, reduced to what this trainer needs:

- :class:`~.worker_group.ResourcePool`: ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` bundles in a Ray
  placement group, one GPU each (or ``ray.num_cpus_per_worker`` CPU slots when there is no GPU).
- :class:`~.worker_group.RayWorkerGroup`: one :class:`~queryrl.distributed.worker.PolicyWorker` actor per
  bundle, joined into one ``torch.distributed`` group; ``call_all`` runs a method on every rank and
  collects the results in rank order. A dead actor raises :class:`~.worker_group.WorkerDiedError` (naming the
  rank, pid and the call) as soon as Ray reports it, and a call that outlives
  ``ray.call_timeout_s`` raises :class:`~.worker_group.WorkerTimeoutError`: the driver never waits forever.
  After either, the remaining actors are killed (they may be blocked in a collective).
- :class:`RayWorkers`: what the trainer loop calls (``compute``, ``optimizer_step``, weight and
  state sync), with the batch split by data-parallel rank and the results concatenated.

Ray is imported here and in :mod:`.worker_group` only; the package imports without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from queryrl.algos import LossNormalizer
from queryrl.distributed.dispatch import collect, dispatch
from queryrl.distributed.worker import load_trainable_state, trainable_state, uses_fsdp
from queryrl.distributed.worker_group import (
    RayWorkerGroup,
    ResourcePool,
    import_ray,
)
from queryrl.engine.batch import Batch
from queryrl.engine.update import add_metrics
from queryrl.engine.workers import WORKERS
from queryrl.rollout import RolloutOutput, SamplingParams
from queryrl.rollout.base import check_prompts


def _use_gpu(cfg: DictConfig, cluster: dict[str, float]) -> bool:
    choice = str(cfg.ray.use_gpu).lower()
    if choice == "auto":
        return cluster.get("GPU", 0.0) >= 1.0
    return choice == "true"


class RayWorkers:
    """The trainer's handle on its Ray worker groups (``Components.workers``).

    Starts (``ray.address=""``) or connects to (``"auto"``, ``host:port``, ``ray://...``) a Ray
    cluster and creates the worker groups from the driver's current weights: the actor pool
    (``trainer.nnodes`` x ``trainer.n_gpus_per_node`` workers holding the actor and its rollout,
    and the reference and critic unless they have pools of their own), a reference pool of
    ``ray.ref_workers`` and a critic pool of ``ray.critic_workers``. Each pool is its own placement
    group and ``torch.distributed`` group. Ray is shut down on :meth:`close` only if this object
    started it.

    Args:
        cfg: the run config.
        policy: the driver's policy (its trainable weights initialise every actor worker).
        critic: the driver's critic, if any.
    """

    def __init__(self, cfg: DictConfig, policy: nn.Module, critic: nn.Module | None) -> None:
        ray = import_ray()
        self._ray = ray
        self.cfg = cfg
        self._started_ray = False
        rc = cfg.ray
        need_ref = bool(cfg.actor.use_kl_loss or cfg.algo.use_kl_in_reward)
        own_ref = need_ref and rc.ref_workers > 0
        own_critic = critic is not None and rc.critic_workers > 0
        actor_roles = (
            ("actor",)
            + (("ref",) if need_ref and not own_ref else ())
            + (("critic",) if critic is not None and not own_critic else ())
        )
        world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
        workers = world + (rc.ref_workers if own_ref else 0) + (rc.critic_workers if own_critic else 0)
        if not ray.is_initialized():
            self._start_ray(workers)
        self.groups: dict[str, RayWorkerGroup] = {}
        try:
            use_gpu = _use_gpu(cfg, ray.cluster_resources())
            cpus, strategy = float(rc.num_cpus_per_worker), rc.placement_strategy
            nodes, per_node = cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node
            pools = [(ResourcePool(nodes, per_node, use_gpu, cpus, strategy), actor_roles)]
            if own_ref:
                ref_pool = ResourcePool(1, rc.ref_workers, use_gpu, cpus, strategy, "ref", "ray.ref_workers")
                pools.append((ref_pool, ("ref",)))
            if own_critic:
                critic_pool = ResourcePool(
                    1, rc.critic_workers, use_gpu, cpus, strategy, "critic", "ray.critic_workers"
                )
                pools.append((critic_pool, ("critic",)))
            self._start_groups(pools, policy, critic)
        except BaseException:
            self.close()
            raise

    def _start_ray(self, workers: int) -> None:
        """Join the cluster at ``ray.address``, or start a local one sized for `workers` workers."""
        rc = self.cfg.ray
        # the workers import queryrl from where the driver does (a source tree works without installing)
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
        runtime_env = {"env_vars": {"PYTHONPATH": path}}
        if rc.address:
            self._ray.init(address=rc.address, include_dashboard=False, runtime_env=runtime_env)
        else:
            self._ray.init(
                address="local",  # a new cluster, even where `ray start` left one behind (or RAY_ADDRESS is set)
                num_cpus=rc.num_cpus or max(round(workers * rc.num_cpus_per_worker), 1),
                include_dashboard=False,
                runtime_env=runtime_env,
            )
        self._started_ray = True

    def _start_groups(
        self, pools: list[tuple[ResourcePool, tuple[str, ...]]], policy: nn.Module, critic: nn.Module | None
    ) -> None:
        """Check that every pool fits the cluster (a clear error, not a wait), then start a worker group on
        each, the actor and critic workers initialised with the driver's trainable weights."""
        available = dict(self._ray.cluster_resources())
        for pool, _ in pools:  # all pools must fit before any starts
            pool.check(available)
            available = pool.take(available)
        for pool, roles in pools:
            init: dict[str, dict[str, Any]] = {}
            if "actor" in roles:
                init["actor"] = {"weights": trainable_state(policy)}
            if "critic" in roles and critic is not None:
                init["critic"] = {"weights": trainable_state(critic)}
            group = RayWorkerGroup(self.cfg, pool, init, roles)
            for role in roles:
                self.groups[role] = group

    @property
    def group(self) -> RayWorkerGroup | None:
        """The actor pool's group (None once closed)."""
        return self.groups.get("actor")

    @property
    def world_size(self) -> int:
        return self._group().world_size

    def _group(self, role: str = "actor") -> RayWorkerGroup:
        if role not in self.groups:
            raise RuntimeError("the Ray worker groups are closed" if not self.groups else f"no worker holds {role}")
        return self.groups[role]

    def _check_even(self, group: RayWorkerGroup, rows: int, what: str) -> None:
        if uses_fsdp(self.cfg, group.pool.use_gpu) and rows % group.world_size:
            raise ValueError(
                f"{what}: {rows} rows do not split evenly over {group.world_size} FSDP ranks (every rank must run the "
                "same number of forward passes); make the batch and mini-batch sizes multiples of the world size"
            )

    def compute(self, what: str, batch: Batch) -> Tensor:
        """``logprobs`` | ``ref_logprobs`` | ``values`` (N, T): split by rank in the role's pool, concatenated."""
        return self.submit(what, batch)()

    def submit(self, what: str, batch: Batch) -> Callable[[], Tensor]:
        """Start :meth:`compute` and return at once; calling the result waits for the (N, T) tensor.

        Computations of different pools (e.g. ``ref_logprobs`` in a pool of their own while the
        actor pool computes ``logprobs``) run at the same time; those of one pool queue in order.
        """
        role = {"logprobs": "actor", "ref_logprobs": "ref", "values": "critic"}.get(what)
        if role is None:
            raise ValueError(f"unknown computation {what!r}; valid: logprobs, ref_logprobs, values")
        group = self._group(role)
        self._check_even(group, len(batch), what)
        shards = dispatch(batch, group.world_size)
        refs = [a.compute.remote(what, s) for a, s in zip(group.actors, shards, strict=True)]
        device = batch.response_mask.device

        def result() -> Tensor:
            return collect(group._wait(refs, what, ranks=list(range(group.world_size)))).to(device)

        return result

    def optimizer_step(
        self, role: str, mini: Batch, norm: LossNormalizer, lr: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One optimizer step of `role` on `mini`, each rank on its shard with the global `norm`.

        Returns the micro-batch metrics summed over the ranks, and rank 0's step metrics
        (grad norm: the same on every rank once the gradients are summed).
        """
        group = self._group(role)
        self._check_even(group, len(mini), f"update_{role}")
        shards = dispatch(mini, group.world_size)
        results = group.call_each(
            "optimizer_step", [(role, s, norm, lr) for s in shards], what=f"update_{role} (optimizer step)"
        )
        summed: dict[str, float] = {}
        for part, _ in results:
            summed = add_metrics(summed, part)  # a ``_max`` key: the largest rank's
        return summed, results[0][1]

    def sync_policy(self, model: nn.Module) -> None:
        """After an actor update with ``ray.rollout=driver``: the driver's copy, which generates, takes the new
        weights (with ``ray.rollout=workers`` the workers generate with the weights they just updated)."""
        if self.cfg.ray.rollout == "driver":
            self.pull_policy(model)

    def pull_policy(self, model: nn.Module) -> None:
        """Load rank 0's trainable policy weights into the driver's `model`."""
        state = self._group().call_all("get_state", "actor", False, what="weight sync")[0]
        load_trainable_state(model, state["weights"])

    def pull_state(self, c: Any) -> None:
        """Before a checkpoint: the driver's policy, optimizer (and critic) take rank 0's states."""
        roles = [("actor", c.policy.model, c.optimizer)]
        if c.critic is not None:
            roles.append(("critic", c.critic, c.critic_optimizer))
        for role, module, optimizer in roles:
            group = self._group(role)
            state = group.call_all("get_state", role, True, what=f"{role} state for the checkpoint")[0]
            load_trainable_state(module, state["weights"])
            optimizer.load_state_dict(state["optimizer"])

    def push_state(self, c: Any) -> None:
        """After a resume: every worker takes the driver's restored weights and optimizer states."""
        self._group("actor").call_all(
            "set_state",
            "actor",
            {"weights": trainable_state(c.policy.model), "optimizer": c.optimizer.state_dict()},
            what="loading the resumed actor state",
        )
        self.sync_rollout()
        if c.critic is not None:
            self._group("critic").call_all(
                "set_state",
                "critic",
                {"weights": trainable_state(c.critic), "optimizer": c.critic_optimizer.state_dict()},
                what="loading the resumed critic state",
            )

    def sync_rollout(self) -> None:
        """Every actor worker's rollout backend takes its policy's weights (vLLM; a no-op for hf)."""
        self._group().call_all("sync_rollout", what="rollout weight sync")

    def checksums(self, role: str = "actor") -> list[float]:
        """Per rank, the sum of `role`'s trainable parameters (equal on every rank when in sync)."""
        return [float(x) for x in self._group(role).call_all("checksum", role)]

    def close(self) -> None:
        """Stop the workers; shut Ray down if this object started it."""
        for group in {id(g): g for g in self.groups.values()}.values():
            group.shutdown()
        self.groups = {}
        if self._started_ray and self._ray.is_initialized():
            self._ray.shutdown()
            self._started_ray = False


class RayRollout:
    """The rollout backend of ``ray.rollout=workers``: the actor workers generate, each for its share.

    The prompts are cut into blocks of ``rollout.micro_batch_size // n`` prompts (whole groups;
    at least one prompt), dealt to the ranks in rounds (block ``b`` to rank ``b % W``), every
    rank's calls queued at once, and the blocks yielded in order as they finish: the driver scores
    block ``b`` while the workers generate the next ones. Each block is sampled with its own seed
    (``seed + b``, the seed drawn from the driver's checkpointed RNG), so which rank generates a
    block, and whether the run was resumed, does not change its tokens. Every rank gets the same
    number of calls (an empty block where the prompts run out), as FSDP's gathers need.

    Args:
        workers: the trainer's worker groups.
        pad_token_id: the tokenizer's pad id (to concatenate the blocks).
        micro_batch_size: sequences per worker call (``rollout.micro_batch_size``).
    """

    def __init__(self, workers: RayWorkers, pad_token_id: int, micro_batch_size: int) -> None:
        self.workers = workers
        self.pad_token_id = pad_token_id
        self.micro_batch_size = micro_batch_size

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutOutput:
        """Sample ``params.n`` responses per prompt on the workers; rows prompt-major."""
        return RolloutOutput.concat(list(self.generate_chunks(prompts, params)), self.pad_token_id)

    def generate_chunks(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[RolloutOutput]:
        """One output per block of prompts, in order (``prompt_index`` absolute)."""
        check_prompts(prompts)
        group = self.workers._group()
        per_block = max(self.micro_batch_size // params.n, 1)
        starts = list(range(0, len(prompts), per_block))
        rounds = -(-len(starts) // group.world_size)
        seed = int(torch.randint(0, 2**31 - 1, ()).item())  # the driver's RNG: saved in every checkpoint
        refs: list[Any] = []
        for b in range(rounds * group.world_size):
            block = prompts[starts[b] : starts[b] + per_block] if b < len(starts) else []
            refs.append(group.actors[b % group.world_size].generate.remote(block, params, seed + b))
        for b, start in enumerate(starts):
            rank = b % group.world_size
            (out,) = group._wait([refs[b]], f"generating (block {b} of {len(starts)})", ranks=[rank])
            out.prompt_index = out.prompt_index + start
            yield out
        group._wait(refs[len(starts) :], "generating (empty blocks)", ranks=None)

    def update_weights(self, source: nn.Module) -> None:
        """After an update: the workers' rollout backends take their own policies' new weights."""
        self.workers.sync_rollout()


@WORKERS.register("ray")
def make_ray_workers(cfg: DictConfig, c: Any) -> RayWorkers:
    """``trainer.backend=ray``: the worker groups for the components `c` (whose models become their mirrors).

    With ``ray.rollout=workers`` the components' rollout is :class:`RayRollout` (the workers generate).
    The driver's optimizers only carry the schedule and the checkpointed states: the workers step.
    """
    workers = RayWorkers(cfg, c.policy.model, c.critic)
    if c.rollout is None:
        c.rollout = RayRollout(workers, int(c.policy.tokenizer.pad_token_id), cfg.rollout.micro_batch_size)
    for mirror in (c.optimizer, c.critic_optimizer):
        if mirror is not None:
            mirror._opt_called = True  # silences "scheduler before optimizer": the workers step
    return workers
