"""What a killed trainer's sandbox runs leave behind, named after their owner and removed by a later run.

A run's processes die with the trainer (a parent-death signal on each process of the chain,
:func:`queryrl.rewards.scorers.sandbox.dies_with_parent`), but a ``kill -9`` runs no ``finally``: the run's
temporary folders and cgroups stay. Each is therefore named ``queryrl-<kind>-<pid>.<start>-<random>``: the
trainer's process id and its start time (clock ticks after boot, field 22 of ``/proc/<pid>/stat``), so a
process id handed out again later does not pass for the owner. :func:`sweep` (called by runs, at most once a
minute per process) kills what is still in a cgroup whose owner is gone, removes it, and removes such folders
(only the ones this user owns). Folders and cgroups of a live trainer, and ones named otherwise (older
versions of queryrl), are left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time

logger = logging.getLogger(__name__)

SWEEP_EVERY_S = 60.0
KINDS = ("sandbox", "sandbox-probe", "evaluator")  # the folders' kinds; cgroups are "sandbox"
_OWNED = re.compile(r"^queryrl-(?:sandbox|sandbox-probe|evaluator)-(\d+)\.(\d+)-")
_last_sweep = {"at": -SWEEP_EVERY_S}
_lock = threading.Lock()


def start_time(pid: int) -> str | None:
    """The start time of process `pid` (field 22 of ``/proc/<pid>/stat``), or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None  # a zombie is gone


def owner_tag() -> str:
    """``<pid>.<start time>`` of this process: part of every folder and cgroup name a run makes."""
    return f"{os.getpid()}.{start_time(os.getpid()) or 0}"


def owned_name(kind: str, suffix: str) -> str:
    """A cgroup's name: ``queryrl-<kind>-<owner>-<suffix>``."""
    return f"queryrl-{kind}-{owner_tag()}-{suffix}"


def temp_folder(kind: str) -> str:
    """A fresh temporary folder ``queryrl-<kind>-<owner>-XXXXXXXX`` (see :func:`tempfile.mkdtemp`)."""
    return tempfile.mkdtemp(prefix=f"queryrl-{kind}-{owner_tag()}-")


def owner_gone(name: str) -> bool:
    """Whether `name` is an owned name whose owner is no longer running (False for other names)."""
    match = _OWNED.match(name)
    return match is not None and start_time(int(match[1])) != match[2]


def kill_cgroup(folder: str, within_s: float = 2.0) -> None:
    """SIGKILL every process in the cgroup `folder` (v2 ``cgroup.kill``; else each in ``cgroup.procs``,
    until none is left)."""
    with contextlib.suppress(OSError):  # no O_CREAT: v1 and kernels before 5.14 have no cgroup.kill
        fd = os.open(os.path.join(folder, "cgroup.kill"), os.O_WRONLY)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(folder, "cgroup.procs"), encoding="ascii") as f:
                pids = [int(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _remove_cgroup(folder: str, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.rmdir(folder)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def sweep(cgroup_parents: tuple[str | None, ...] = ()) -> list[str]:
    """Remove what runs of trainers that are gone left: their cgroups under `cgroup_parents` (their processes
    killed first) and their folders in the temporary folder. Returns the paths removed."""
    removed = []
    for parent in dict.fromkeys(p for p in cgroup_parents if p is not None):
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                folder = os.path.join(parent, name)
                if owner_gone(name) and os.path.isdir(folder):
                    kill_cgroup(folder)
                    if _remove_cgroup(folder):
                        removed.append(folder)
    base = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            folder = os.path.join(base, name)
            with contextlib.suppress(OSError):
                st = os.lstat(folder)
                if owner_gone(name) and st.st_uid == os.geteuid() and stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(folder, ignore_errors=True)
                    removed.append(folder)
    if removed:
        logger.warning("code sandbox: removed %d leftovers of killed trainers' runs: %s", len(removed), removed[:3])
    return removed


def sweep_now_and_then(cgroup_parents: tuple[str | None, ...] = ()) -> None:
    """:func:`sweep`, at most once every :data:`SWEEP_EVERY_S` seconds in this process (the first call sweeps)."""
    with _lock:
        now = time.monotonic()
        if now - _last_sweep["at"] < SWEEP_EVERY_S:
            return
        _last_sweep["at"] = now
    sweep(cgroup_parents)
