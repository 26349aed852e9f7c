"""Scale-out: worker groups behind the same training loop (``trainer.backend=ray``).

- :mod:`~queryrl.distributed.dispatch`: split a batch by data-parallel rank, concatenate results.
- :mod:`~queryrl.distributed.worker`: :class:`PolicyWorker`, one rank with every role colocated
  (policy + reference + optimizer, critic), gradient sum over a torch.distributed group.
- :mod:`~queryrl.distributed.worker_group`: resource pools, Ray actors, fail-fast collection.
- :mod:`~queryrl.distributed.ray_group`: :class:`RayWorkers` (the trainer's handle) and generation on
  the workers.

Ray is optional: nothing here imports it until a Ray worker group is built.
"""

from queryrl.distributed.dispatch import collect, dispatch, shard_ranges
from queryrl.distributed.ray_group import make_ray_workers  # registers trainer.backend=ray

__all__ = ["collect", "dispatch", "make_ray_workers", "shard_ranges"]
