"""glibc malloc settings for a training process: freed memory stays mapped for the next step.

A training step allocates and frees the same tensors again and again (activations, logits, their
gradients: megabytes each). glibc maps blocks above a threshold with ``mmap`` and unmaps them on
``free``, and it returns the heap's free top to the system above a trim threshold; the next step then
touches fresh pages, and every page is a fault and a zeroing. Its dynamic threshold adapts upwards,
but trimming still hands the memory back between steps. Setting both thresholds once (the
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment variables do the same from the
shell; PyTorch's CPU tuning guide suggests a caching allocator for the same reason) keeps blocks
under the threshold in the heap and the freed memory mapped. No number changes: only where memory
comes from.

Only on Linux with glibc, and never over the user's own malloc settings (those environment
variables, or ``GLIBC_TUNABLES`` naming ``glibc.malloc``).
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
TRIM_FACTOR = 4  # freed memory kept at the heap's top: this many times the mmap threshold
MAX_THRESHOLD_MB = 511  # mallopt takes a C int: the trim threshold (4x) must stay under 2 GiB
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_applied: list[int] = []  # the threshold set in this process, if any


def user_malloc_setting() -> str | None:
    """The environment variable through which the user tunes glibc malloc, if any."""
    for name in USER_SETTINGS:
        if name in os.environ:
            return name
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def keep_freed_memory(mmap_threshold_mb: int) -> str:
    """Blocks under `mmap_threshold_mb` MiB come from the heap, and up to ``TRIM_FACTOR`` times that of
    freed memory stays mapped; 0 leaves glibc's defaults. Returns what was done, in words.
    Once per process: a second call with another value keeps the first.

    Raises:
        ValueError: a threshold outside 0..``MAX_THRESHOLD_MB``.
    """
    if not 0 <= mmap_threshold_mb <= MAX_THRESHOLD_MB:
        raise ValueError(f"the malloc mmap threshold must be 0..{MAX_THRESHOLD_MB} MiB, got {mmap_threshold_mb}")
    if mmap_threshold_mb == 0:
        return "glibc malloc: defaults (threshold 0)"
    if _applied:
        return f"glibc malloc: already set ({_applied[0]} MiB)"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "glibc malloc: not this platform's C library; nothing set"
    user = user_malloc_setting()
    if user is not None:
        return f"glibc malloc: left to {user}"
    libc = ctypes.CDLL(None)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return "glibc malloc: no mallopt; nothing set"
    threshold = mmap_threshold_mb * 1024 * 1024
    trim = TRIM_FACTOR * threshold
    if mallopt(M_MMAP_THRESHOLD, threshold) != 1 or mallopt(M_TRIM_THRESHOLD, trim) != 1:
        return f"glibc malloc: mallopt refused {mmap_threshold_mb} MiB; defaults kept"
    _applied.append(mmap_threshold_mb)
    return (
        f"glibc malloc: blocks under {mmap_threshold_mb} MiB from the heap, "
        f"{TRIM_FACTOR * mmap_threshold_mb} MiB of freed memory kept"
    )
