"""OS isolation for the code sandbox (:mod:`queryrl.rewards.scorers.code`): namespaces, a private root, limits.

An isolated run is one command line::

    unshare --user --map-root-user --mount --net --pid --ipc --uts --fork --kill-child \\
        python -I -c CONFINE+RUNNER SPEC ...

``CONFINE`` (below) runs first, as process 1 of the new PID namespace, before the code and
before anything can fork. Holding the capabilities of its own user namespace, it:

1. joins fresh ``pids`` and ``memory`` cgroups the trainer made (where a cgroup is writable here;
   :mod:`queryrl.rewards.scorers.sandbox_cgroups`): the process-count limit, which binds root too
   (``RLIMIT_NPROC`` does not), and ``memory_mb`` for all its processes together; then a fresh session
   keyring (the trainer's was inherited: a key added to it was readable);
2. builds a private root on a small tmpfs: read-only bind mounts of the system directories
   (``/usr``, ``/lib*``, ``/bin``, ``/sbin``), the interpreter's prefixes (the venv and its base
   Python) and ``/etc/ld.so.cache``; a few device nodes; private tmpfs folders (64 MiB each:
   ``/tmp`` and the working folder, which holds copies of the run's files at the host path; 16 MiB
   ``/dev/shm``), so the code writes nothing to the host's disk; and a fresh ``/proc`` that shows
   only the sandbox's processes, its parts that reach the host kernel read-only (``/proc/sys``,
   ``/proc/sysrq-trigger``, ``/proc/irq``, ``/proc/bus``, ``/proc/fs``: the sandbox's uid 0 is the host's
   root when the trainer runs as root, and these files' owner may write them without a capability);
   no ``/sys`` at all;
3. ``pivot_root``\\s into it and detaches the old root, so nothing else of the host's
   filesystem is reachable (no ``/etc/passwd``, no home, no repository, no run folder);
4. drops every capability (bounding set, ambient, effective/permitted/inheritable) and sets
   ``no_new_privs``, so the code cannot remount anything writable, mount, ``mknod``, or gain
   privileges back through a set-uid program.

When process 1 (the code) exits, the kernel kills every process left in the namespace
(``setsid`` double-forked daemons included), and ``--kill-child`` kills process 1 when
``unshare`` dies: when the trainer kills it on a timeout, or when the trainer dies (``unshare`` starts
with a parent-death signal, :func:`dies_with_parent`). The network namespace has only a loopback that is
down, so no connection leaves it, from the code or from any child process.

Without ``unshare``, or where user (and mount) namespaces are refused, no isolation works:
runs are then refused unless the user opted out with ``isolation=none``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import platform
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Literal

from queryrl.rewards.scorers.sandbox_cgroups import MAX_PROCESSES_WITHOUT_MEMORY_CGROUP, cgroup_parent, run_cgroups
from queryrl.rewards.scorers.sandbox_leftovers import temp_folder


class SandboxError(RuntimeError):
    """The sandbox refused or failed to start (no isolation here, or its set-up failed): not a wrong answer."""


logger = logging.getLogger(__name__)

MAX_PROCESSES = 64  # per run: processes and threads (the pids cgroup counts threads)
PROBE_MEMORY_BYTES = 256 << 20  # the probe's memory cgroup: enough to start the interpreter
UNSHARE_FLAGS = ("--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child")
# the system directories every interpreter needs; symlinks (merged /usr) are recreated as links
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# pivot_root(2) has no libc wrapper: its syscall number per architecture
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_KEYCTL = {"x86_64": 250, "aarch64": 219, "arm64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}

HOW_TO_GET_ISOLATION = (
    "to get isolation, let this process create user namespaces (sysctl user.max_user_namespaces > 0 and, "
    "on Debian/Ubuntu, kernel.unprivileged_userns_clone=1 / kernel.apparmor_restrict_unprivileged_userns=0) "
    "or run it as root / with CAP_SYS_ADMIN (a container: --cap-add SYS_ADMIN, or a seccomp profile that "
    "allows unshare and mount), with util-linux's `unshare` on PATH; or set isolation=none "
    "(reward.kwargs.isolation=none for the code reward, `config: {isolation: none}` for the python tool) "
    "to run model-written code with the trainer's rights, at your own risk"
)

# Runs inside the namespaces before the code. Its argument (argv[1], removed) is a JSON spec:
# {"root": mountpoint, "work": the working folder (its files are copied in), "binds": [paths], "devices": [paths],
#  "cgroups": [dirs], "pivot_root": syscall number, "ready_fd": fd or null}. Success is told
# on ready_fd (closed before the code runs, so the code cannot fake it); a failure exits 125
# with one line on stderr.
CONFINE = r"""
import ctypes, json, os, sys
def _confine(spec):
    libc = ctypes.CDLL(None, use_errno=True)
    def check(rc, what):
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))
    def mount(src, dst, fstype, flags, data=None):
        enc = lambda s: s.encode() if s is not None else None
        check(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount " + dst)
    RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, PRIVATE, REC = 1, 2, 4, 8, 32, 4096, 1 << 18, 1 << 14
    # flags of the source mount that a user namespace may not clear (statvfs ST_* -> MS_*)
    LOCKED = ((2, NOSUID), (4, NODEV), (8, NOEXEC), (1024, 1024), (2048, 2048), (4096, 1 << 21))
    def bind(src, dst):  # read-only
        mount(src, dst, None, BIND)
        keep = sum(ms for st, ms in LOCKED if os.statvfs(src).f_flag & st)
        mount(None, dst, None, REMOUNT | BIND | keep | RDONLY)
    for folder in spec["cgroups"]:  # before anything forks: every descendant counts (pids.max, memory)
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write("0")
    # a fresh, empty session keyring (KEYCTL_JOIN_SESSION_KEYRING, NULL): the trainer's, inherited through fork
    # and exec, and the keys in it are out of reach. ENOSYS/EPERM: no keyrings here (a seccomp filter binds the
    # code too)
    if libc.syscall(spec["keyctl"], 1, None) < 0 and ctypes.get_errno() not in (1, 38):
        check(-1, "a fresh session keyring")
    last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())
    root = spec["root"]
    mount(None, "/", None, REC | PRIVATE)
    mount("tmpfs", root, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
    os.makedirs(root + "/tmp")  # first: a bind below /tmp (a virtualenv under /tmp) then lies on top of it
    mount("tmpfs", root + "/tmp", "tmpfs", NOSUID | NODEV, "size=64m,mode=1777")
    for path in spec["binds"]:
        target = root + path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.islink(path):
            os.symlink(os.readlink(path), target)
        elif os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
            bind(path, target)
        elif os.path.exists(path):
            open(target, "w").close()
            bind(path, target)
    for sub in ("dev", "proc"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    mount("tmpfs", root + "/dev", "tmpfs", NOSUID | NOEXEC, "size=64k,mode=755")
    for path in spec["devices"]:
        open(root + path, "w").close()
        mount(path, root + path, None, BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root + "/dev/" + name)
    os.makedirs(root + "/dev/shm")
    mount("tmpfs", root + "/dev/shm", "tmpfs", NOSUID | NODEV, "size=16m,mode=1777")
    # the working folder: a private tmpfs (bounded, never the host's disk) holding copies of the run's files
    files = {name: open(os.path.join(spec["work"], name), "rb").read() for name in os.listdir(spec["work"])}
    work = root + spec["work"]
    os.makedirs(work, exist_ok=True)
    mount("tmpfs", work, "tmpfs", NOSUID | NODEV, "size=64m,mode=700")
    for name, data in files.items():
        with open(os.path.join(work, name), "wb") as f:
            f.write(data)
    mount("proc", root + "/proc", "proc", NOSUID | NODEV | NOEXEC)  # this PID namespace's only
    # what in /proc writes to the host kernel, not to this namespace (sysctls, sysrq, IRQ affinity, PCI, nfsd):
    # read-only. The sandbox's uid 0 may be the host's root (the trainer runs as root), and the owner of these
    # files may write them without any capability
    for name in ("sys", "sysrq-trigger", "irq", "bus", "fs"):
        path = root + "/proc/" + name
        if os.path.exists(path):
            mount(path, path, None, BIND | REC)
            mount(None, path, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV | NOEXEC)
    os.chdir(root)
    check(libc.syscall(spec["pivot_root"], b".", b"."), "pivot_root")
    check(libc.umount2(b".", 2), "detach the old root")  # MNT_DETACH
    os.chdir("/")
    mount(None, "/", None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)
    mount(None, "/dev", None, REMOUNT | BIND | RDONLY | NOSUID | NOEXEC)
    os.chdir(spec["work"])
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")  # PR_SET_NO_NEW_PRIVS
    for cap in range(last_cap + 1):
        check(libc.prctl(24, cap, 0, 0, 0), "drop capability %d" % cap)  # PR_CAPBSET_DROP
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL (EINVAL before 4.3)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    check(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")  # no capability left
    if spec["ready_fd"] is not None:
        os.write(spec["ready_fd"], b"1")
        os.close(spec["ready_fd"])
try:
    _confine(json.loads(sys.argv.pop(1)))
except BaseException as e:
    os.write(2, ("queryrl sandbox setup failed: %s\n" % (e,)).encode())
    os._exit(125)
del _confine
"""
SETUP_FAILED_RC = 125


@dataclass(frozen=True)
class Isolation:
    """How isolated runs start here (probed once per interpreter)."""

    prefix: tuple[str, ...]  # the unshare command line before the interpreter
    binds: tuple[str, ...]  # host paths the private root shows, read-only
    cgroup_parent: str | None  # where per-run pids cgroups are made; None: no process-count limit
    memory_parent: str | None = None  # where per-run memory cgroups are made; None: RLIMIT_AS per process only


def _interpreter_paths(python: str) -> list[str]:
    """The folders `python` needs: its prefixes (a venv and its base) and its real executable's folder."""
    code = (
        "import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"
    )
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, timeout=30, check=True)
    paths = [os.path.realpath(p) for p in json.loads(out.stdout)] + json.loads(out.stdout)
    paths.append(os.path.dirname(os.path.realpath(shutil.which(python) or python)))
    return paths


def _bind_list(python: str) -> tuple[str, ...]:
    """System paths plus the interpreter's, without one that another already contains."""
    wanted = [p for p in SYSTEM_PATHS if os.path.lexists(p)]
    for path in _interpreter_paths(python):
        covered = any(path == w or path.startswith(w.rstrip("/") + "/") for w in wanted if not os.path.islink(w))
        if path not in wanted and not covered and path != "/":
            wanted.append(path)
    return tuple(wanted)


def confine_spec(iso: Isolation, root: str, work: str, cgroups: list[str], ready_fd: int | None = None) -> str:
    """The JSON argument of :data:`CONFINE`."""
    spec = {
        "root": root,
        "work": work,
        "binds": list(iso.binds),
        "devices": [d for d in DEVICES if os.path.exists(d)],
        "cgroups": cgroups,
        "pivot_root": _PIVOT_ROOT.get(platform.machine(), -1),
        "keyctl": _KEYCTL.get(platform.machine(), -1),
        "ready_fd": ready_fd,
    }
    return json.dumps(spec)


class IsolationUnavailable(RuntimeError):
    """No isolation mechanism works here (the message says why and how to get one)."""


def _try(
    prefix: tuple[str, ...], binds: tuple[str, ...], python: str, pids: str | None, memory: str | None = None
) -> str | None:
    """Run a confined ``print('ok')``: None when it works, else the last line it printed on stderr."""
    iso = Isolation(prefix, binds, pids, memory)
    base = temp_folder("sandbox-probe")
    try:
        root, work = os.path.join(base, "root"), os.path.join(base, "work")
        os.mkdir(root)
        os.mkdir(work)
        with run_cgroups(pids, memory, MAX_PROCESSES, PROBE_MEMORY_BYTES) as cgroups:
            cmd = [*prefix, python, "-I", "-c", CONFINE + "print('ok')", confine_spec(iso, root, work, cgroups.paths)]
            try:
                done = subprocess.run(
                    dies_with_parent(cmd, python), capture_output=True, timeout=30, cwd=work,
                    env={"PATH": "/usr/bin:/bin"}, start_new_session=True,
                )  # fmt: skip
            except (OSError, subprocess.SubprocessError) as e:
                return f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if done.returncode == 0 and done.stdout.strip() == b"ok":
        return None
    return (done.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit code {done.returncode}"])[-1]


@functools.cache
def probe(python: str) -> Isolation:
    """The isolation that works here for `python` (probed once: a confined ``print('ok')``).

    Raises:
        IsolationUnavailable: none works; the message names the reason and the ways out.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        raise IsolationUnavailable(f"code sandbox: no `unshare` (util-linux) on PATH; {HOW_TO_GET_ISOLATION}")
    if platform.machine() not in _PIVOT_ROOT:
        raise IsolationUnavailable(f"code sandbox: no pivot_root syscall number for {platform.machine()}")
    try:
        binds = _bind_list(python)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        raise IsolationUnavailable(f"code sandbox: cannot run {python}: {e}") from None
    prefixes: list[tuple[str, ...]] = [(unshare, "--user", "--map-root-user", *UNSHARE_FLAGS)]
    if os.geteuid() == 0:  # root without user namespaces (e.g. max_user_namespaces=0) can still confine
        prefixes.append((unshare, *UNSHARE_FLAGS))
    errors: list[str] = []
    for prefix in prefixes:
        error = _try(prefix, binds, python, None)
        if error is not None:
            errors.append(f"`{' '.join(prefix[:3])} ...`: {error}")
            continue
        parent = cgroup_parent("pids")
        if parent is not None and (cgroup_error := _try(prefix, binds, python, parent)) is not None:
            logger.warning("code sandbox: cannot use the pids cgroup %s (%s)", parent, cgroup_error)
            parent = None
        if parent is None:
            logger.warning("code sandbox: no writable pids cgroup: only RLIMIT_NPROC limits processes (not as root)")
        memory = cgroup_parent("memory")
        if memory is not None and (cgroup_error := _try(prefix, binds, python, None, memory)) is not None:
            logger.warning("code sandbox: cannot use the memory cgroup %s (%s)", memory, cgroup_error)
            memory = None
        if memory is None:
            logger.warning(
                "code sandbox: no writable memory cgroup: memory_mb limits each process (RLIMIT_AS), not the "
                "sandbox, so a run may start at most %d processes",
                MAX_PROCESSES_WITHOUT_MEMORY_CGROUP,
            )
        if "--user" not in prefix:  # the fallback: said once (probe is cached per interpreter)
            logger.warning(
                "code sandbox: user namespaces are refused here (%s); confining without one: the sandboxed "
                "code's root is the host's root inside the other namespaces (allow user namespaces, e.g. "
                "sysctl user.max_user_namespaces=15000, to map it to an unprivileged user)",
                errors[0],
            )
        return Isolation(prefix, binds, parent, memory)
    raise IsolationUnavailable(f"code sandbox: no isolation works here ({'; '.join(errors)}); {HOW_TO_GET_ISOLATION}")


@functools.cache
def warn_unisolated() -> None:
    """One warning per process for ``isolation=none``."""
    logger.warning(
        "code sandbox: isolation=none: model-written code runs with the trainer's rights (it can read files "
        "and other processes' environments, signal the trainer, reach local servers through a subprocess, "
        "and leave processes behind); only the Python network guard and resource limits apply"
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group `proc` leads (in isolated runs, unshare and process 1: the namespace dies)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # a group's id is not handed out again while a member lives


def collect_output(
    proc: subprocess.Popen[bytes], deadline: float, max_output: int
) -> tuple[bytes, bytes, Literal["exited", "timeout", "output_limit"]]:
    """Read stdout and stderr until it exits and they are drained (or the deadline, or the cap).

    ``poll`` rather than ``select``: a trainer may hold more than 1024 file descriptors.
    """
    assert proc.stdout is not None
    assert proc.stderr is not None
    fds = (proc.stdout.fileno(), proc.stderr.fileno())
    buffers = {fd: bytearray() for fd in fds}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    open_fds = set(fds)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(buffers[fds[0]]), bytes(buffers[fds[1]]), "timeout"
        exited = proc.poll() is not None
        events = poller.poll(0 if exited else min(left, 0.05) * 1000)
        if exited and not events:
            break  # it exited and its output is drained: a child it left holding the pipe is not waited for
        for fd, _ in events:
            chunk = os.read(fd, 65536)
            buffers[fd] += chunk
            if not chunk:  # EOF (POLLHUP with nothing left to read)
                poller.unregister(fd)
                open_fds.discard(fd)
            elif len(buffers[fd]) > max_output:
                return bytes(buffers[fds[0]][:max_output]), bytes(buffers[fds[1]][:max_output]), "output_limit"
    return bytes(buffers[fds[0]]), bytes(buffers[fds[1]]), "exited"


# The first program of every process chain the sandbox starts, where `setpriv` (util-linux) is missing: it asks
# the kernel for SIGKILL when its parent (the trainer's thread that started it, which waits for it) dies, checks
# that this parent is still there, then execs the chain (unshare, the evaluator, the unisolated runner). The
# setting survives exec (prctl(2): cleared for set-user-ID programs and credential changes only), and
# `unshare --kill-child` passes it on to the namespace's process 1, whose end kills every process in it.
PARENT_DEATH = r"""
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0) != 0 or os.getppid() != int(sys.argv[1]):
    os._exit(125)  # PR_SET_PDEATHSIG SIGKILL failed, or the parent is gone already: nothing to run for
os.execvp(sys.argv[2], sys.argv[2:])
"""


@functools.cache
def _setpriv() -> str | None:
    """`setpriv` when it can set a parent-death signal here (util-linux 2.33 or later), else None."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    try:
        done = subprocess.run([setpriv, "--pdeathsig", "KILL", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return setpriv if done.returncode == 0 else None


def dies_with_parent(cmd: list[str], python: str) -> list[str]:
    """`cmd` started so that it gets SIGKILL when the thread that starts it (the trainer's) dies.

    ``setpriv --pdeathsig KILL`` where it works (5 ms); else :data:`PARENT_DEATH` in `python` (about 40 ms on a
    loaded machine), which also checks that the parent did not die before the setting was made. setpriv
    cannot check that: a trainer killed in the millisecond between the fork and setpriv's prctl leaves the run
    going until its code ends or a later run kills its cgroup (:mod:`~.sandbox_leftovers`).
    """
    setpriv = _setpriv()
    if setpriv is not None:
        return [setpriv, "--pdeathsig", "KILL", *cmd]
    return [python, "-I", "-S", "-c", PARENT_DEATH, str(os.getpid()), *cmd]


def sealed_input(data: bytes) -> int:
    """A read-only descriptor of `data`, for a child's stdin: a sealed memfd, never a file of the host.

    No write, resize or new seal is possible, even on a read-write descriptor opened again through
    ``/proc/self/fd/0`` (a read-only file of the host's ``/tmp`` could be: its owner, the sandbox's uid 0 as
    root, may reopen and chmod it). The caller closes it.
    """
    fd = os.memfd_create("queryrl-stdin", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        read_only = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)  # offset 0
    finally:
        os.close(fd)
    return read_only
