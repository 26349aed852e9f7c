"""The sandbox dies with its trainer and shares nothing with it (issue 52 items 2 and 5).

- a trainer killed with SIGKILL in the middle of a run takes every process of the run with it (unshare, the
  sandboxed interpreter, the evaluator), and a later run removes the folders and cgroups it left;
- the code's stdin is read-only (it wrote 16 MiB to the host's /tmp through ``os.write(0, ...)``);
- a key in the trainer's session keyring is out of the code's reach.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from queryrl.rewards.scorers import sandbox, sandbox_leftovers
from queryrl.rewards.scorers.code import namespaces_available, run_code
from tests.rewards.helpers import running_with

ISOLATED = namespaces_available()
MODES = [
    pytest.param("auto", marks=pytest.mark.skipif(not ISOLATED, reason="no isolation works here (runs are refused)")),
    "none",
]
# the trainer: an assert test, so that the evaluator runs too, against a solution that sleeps before serving
TRAINER = textwrap.dedent(
    """
    import logging, sys
    logging.disable(logging.WARNING)
    from queryrl.rewards.scorers.code import compute_score
    sleeper = "```python\\nimport time\\ntime.sleep(600)\\ndef f(x):\\n    return x\\n```"
    compute_score("code", sleeper, "assert f(1) == 1", timeout_s=300, isolation=sys.argv[1])
    """
)
NEXT_RUN = (
    "import sys\nfrom queryrl.rewards.scorers.code import run_code\nprint(run_code('print(1)', isolation=sys.argv[1]))"
)


def _processes() -> dict[int, tuple[int, str, bytes]]:
    """pid -> (parent pid, start time, command line) of every live process (zombies left out)."""
    out = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if fields[0] != "Z":
            out[int(name)] = (int(fields[1]), fields[19], cmdline)
    return out


def _descendants(root: int) -> dict[int, tuple[int, str, bytes]]:
    table, found, frontier = _processes(), {}, {root}
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in table.items() if ppid in frontier and pid not in found}
        found.update({pid: table[pid] for pid in frontier})
    return found


def _alive(processes: dict[int, tuple[int, str, bytes]]) -> list[bytes]:
    now = _processes()
    return [cmd[:80] for pid, (_, start, cmd) in processes.items() if pid in now and now[pid][1] == start]


@pytest.mark.slow
@pytest.mark.parametrize("isolation", MODES)
def test_the_sandbox_dies_with_its_trainer_and_a_later_run_removes_what_it_left(isolation: str, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its folders: only this test's, and a marker in command lines
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, isolation], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:  # the run is up: the evaluator and the sandboxed interpreter are running
            chain = _descendants(trainer.pid)
            cmdlines = b"".join(cmd for _, _, cmd in chain.values())
            if b"class SolutionGone" in cmdlines and b"def _out_of_cpu" in cmdlines:
                break
            assert trainer.poll() is None, trainer.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, cmdlines[-2000:]
            time.sleep(0.1)
        time.sleep(0.5)  # the sleeper is asleep
        chain = _descendants(trainer.pid)
        trainer.kill()
        trainer.wait()
    finally:
        trainer.kill()
        trainer.stderr.close()  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + 5
        while (_alive(chain) or running_with(str(tmp_path))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(chain) == []  # unshare and the sandboxed python stayed: RLIMIT_CPU does not stop a sleeper
        assert not running_with(str(tmp_path))
    finally:  # what this test started, should it have stayed
        now = _processes()
        for pid, (_, start, _) in chain.items():
            if pid in now and now[pid][1] == start:
                os.kill(pid, signal.SIGKILL)

    owner = f"{trainer.pid}."
    left = sorted(p.name.split("-")[1] for p in tmp_path.iterdir() if p.name.split("-")[-2].startswith(owner))
    assert left == ["evaluator", "sandbox"]  # a kill -9 runs no `finally`
    iso = sandbox.probe(sys.executable) if isolation != "none" else None
    parents = [] if iso is None else [iso.cgroup_parent, iso.memory_parent]
    cgroups = [Path(p, n) for p in parents if p for n in os.listdir(p) if n.startswith(f"queryrl-sandbox-{owner}")]
    assert len(cgroups) == len({p for p in parents if p})

    later = subprocess.run([sys.executable, "-c", NEXT_RUN, isolation], env=env, capture_output=True, timeout=60)
    assert later.returncode == 0, later.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("queryrl-")] == []
    assert [c for c in cgroups if c.exists()] == []


def test_every_process_of_the_chain_gets_a_parent_death_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal comes when the trainer's thread that started the chain ends: here a short thread. Both ways
    to set it: setpriv, and the Python program where setpriv is missing."""
    ways = [False, True] if sandbox._setpriv() is not None else [True]
    for without_setpriv in ways:
        if without_setpriv:
            monkeypatch.setattr(sandbox, "_setpriv", lambda: None)
        started: list[subprocess.Popen[bytes]] = []
        cmd = sandbox.dies_with_parent(["sleep", "30"], sys.executable)
        release = threading.Event()

        def start() -> None:
            started.append(subprocess.Popen(cmd))  # noqa: B023
            release.wait(timeout=30)  # noqa: B023

        thread = threading.Thread(target=start)
        thread.start()
        deadline = time.monotonic() + 10
        while not started or Path(f"/proc/{started[0].pid}/comm").read_text() != "sleep\n":
            assert time.monotonic() < deadline  # the chain has run up to the command: the setting is made
            time.sleep(0.01)
        release.set()
        thread.join()
        try:
            assert started[0].wait(timeout=10) == -9, cmd[:3]
        finally:
            started[0].kill()
            started[0].wait()


