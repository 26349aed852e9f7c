"""Ray worker groups: a resource pool of placement-group bundles, one actor per bundle joined into one
``torch.distributed`` group, calls on every rank collected in rank order, and failures that fail fast
(:class:`WorkerDiedError`, :class:`WorkerTimeoutError`; see :mod:`.ray_group`). Ray is imported here and
in :mod:`.ray_group` only; the package imports without it."""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from queryrl.distributed.worker import PolicyWorker


class WorkerDiedError(RuntimeError):
    """A worker of the group died (process killed, node lost, out of memory)."""


class WorkerTimeoutError(RuntimeError):
    """A worker call did not finish within ``ray.call_timeout_s``."""


def import_ray() -> Any:
    """``import ray``, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "trainer.backend=ray needs Ray: pip install 'queryrl[ray]' (or pip install 'ray[default]'); "
            "trainer.backend=local needs nothing more"
        ) from e
    return ray


# what a process that dies of a signal or of Python's fatal-error handler writes last (glibc, Ray's handler,
# faulthandler), with Ray's "[time E pid tid] logging.cc:N: " prefix taken off
_FATAL = re.compile(r"Fatal Python error: .*|\*\*\* SIG[A-Z]+ received.*|PC: @ .*|MemoryError.*|terminate called.*")
_RAY_PREFIX = re.compile(r"^\[[^\]]*\] \S+:\d+: ")


def last_words_of(path: str | None, tail_bytes: int = 65536) -> str:
    """The fatal-error lines at the end of a dead worker's standard error file (a segfault's "Fatal Python
    error: Segmentation fault" and the function it died in), joined with " | "; "" where there are none or
    the file is not on this machine (a worker on another node)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(os.path.getsize(path) - tail_bytes, 0))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    found: list[str] = []
    for line in text.splitlines():
        match = _FATAL.search(_RAY_PREFIX.sub("", line.strip()))
        words = " ".join(match.group(0).split()) if match else ""
        if words and words not in found:
            found.append(words)
    return " | ".join(found[-4:])


@dataclass(frozen=True)
class ResourcePool:
    """``nnodes`` x ``workers_per_node`` bundles: one GPU each, or `cpus_per_worker` CPU slots without GPUs."""

    nnodes: int
    workers_per_node: int
    use_gpu: bool
    cpus_per_worker: float
    strategy: str = "PACK"
    name: str = "actor"  # the roles' pool, for messages
    sized_by: str = ""  # the settings that sized it, for messages; "" = trainer.nnodes x trainer.n_gpus_per_node

    @property
    def world_size(self) -> int:
        return self.nnodes * self.workers_per_node

    def bundles(self) -> list[dict[str, float]]:
        bundle: dict[str, float] = {"CPU": self.cpus_per_worker}
        if self.use_gpu:
            bundle["GPU"] = 1.0
        return [dict(bundle) for _ in range(self.world_size)]

    def check(self, available: dict[str, float]) -> None:
        """Raise a clear error when the cluster's resources cannot hold the pool (instead of waiting forever)."""
        need_cpu = self.cpus_per_worker * self.world_size
        need_gpu = float(self.world_size) if self.use_gpu else 0.0
        have_cpu, have_gpu = available.get("CPU", 0.0), available.get("GPU", 0.0)
        if have_cpu < need_cpu or have_gpu < need_gpu:
            sized_by = (
                self.sized_by or f"trainer.nnodes={self.nnodes} x trainer.n_gpus_per_node={self.workers_per_node}"
            )
            raise RuntimeError(
                f"the Ray cluster has {have_cpu:g} CPUs and {have_gpu:g} GPUs left; the {self.name} worker pool "
                f"({sized_by}) needs {need_cpu:g} CPUs (ray.num_cpus_per_worker={self.cpus_per_worker:g} each) and "
                f"{need_gpu:g} GPUs"
            )

    def take(self, available: dict[str, float]) -> dict[str, float]:
        """`available` less what this pool holds (to check the next pool against)."""
        left = dict(available)
        left["CPU"] = left.get("CPU", 0.0) - self.cpus_per_worker * self.world_size
        if self.use_gpu:
            left["GPU"] = left.get("GPU", 0.0) - float(self.world_size)
        return left


