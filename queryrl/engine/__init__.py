"""The compute both the driver and the workers run: the typed batch, policy/critic forward passes,
micro-batched updates, the optimizer, and the :class:`~queryrl.engine.workers.Workers` protocol with
its in-process implementation (:class:`~queryrl.engine.workers.LocalWorkers`).

``queryrl.trainer`` (the single controller) and ``queryrl.distributed`` (the Ray workers) both import
this package; neither imports the other's internals.
"""
