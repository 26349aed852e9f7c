"""The data-parallel worker: one process of a worker group, every training role colocated.

Each worker owns, on its device, a copy of the policy (with its reference, or the LoRA base)
and its optimizer, and the critic with its optimizer when the estimator is GAE: verl's
colocated ``ActorRolloutRefWorker`` + ``CriticWorker``. The workers of a group form one
``torch.distributed`` process group (gloo on CPU, NCCL on GPU). A gradient step runs
:func:`queryrl.engine.update.optimizer_step` (the code the local backend runs) on this rank's
shard with the mini-batch's global loss normaliser, then sums the gradients over the ranks, so
every rank takes the single-process step.

With FSDP (:func:`uses_fsdp`: ``ray.fsdp`` on GPUs, and on CPUs too with ``ray.fsdp_on_cpu``)
each module is sharded with torch's FSDP2 (``fully_shard``) over the group: parameters,
gradients and AdamW state are DTensors, one shard per rank; FSDP reduce-scatters the gradients
in backward, the gradient norm is clipped over the shards, and the full weights are gathered
for generation and for the driver (weight sync, checkpoints).

This module does not import Ray: :mod:`queryrl.distributed.ray_group` wraps the class in
``ray.remote``; it is also usable in-process (world size 1) by tests.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from queryrl.algos import ADVANTAGE_ESTIMATORS, LossNormalizer
from queryrl.allocator import keep_freed_memory
from queryrl.engine.batch import Batch
from queryrl.engine.update import micro_step_for, optimizer_step, role_settings
from queryrl.models import PolicyBundle
from queryrl.rollout import RolloutOutput, SamplingParams


def trainable_state(module: nn.Module) -> dict[str, Tensor]:
    """The trainable parameters of `module` by name, on the CPU (LoRA: the adapters; else all weights)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in module.named_parameters() if p.requires_grad}


def load_trainable_state(module: nn.Module, state: dict[str, Tensor]) -> None:
    """Copy `state` (from :func:`trainable_state`) into `module`'s parameters; every name must match."""
    params = dict(module.named_parameters())
    missing = [n for n in state if n not in params]
    if missing:
        raise KeyError(f"parameters not in the model: {missing[:5]}")
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))


ROLES = ("actor", "ref", "critic")


def uses_fsdp(cfg: DictConfig, use_gpu: bool) -> bool:
    """Whether a pool's workers shard their modules with FSDP: ``ray.fsdp`` on GPUs; on CPUs (gloo)
    only with ``ray.fsdp_on_cpu`` too (replicas are otherwise the faster choice for a model that fits)."""
    return bool(cfg.ray.fsdp) and (use_gpu or bool(cfg.ray.fsdp_on_cpu))


@contextlib.contextmanager
def gathered(module: nn.Module) -> Iterator[None]:
    """The full parameters of an FSDP2 `module` for the duration of the block.

    Entering is a collective (every rank of the group must enter the same number of times);
    inside, forward passes run on the gathered weights without collectives, so the ranks may run
    different numbers of them (rollouts of different lengths, or none). The weights are resharded
    on exit (``reshard_after_forward``, set at wrapping, is restored).
    """
    from torch.distributed.fsdp import FSDPModule

    assert isinstance(module, FSDPModule)
    module.unshard()
    module.set_reshard_after_forward(False)
    try:
        yield
    finally:
        module.reshard()
        module.set_reshard_after_forward(True)