def test_a_sweep_removes_only_what_dead_owners_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["sleep", "30"])
    dead_tag = f"{dead.pid}.{sandbox_leftovers.start_time(dead.pid)}"
    dead.kill()
    dead.wait()
    assert re.fullmatch(r"\d+\.\d+", dead_tag)
    mine = Path(sandbox_leftovers.temp_folder("sandbox"))
    stale = [tmp_path / f"queryrl-sandbox-{dead_tag}-abc", tmp_path / f"queryrl-evaluator-{dead_tag}-abc"]
    others = tmp_path / f"queryrl-sandbox-{dead_tag}-other"  # another user's: never ours to remove
    unnamed = tmp_path / "queryrl-sandbox-1a2b3c"  # an older version's name: no owner to check
    cgroup_parent = tmp_path / "cgroups"
    stale_cgroup, live_cgroup = (
        cgroup_parent / f"queryrl-sandbox-{dead_tag}-1",
        cgroup_parent / f"queryrl-sandbox-{sandbox_leftovers.owner_tag()}-1",
    )
    for folder in [*stale, others, unnamed, stale_cgroup, live_cgroup]:
        folder.mkdir(parents=True)
    (stale[0] / "work").mkdir()
    os.chown(others, 65534, 65534)
    removed = sandbox_leftovers.sweep((str(cgroup_parent), None))
    assert sorted(removed) == sorted(map(str, [*stale, stale_cgroup]))
    assert all(p.exists() for p in (mine, others, unnamed, live_cgroup))


@pytest.mark.parametrize("isolation", MODES)
def test_stdin_cannot_be_written(isolation: str) -> None:
    code = textwrap.dedent(
        """
        import os, sys
        for what, write in (("fd 0", lambda: os.write(0, b"x" * 4096)),
                            ("reopened", lambda: open("/proc/self/fd/0", "r+b", buffering=0).write(b"x" * 4096)),
                            ("truncated", lambda: os.ftruncate(0, 0))):
            try:
                write()
                print(what, "written")
            except OSError as e:
                print(what, "refused", e.errno)
        os.lseek(0, 0, 0)
        print("stdin:", sys.stdin.read())
        """
    )
    result = run_code(code, stdin="hello", isolation=isolation)  # type: ignore[arg-type]
    assert result.status == "ok", result.stderr
    assert "written" not in result.stdout
    assert result.stdout.count("refused") == 3
    assert result.stdout.endswith("stdin: hello\n")


_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219}
_ADD_KEY = {"x86_64": 248, "aarch64": 217, "riscv64": 217}


@pytest.mark.parametrize("isolation", MODES)
def test_the_trainers_session_keyring_is_out_of_reach(isolation: str) -> None:
    machine = platform.machine()
    if machine not in _KEYCTL:
        pytest.skip(f"no keyctl syscall numbers for {machine} in this test")
    libc = ctypes.CDLL(None, use_errno=True)
    name, secret = f"queryrl-test-{uuid.uuid4().hex}".encode(), uuid.uuid4().hex.encode()
    key = libc.syscall(_ADD_KEY[machine], b"user", name, secret, len(secret), -3)  # KEY_SPEC_SESSION_KEYRING
    if key < 0:
        pytest.skip(f"the kernel refuses keyrings here (add_key: {os.strerror(ctypes.get_errno())})")
    code = textwrap.dedent(
        f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(64)
        print("read", libc.syscall({_KEYCTL[machine]}, 11, {key}, buf, 64), buf.value.decode())  # KEYCTL_READ
        print("search", libc.syscall({_KEYCTL[machine]}, 10, -3, b"user", {name!r}, 0))  # KEYCTL_SEARCH
        """
    )
    try:
        result = run_code(code, isolation=isolation)  # type: ignore[arg-type]
    finally:
        libc.syscall(_KEYCTL[machine], 21, key)  # KEYCTL_INVALIDATE: the test's key leaves the session
    assert result.status == "ok", result.stderr
    if isolation == "none":  # unisolated, the code shares the trainer's session keyring: the opt-out's risk
        assert secret.decode() in result.stdout
        return
    assert secret.decode() not in result.stdout
    assert "read -1" in result.stdout
    assert "search -1" in result.stdout