class RayWorkerGroup:
    """`pool.world_size` :class:`PolicyWorker` actors placed by a placement group, in one process group.

    Args:
        cfg: the run config.
        pool: where the workers go.
        init_state: per role, the state (:meth:`PolicyWorker.set_state`) every worker loads before
            the process group forms, so that all ranks start from the driver's weights.
        roles: what every worker of this pool holds (``actor``, ``ref``, ``critic``).
    """

    def __init__(
        self,
        cfg: DictConfig,
        pool: ResourcePool,
        init_state: dict[str, dict[str, Any]],
        roles: tuple[str, ...] = ("actor", "ref", "critic"),
    ) -> None:
        ray = import_ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray = ray
        self.pool = pool
        self.roles = roles
        self.timeout_s = float(cfg.ray.call_timeout_s)
        self.world_size = pool.world_size
        self._pg = placement_group(pool.bundles(), strategy=pool.strategy, name="")
        self._remove_pg = remove_placement_group
        self.actors: list[Any] = []
        self.info: list[dict[str, Any]] = [{"rank": r, "pid": "?"} for r in range(self.world_size)]
        try:
            self._wait([self._pg.ready()], "placing the resource pool", ranks=None)
            remote_cls = ray.remote(PolicyWorker)
            plain = OmegaConf.to_container(cfg, resolve=True)
            threads = str(max(int(cfg.ray.num_threads), 1))
            for rank in range(self.world_size):
                actor = remote_cls.options(
                    num_cpus=pool.cpus_per_worker,
                    num_gpus=1 if pool.use_gpu else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._pg, placement_group_bundle_index=rank
                    ),
                    runtime_env={"env_vars": {"OMP_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}},
                    max_restarts=0,
                    max_task_retries=0,
                ).remote(plain, rank, self.world_size, roles)
                self.actors.append(actor)
            for rank, facts in enumerate(self.call_all("process", what="starting the workers")):
                self.info[rank].update(facts)
            for role, state in init_state.items():
                self.call_all("set_state", role, state, what=f"loading the driver's {role} weights")
            host, port = self._wait([self.actors[0].address.remote()], "rendezvous", ranks=[0])[0]
            formed = self.call_all("init_process_group", host, port, what="forming the process group")
            for rank, facts in enumerate(formed):
                self.info[rank].update(facts)
        except BaseException:
            self.shutdown()
            raise

    def call_all(self, method: str, *args: Any, what: str | None = None) -> list[Any]:
        """`method` on every rank with the same arguments; results in rank order."""
        refs = [getattr(a, method).remote(*args) for a in self.actors]
        return self._wait(refs, what or method, ranks=list(range(self.world_size)))

    def call_each(self, method: str, per_rank: list[tuple[Any, ...]], what: str | None = None) -> list[Any]:
        """`method` on rank ``r`` with ``per_rank[r]``; results in rank order."""
        refs = [getattr(a, method).remote(*args) for a, args in zip(self.actors, per_rank, strict=True)]
        return self._wait(refs, what or method, ranks=list(range(self.world_size)))

    def _wait(self, refs: list[Any], what: str, ranks: list[int] | None) -> list[Any]:
        """Results of `refs` in order; fails fast on the first dead worker or past the call timeout."""
        ray = self._ray
        from ray.exceptions import GetTimeoutError, RayActorError

        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        deadline = time.monotonic() + self.timeout_s
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerTimeoutError(
                        f"{what}: {len(pending)} of {len(refs)} worker calls did not finish within "
                        f"ray.call_timeout_s={self.timeout_s:g}s"
                    )
                ready, pending = ray.wait(pending, num_returns=1, timeout=min(left, 5.0))
                for ref in ready:
                    i = index[ref]
                    rank = ranks[i] if ranks is not None else None
                    try:
                        results[i] = ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0))
                    except RayActorError as e:
                        raise self._died(rank, what, e) from e
                    except GetTimeoutError as e:
                        raise WorkerTimeoutError(f"{what}: no result within ray.call_timeout_s") from e
                    except Exception as e:
                        # a live rank's collective fails when its peer died (gloo: "connection reset by peer"):
                        # the dead peer is the cause to report, when one died
                        died = self._dead_peer([r for r in pending if r is not ref], index, ranks, what)
                        if died is not None:
                            raise died from e
                        raise
        except BaseException:
            self.shutdown()  # the other ranks may be blocked in a collective with the lost one
            raise
        return results

    def _died(self, rank: int | None, what: str, error: BaseException) -> WorkerDiedError:
        pool = "" if self.pool.name == "actor" else f"{self.pool.name} "
        who = f"a {pool}worker" if rank is None else f"{pool}worker {rank} (pid {self.info[rank].get('pid', '?')})"
        first_line = str(error).splitlines()[0] if str(error) else ""
        log = None if rank is None else self.info[rank].get("stderr")
        last_words = last_words_of(log)
        return WorkerDiedError(
            f"{who} died during {what!r}: {type(error).__name__}: {first_line}"
            + (f"; its log ({log}) ends: {last_words}" if last_words else "")
        )

    def _dead_peer(
        self, others: list[Any], index: dict[Any, int], ranks: list[int] | None, what: str, wait_s: float = 10.0
    ) -> WorkerDiedError | None:
        """A :class:`WorkerDiedError` for the first of `others` whose actor died (waiting up to `wait_s`
        for Ray to notice), else None."""
        from ray.exceptions import RayActorError

        if not others:
            return None
        ready, _ = self._ray.wait(others, num_returns=len(others), timeout=wait_s)
        for ref in ready:
            try:
                self._ray.get(ref, timeout=1.0)
            except RayActorError as e:
                i = index[ref]
                return self._died(ranks[i] if ranks is not None else None, what, e)
            except Exception:  # another rank's own error: not a death
                continue
        return None

    def shutdown(self) -> None:
        """Kill the actors and free the placement group (safe to call twice)."""
        ray = self._ray
        for actor in self.actors:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(actor, no_restart=True)
        self.actors = []
        if self._pg is not None:
            with contextlib.suppress(Exception):
                self._remove_pg(self._pg)
            self._pg = None
