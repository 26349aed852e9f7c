"""The suite's per-test timeout, scaled to the machine: a correct test must not fail on a slow CPU.

pytest-timeout's limit (``timeout`` in pyproject.toml, 300 s, and each ``@pytest.mark.timeout``) was set on
the development machine: a 2-core AVX512 EPYC whose one-thread 512² float32 matmul runs at about
:data:`REFERENCE_GFLOPS`. An AVX2-only CPU of the same machine kind runs it at a quarter of that, so
``tests/conftest.py`` measures this machine once (:func:`queryrl.machine.machine_info`) and multiplies every
limit by ``REFERENCE_GFLOPS / measured`` (:func:`scaled_timeout`): never below the limit as written, never
above :data:`MAX_FACTOR` times it. With ``timeout_func_only`` the limit covers the test's own body, not its
fixtures' set-up (a shared SFT model built in a fixture counts against nobody's limit).
"""

from __future__ import annotations

import math

# this project's development machine (AMD EPYC, AVX512 + AVX512-BF16, 2 cores): 80-90 GFLOP/s measured by
# queryrl.machine.matmul_gflops("float32") with one other job beside it; an AVX2-only EPYC: about 20
REFERENCE_GFLOPS = 80.0
MAX_FACTOR = 8.0  # a rate measured under a burst of load must not turn a hang into an hour


def timeout_factor(measured_gflops: float, reference_gflops: float = REFERENCE_GFLOPS) -> float:
    """How much longer than on the reference machine a test may take here: ``reference / measured``,
    at least 1, at most :data:`MAX_FACTOR` (a rate that is not a positive number counts as the slowest)."""
    if not (measured_gflops > 0 and math.isfinite(measured_gflops)):
        return MAX_FACTOR
    return min(MAX_FACTOR, max(1.0, reference_gflops / measured_gflops))


def scaled_timeout(limit: float, measured_gflops: float, reference_gflops: float = REFERENCE_GFLOPS) -> float:
    """`limit` (seconds; 0 or less: no limit, kept) scaled by :func:`timeout_factor`, rounded up to a second."""
    if limit <= 0:
        return limit
    return float(math.ceil(limit * timeout_factor(measured_gflops, reference_gflops)))
