"""The workers protocol: what the training loop asks of whatever holds the models and takes the steps.

One protocol, two implementations chosen by ``trainer.backend`` through :data:`WORKERS`:

- ``local`` (:class:`LocalWorkers`): this process; the loop's own policy, reference, critic and
  optimizers;
- ``ray`` (:class:`queryrl.distributed.ray_group.RayWorkers`, registered when
  :mod:`queryrl.distributed` is imported): Ray actors, one per data-parallel rank, with the driver's
  models as mirrors for rollouts and checkpoints.

The loop never asks which one it has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from omegaconf import DictConfig
from torch import Tensor, nn

from queryrl.algos import LossNormalizer
from queryrl.engine.batch import Batch
from queryrl.engine.policy import compute_logprobs, compute_values
from queryrl.engine.update import micro_step_for, optimizer_step, role_settings
from queryrl.registry import Registry

COMPUTATIONS = ("logprobs", "ref_logprobs", "values")


class Workers(Protocol):
    """What the loop calls; `c` is the run's components (``queryrl.trainer.components.Components``)."""

    def submit(self, what: str, batch: Batch) -> Callable[[], Tensor]:
        """Start ``logprobs`` | ``ref_logprobs`` | ``values`` of `batch`; calling the result gives the (N, T) tensor."""
        ...

    def optimizer_step(
        self, role: str, mini: Batch, norm: LossNormalizer, lr: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One optimizer step of `role` (``actor`` | ``critic``) on the mini-batch `mini` with the loss
        normaliser `norm` at learning rate `lr`; the micro-batch metrics summed, and the step's metrics."""
        ...

    def sync_policy(self, model: nn.Module) -> None:
        """After an actor update: whatever generates the next rollouts takes the new weights."""
        ...

    def pull_state(self, c: Any) -> None:
        """Before a checkpoint: `c`'s policy, optimizers (and critic) take the workers' states."""
        ...

    def push_state(self, c: Any) -> None:
        """After a resume: the workers take `c`'s restored states."""
        ...

    def close(self) -> None:
        """Release what the workers hold (processes, a cluster); idempotent."""
        ...


WorkersFactory = Callable[[DictConfig, Any], Workers]
WORKERS: Registry[WorkersFactory] = Registry("trainer backend")


class LocalWorkers:
    """The in-process workers: the components' own models and optimizers.

    Args:
        cfg: the run config.
        c: the components (policy bundle, critic, optimizers, trainable parameters, devices).
    """

    def __init__(self, cfg: DictConfig, c: Any) -> None:
        self.cfg, self.c = cfg, c

    def submit(self, what: str, batch: Batch) -> Callable[[], Tensor]:
        """The computation, run when the result is called (so a phase's timer holds its time)."""
        compute = {"logprobs": self._logprobs, "ref_logprobs": self._ref_logprobs, "values": self._values}
        if what not in compute:
            raise ValueError(f"unknown computation {what!r}; valid: {', '.join(COMPUTATIONS)}")
        return lambda: compute[what](batch)

    def _logprobs(self, batch: Batch) -> Tensor:
        cfg = self.cfg
        logprobs, _ = compute_logprobs(
            self.c.policy.model,
            batch,
            cfg.actor.ppo_micro_batch_size,
            cfg.rollout.temperature,
            share_prompt=cfg.actor.share_prompt_forward,
            share_prefix=cfg.actor.share_prefix_forward,
        )
        return logprobs

    def _ref_logprobs(self, batch: Batch) -> Tensor:
        cfg, c = self.cfg, self.c
        with c.policy.reference() as ref:
            logprobs, _ = compute_logprobs(
                ref,
                batch.to(c.ref_device),
                cfg.actor.ppo_micro_batch_size,
                cfg.rollout.temperature,
                share_prompt=cfg.actor.share_prompt_forward,
                share_prefix=cfg.actor.share_prefix_forward,
            )
        return logprobs.to(c.device)

    def _values(self, batch: Batch) -> Tensor:
        return compute_values(self.c.critic, batch, self.cfg.critic.ppo_micro_batch_size)

    def optimizer_step(
        self, role: str, mini: Batch, norm: LossNormalizer, lr: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One step of the components' optimizer for `role` (its scheduler has set `lr` already)."""
        del lr
        c, settings = self.c, role_settings(role, self.cfg)
        if role == "actor":
            module, optimizer, params = c.policy.model, c.optimizer, c.trainable_params
        else:
            module, optimizer, params = c.critic, c.critic_optimizer, list(c.critic.parameters())
        return optimizer_step(
            mini,
            norm,
            settings.ppo_micro_batch_size,
            micro_step_for(role, self.cfg, module),
            optimizer,
            params,
            settings.grad_clip,
            role,
        )

    def sync_policy(self, model: nn.Module) -> None:
        """Nothing to do: the rollout backend generates with the policy that was just updated."""

    def pull_state(self, c: Any) -> None:
        """Nothing to do: the components are the state."""

    def push_state(self, c: Any) -> None:
        """Nothing to do: the components are the state."""

    def close(self) -> None:
        """Nothing to release."""

    def checksums(self, role: str = "actor") -> list[float]:
        """The sum of `role`'s trainable parameters, as one rank (:meth:`~.ray_group.RayWorkers.checksums`' form)."""
        module = self.c.policy.model if role == "actor" else self.c.critic
        return [float(sum(p.detach().double().sum() for p in module.parameters() if p.requires_grad))]


WORKERS.register("local")(LocalWorkers)


def make_workers(cfg: DictConfig, c: Any) -> Workers:
    """The workers of ``trainer.backend`` for the components `c`; an unknown backend lists the valid ones."""
    return WORKERS.get(cfg.trainer.backend)(cfg, c)
