"""The code sandbox's cgroups: a process count and a memory limit for the whole sandbox, not per process.

``RLIMIT_AS`` (``memory_mb``) limits each process's address space: four children of 400 MB took
1.7 GB with ``memory_mb=512``. Where a cgroup folder is writable (as root in most containers, or a
delegated cgroup v2 subtree), each run gets fresh cgroups that the sandbox's process 1 joins before
anything forks, so every descendant counts:

- ``pids``: ``pids.max`` = ``max_processes`` (processes and threads; binds root, unlike ``RLIMIT_NPROC``);
- ``memory``: the limit (v1 ``memory.limit_in_bytes``, with swap where accounted; v2 ``memory.max`` and
  ``memory.swap.max`` 0) = ``memory_mb`` for all the sandbox's processes together, its tmpfs files included;
  past it the kernel's OOM killer ends a process in it, and the run's status is ``memory``.

Without a writable memory cgroup, :func:`processes_without_memory_cgroup` caps the process count instead
(:data:`MAX_PROCESSES_WITHOUT_MEMORY_CGROUP` processes of ``memory_mb`` at most), with a warning
at the probe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from queryrl.rewards.scorers.sandbox_leftovers import kill_cgroup, owned_name

logger = logging.getLogger(__name__)

MAX_PROCESSES_WITHOUT_MEMORY_CGROUP = 8  # then the worst case is 8 x memory_mb


def cgroup_parent(controller: str) -> str | None:
    """A writable cgroup folder with `controller` (``pids`` or ``memory``; cgroup v1 or v2), or None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [line.split() for line in f]
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            own = {}
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                for name in names.split(","):
                    own[name] = path
    except (OSError, ValueError):
        return None
    for fields in mounts:
        sep = fields.index("-")
        fstype, options, point = fields[sep + 1], fields[-1].split(","), fields[4]
        if fstype == "cgroup" and controller in options:
            folder = point + own.get(controller, "/")
        elif fstype == "cgroup2" and "" in own:
            folder = point + own[""]
            with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.subtree_control")) as f:
                if controller not in f.read().split():
                    continue
        else:
            continue
        if os.path.isdir(folder) and os.access(folder, os.W_OK):
            return folder
    return None


def _write(folder: str, name: str, value: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(value)


def _memory_limits(folder: str, limit: int) -> None:
    """The memory limit of a fresh cgroup: v2 ``memory.max`` (no swap), v1 ``memory.limit_in_bytes``
    (and ``memory.memsw.limit_in_bytes``, memory + swap, where swap is accounted)."""
    if os.path.exists(os.path.join(folder, "memory.max")):
        _write(folder, "memory.max", str(limit))
        with contextlib.suppress(OSError):
            _write(folder, "memory.swap.max", "0")
        return
    _write(folder, "memory.limit_in_bytes", str(limit))
    if os.path.exists(os.path.join(folder, "memory.memsw.limit_in_bytes")):
        _write(folder, "memory.memsw.limit_in_bytes", str(limit))


@dataclass
class RunCgroups:
    """The cgroups of one run: the folders its process 1 joins, and whether the memory limit was hit."""

    paths: list[str] = field(default_factory=list)
    memory: str | None = None

    def memory_exceeded(self) -> bool:
        """Whether the OOM killer ended a process of the run (v2 ``memory.events`` oom_kill, v1 ``oom_kill`` in
        ``memory.oom_control``, or a failed charge in ``memory.failcnt`` on older kernels)."""
        if self.memory is None:
            return False
        for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(self.memory, name)) as f:
                counts = dict(line.split() for line in f if len(line.split()) == 2)
                if key in counts:
                    return int(counts[key]) > 0
        with contextlib.suppress(OSError, ValueError), open(os.path.join(self.memory, "memory.failcnt")) as f:
            return int(f.read()) > 0
        return False


@contextlib.contextmanager
def run_cgroups(
    pids_parent: str | None, memory_parent: str | None, max_processes: int, memory_bytes: int
) -> Iterator[RunCgroups]:
    """Fresh cgroups under the parents (``pids.max`` = `max_processes`; the memory limit `memory_bytes`),
    removed afterwards. A cgroup that cannot be made is left out with a warning."""
    made = RunCgroups()
    name = owned_name("sandbox", secrets.token_hex(6))  # a later run removes it if this trainer is killed
    for parent, kind in ((pids_parent, "pids"), (memory_parent, "memory")):
        if parent is None:
            continue
        folder = os.path.join(parent, name)
        try:
            if not os.path.isdir(folder):  # cgroup v2: one folder for both controllers
                os.mkdir(folder)
            if kind == "pids":
                _write(folder, "pids.max", str(max_processes))
            else:
                _memory_limits(folder, memory_bytes)
                made.memory = folder
        except OSError as e:
            logger.warning("code sandbox: cannot make a %s cgroup in %s (%s); no such limit", kind, parent, e)
            continue
        if folder not in made.paths:
            made.paths.append(folder)
    try:
        yield made
    finally:
        for folder in made.paths:
            kill_cgroup(folder)  # nothing is left in it when the run ended normally
            remove_cgroup(folder)


def remove_cgroup(folder: str, within_s: float = 10.0) -> None:
    """rmdir a cgroup: busy for a moment after its last process was reaped (the release is deferred; after an
    out-of-memory kill of hundreds of MB on a loaded machine, 2 s was once not enough)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if time.monotonic() > deadline:
                logger.warning("code sandbox: cannot remove the cgroup %s: %s", folder, e)
                return
            time.sleep(0.005)


def processes_without_memory_cgroup(max_processes: int, memory_parent: str | None) -> int:
    """The process count a run may use: `max_processes`, capped at :data:`MAX_PROCESSES_WITHOUT_MEMORY_CGROUP`
    where no memory cgroup bounds their sum."""
    return max_processes if memory_parent is not None else min(max_processes, MAX_PROCESSES_WITHOUT_MEMORY_CGROUP)