class PolicyWorker:
    """Rank `rank` of `world_size` in a pool that holds `roles`: actor+rollout, reference, critic.

    - ``actor``: the policy, its optimizer and its rollout backend (``rollout.backend``, built on
      the first :meth:`generate`), plus the reference when ``ref`` is colocated (a frozen copy,
      or the LoRA base with the adapters disabled).
    - ``ref`` alone (a pool of its own): the policy's initial weights, frozen; no optimizer.
    - ``critic``: the value model and its optimizer.

    Args:
        cfg: the run config as a plain dict (``OmegaConf.to_container``).
        rank: this worker's data-parallel rank in its pool.
        world_size: ranks in the pool.
        roles: the roles this pool's workers hold.
    """

    def __init__(self, cfg: dict[str, Any], rank: int, world_size: int, roles: tuple[str, ...] = ROLES) -> None:
        from queryrl.engine.optim import optimizer_from_config
        from queryrl.engine.seeding import seed_everything
        from queryrl.models import ValueModel, load_policy, resolve_model_path

        unknown = [r for r in roles if r not in ROLES]
        if unknown or not roles:
            raise ValueError(f"unknown worker roles {unknown}; valid: {', '.join(ROLES)}")
        self.cfg: DictConfig = OmegaConf.create(cfg)
        self.rank, self.world_size = rank, world_size
        self.roles = tuple(roles)
        self.use_gpu = torch.cuda.is_available() and str(self.cfg.ray.use_gpu).lower() != "false"
        if self.use_gpu:
            torch.cuda.set_device(0)  # Ray makes this worker's GPU the only visible one
            self.device = torch.device("cuda", 0)
        else:
            self.device = torch.device("cpu")
            if self.cfg.ray.num_threads > 0:
                torch.set_num_threads(self.cfg.ray.num_threads)
        keep_freed_memory(self.cfg.trainer.malloc_mmap_threshold_mb)
        seed_everything(self.cfg.trainer.seed)
        self.fsdp = False
        self.modules: dict[str, nn.Module] = {}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.policy: PolicyBundle | None = None
        self._rollout: Any = None
        need_ref = bool(self.cfg.actor.use_kl_loss or self.cfg.algo.use_kl_in_reward)
        if "actor" in roles:
            self.policy = load_policy(self.cfg.model, self.device, self.device, need_ref=need_ref and "ref" in roles)
            self.modules["actor"] = self.policy.model
            # the driver's scheduler sets the learning rate of every step (optimizer_step): this one's is unused
            self.optimizers["actor"], _ = optimizer_from_config(self.policy.model.parameters(), self.cfg, "actor", 1)
        elif "ref" in roles:  # the initial policy, frozen (with LoRA: the base model, no adapters)
            base = OmegaConf.merge(self.cfg.model, {"lora": {"rank": 0}, "gradient_checkpointing": False})
            ref = load_policy(base, self.device, self.device, need_ref=False).model
            self.modules["ref"] = ref.eval().requires_grad_(False)
        if "critic" in roles and "values" in ADVANTAGE_ESTIMATORS.needs(self.cfg.algo.adv_estimator):
            from pathlib import Path

            critic_path = self.cfg.critic.path or str(resolve_model_path(self.cfg.model))
            self.modules["critic"] = ValueModel.from_pretrained(Path(critic_path), self.cfg.model, self.device)
            critic = self.modules["critic"]
            self.optimizers["critic"], _ = optimizer_from_config(critic.parameters(), self.cfg, "critic", 1)

    # --- the process group ----------------------------------------------------------------------

    def address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port, for the rendezvous of the process group (rank 0)."""
        try:
            import ray

            host = ray.util.get_node_ip_address()
        except Exception:  # in-process use
            host = "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        return host, port

    def init_process_group(self, host: str, port: int) -> dict[str, Any]:
        """Join the group (gloo on CPU, NCCL on GPU); shard the modules with FSDP when :func:`uses_fsdp`.

        Returns facts about this worker (pid, device, backend, whether FSDP shards it) for the driver's messages.
        """
        backend = "nccl" if self.use_gpu else "gloo"
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=float(self.cfg.ray.collective_timeout_s)),
        )
        if uses_fsdp(self.cfg, self.use_gpu):
            self._wrap_fsdp()
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "device": str(self.device),
            "backend": backend,
            "fsdp": self.fsdp,
        }

    def _wrap_fsdp(self) -> None:
        """FSDP2 (``fully_shard``, full sharding over the group) on every module; optimizers rebuilt over the shards.

        One FSDP unit per module (the whole model is gathered for a forward, as
        :mod:`queryrl.trainer.plan` assumes), resharded after every forward. FSDP averages the
        gradients over the ranks in backward; the losses are multiplied by the world size
        (``loss_scale``) so the average is the sum the global normaliser expects. Mixed precision
        (``model.compute_dtype`` over float32 parameters) is FSDP's own: the sharded parameters (the
        master weights AdamW updates) stay float32, forward/backward run on gathered bf16 copies
        (``param_dtype``), gradients are reduced in float32 (``reduce_dtype``); the autocast the
        local path uses is switched off, FSDP having done the casting.
        """
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from queryrl.engine.optim import optimizer_from_config
        from queryrl.models.loading import compute_dtype, set_compute_dtype

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for role, module in self.modules.items():
            mixed = compute_dtype(module)
            precision = MixedPrecisionPolicy()
            if mixed is not None:
                precision = MixedPrecisionPolicy(param_dtype=mixed, reduce_dtype=torch.float32)
                set_compute_dtype(module, None)
            fully_shard(module, mesh=mesh, reshard_after_forward=True, mp_policy=precision)  # in place
            if role in self.optimizers:  # over the shards; the driver's scheduler sets the learning rate
                self.optimizers[role], _ = optimizer_from_config(module.parameters(), self.cfg, role, 1)
        self.fsdp = True

    def process(self) -> dict[str, Any]:
        """This worker's pid, and the file its standard error goes to (Ray's log on its node; None when not a
        file), where a native crash leaves its last words (the driver quotes them when the worker dies)."""
        return {"pid": os.getpid(), "stderr": _stderr_file()}

    # --- compute --------------------------------------------------------------------------------

    @torch.no_grad()
    def compute(self, what: str, shard: Batch) -> Tensor:
        """``logprobs`` | ``ref_logprobs`` | ``values`` (n_r, T) of this rank's shard, on the CPU."""
        from queryrl.engine.policy import compute_logprobs, compute_values

        cfg = self.cfg
        batch = shard.to(self.device)
        if what == "values":
            return compute_values(self._module("critic"), batch, cfg.critic.ppo_micro_batch_size).cpu()
        if what == "logprobs":
            out, _ = compute_logprobs(
                self._module("actor"),
                batch,
                cfg.actor.ppo_micro_batch_size,
                cfg.rollout.temperature,
                share_prompt=cfg.actor.share_prompt_forward,
                share_prefix=cfg.actor.share_prefix_forward,
            )
            return out.cpu()
        if what == "ref_logprobs":
            if "ref" not in self.roles:
                raise ValueError(f"this worker holds {', '.join(self.roles)}, not the reference")
            with contextlib.ExitStack() as stack:
                # colocated: the frozen copy, or the LoRA base with adapters off; else this pool's frozen model
                ref = stack.enter_context(self.policy.reference()) if self.policy is not None else self.modules["ref"]
                out, _ = compute_logprobs(
                    ref,
                    batch,
                    cfg.actor.ppo_micro_batch_size,
                    cfg.rollout.temperature,
                    share_prompt=cfg.actor.share_prompt_forward,
                    share_prefix=cfg.actor.share_prefix_forward,
                )
            return out.cpu()
        raise ValueError(f"unknown computation {what!r}; valid: logprobs, ref_logprobs, values")

    def _module(self, role: str) -> nn.Module:
        if role not in self.modules:
            raise ValueError(f"this worker holds {', '.join(self.roles)}: no {role} module")
        return self.modules[role]

    # --- rollout ----------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> RolloutOutput:
        """Sample ``params.n`` responses for each of `prompts` with this rank's policy.

        The sampling RNG is seeded with `seed` (the driver draws it from its own, checkpointed RNG),
        so a run, resumed or not, samples the same tokens; this worker's global RNG is left as it
        was. ``prompt_index`` is relative to `prompts`. Under FSDP the full parameters are gathered
        for the call (every rank must call it the same number of times, with prompts or without).
        """
        if self.policy is None:
            raise ValueError(f"this worker holds {', '.join(self.roles)}: no actor to generate with")
        pad = int(self.policy.tokenizer.pad_token_id)
        if self._rollout is None:
            from queryrl.rollout import make_rollout
            from queryrl.rollout.vllm import config_engine

            # an engine with weights of its own (vLLM) built here takes them from the policy at once: under
            # FSDP a collective every rank runs, as every rank calls generate
            self._rollout = make_rollout(
                self.cfg.rollout.backend,
                self.policy.model,
                self.policy.tokenizer,
                self.cfg.rollout.micro_batch_size,
                self.device,
                fast_decode=self.cfg.rollout.fast_decode,
                dtype=self._rollout_dtype(),
                engine=config_engine(self.cfg.rollout),
            )
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=[self.device] if self.use_gpu else []))
            torch.manual_seed(seed)
            if self.fsdp and self.cfg.rollout.backend == "hf":
                stack.enter_context(gathered(self.policy.model))
            if not prompts:
                return RolloutOutput.concat([], pad)
            return self._rollout.generate(prompts, params)

    def _rollout_dtype(self) -> torch.dtype:
        """The dtype the policy computes in (``model.compute_dtype`` under mixed precision, else ``model.dtype``):
        the rollout engine's. Read from the config, since FSDP's mixed precision replaces the module's own record."""
        from queryrl.models.loading import DTYPES, model_compute_dtype

        return model_compute_dtype(self.cfg.model) or DTYPES[self.cfg.model.dtype]

    def sync_rollout(self) -> None:
        """After an update: the rollout backend takes the policy's new weights (vLLM; a no-op for hf).

        The backend reads them through :func:`queryrl.rollout.sync.rollout_weights`, which gathers FSDP's
        shards one tensor at a time (every rank calls this) and never changes the policy.
        """
        if self._rollout is not None and self.policy is not None:
            self._rollout.update_weights(self.policy.model)

    def optimizer_step(
        self, role: str, shard: Batch, norm: LossNormalizer, lr: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One optimizer step of `role` on this rank's shard of a mini-batch (see the module docstring)."""
        module, optimizer = self.modules[role], self.optimizers[role]
        settings = role_settings(role, self.cfg)
        for group in optimizer.param_groups:  # the driver's scheduler decides the learning rate
            group["lr"] = lr
        module.train()
        params = [p for p in module.parameters() if p.requires_grad]
        clip: Callable[[float], Tensor] | None = None
        if self.fsdp:
            clip = functools.partial(_clip_sharded, params)
        return optimizer_step(
            shard.to(self.device),
            norm,
            settings.ppo_micro_batch_size,
            micro_step_for(role, self.cfg, module, loss_scale=float(self.world_size) if self.fsdp else 1.0),
            optimizer,
            params,
            settings.grad_clip,
            role,
            reduce_grads=None if self.fsdp or self.world_size == 1 else _sum_gradients,
            clip_grads=clip,
        )

    # --- state ------------------------------------------------------------------------------------

    def get_state(self, role: str, with_optimizer: bool = False) -> dict[str, Any] | None:
        """Rank 0: the trainable weights of `role` (and its optimizer state); other ranks: None.

        Every rank must call it (under FSDP, gathering the full state is a collective). The
        optimizer state is ``torch.optim``'s own format (parameters numbered in the order of
        ``module.parameters()``), which the driver's optimizer loads.
        """
        module = self.modules[role]
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 gets it, the others {}
            full = get_model_state_dict(module, options=options)
            weights: dict[str, Any] = {n: full[n] for n in _trainable_names(module)} if self.rank == 0 else {}
            optim: dict[str, Any] | None = None
            if with_optimizer:
                by_name = get_optimizer_state_dict(module, self.optimizers[role], options=options)
                optim = _numbered(by_name, _trainable_names(module)) if self.rank == 0 else None
        else:
            weights = trainable_state(module) if self.rank == 0 else {}
            optim = self.optimizers[role].state_dict() if with_optimizer and self.rank == 0 else None
        if self.rank != 0:
            return None
        return {"weights": weights, "optimizer": optim}

    def set_state(self, role: str, state: dict[str, Any]) -> None:
        """Load trainable weights (and optimizer state) from the driver; every rank loads the same.

        Under FSDP every rank keeps its shard of the full state it is given (a resume).
        """
        module, optim = self.modules[role], state.get("optimizer")
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            names = _trainable_names(module)
            missing = sorted(set(state["weights"]) - set(names))
            if missing:
                raise KeyError(f"parameters not in the model: {missing[:5]}")
            options = StateDictOptions(full_state_dict=True, strict=False)  # the trainable weights only
            set_model_state_dict(module, state["weights"], options=options)
            if optim is not None:
                by_name = _named(optim, names)
                set_optimizer_state_dict(module, self.optimizers[role], by_name, options=options)
            return
        load_trainable_state(module, state["weights"])
        if optim is not None:
            self.optimizers[role].load_state_dict(optim)

    def checksum(self, role: str) -> float:
        """Sum of the trainable parameters (tests compare ranks with it; under FSDP: of all the shards)."""
        params = [p for p in self.modules[role].parameters() if p.requires_grad]
        if not self.fsdp:
            return float(sum(p.detach().double().sum() for p in params))
        shards = [p.to_local() for p in params]  # type: ignore[attr-defined]  # DTensor parameters
        total = torch.stack([s.detach().double().sum() for s in shards]).sum()
        dist.all_reduce(total)
        return float(total)


def _trainable_names(module: nn.Module) -> list[str]:
    """Names of `module`'s trainable parameters, in the order of ``module.parameters()`` (the optimizer's)."""
    return [n for n, p in module.named_parameters() if p.requires_grad]


def _numbered(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (torch.distributed.checkpoint's) -> by number (torch.optim's):
    ``names[i]`` is parameter ``i``, as in the driver's optimizer (built over the same model's parameters)."""
    number = {name: i for i, name in enumerate(names)}
    return {
        "state": {number[name]: value for name, value in state["state"].items()},
        "param_groups": [{**g, "params": [number[n] for n in g["params"]]} for g in state["param_groups"]],
    }


def _named(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of :func:`_numbered`: parameter ``i`` is ``names[i]``."""
    return {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
    }


def _clip_sharded(params: list[nn.Parameter], max_norm: float) -> Tensor:
    """``clip_grad_norm_`` over FSDP's sharded (DTensor) gradients: the norm of the full gradient, as a plain tensor."""
    from torch.distributed.tensor import DTensor

    norm = nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def _sum_gradients(params: list[nn.Parameter]) -> None:
    """All-reduce (SUM) the gradients of `params` over the process group, as one flat buffer.

    A parameter without a gradient (this rank had no rows) contributes zeros.
    """
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


def _stderr_file() -> str | None:
    """The regular file this process's standard error (fd 2) writes to, or None (a terminal, a pipe, no /proc)."""
    try:
        path = os.readlink("/proc/self/fd/2")
    except OSError:
        return None
    return path if os.path.isfile(path) else None
