"""The sandbox's isolation (issue 14 items 11-12): opt-in unisolated mode, each attack, the private root.

Each attack runs against the default mode and, where it shows that the test can fail, against
``isolation="none"`` too, where it succeeds (the risk that mode's warning names).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import queryrl
from queryrl.agent import ToolError
from queryrl.agent.builtin_tools import python as python_tool
from queryrl.rewards.scorers import code as code_module
from queryrl.rewards.scorers import sandbox
from queryrl.rewards.scorers.code import SandboxError, compute_score, namespaces_available, run_code
from tests.rewards.helpers import running_with

ISOLATED = namespaces_available()
needs_isolation = pytest.mark.skipif(not ISOLATED, reason="no isolation works here (runs are refused)")
REPO = Path(queryrl.__file__).resolve().parents[1]
DOUBLE = "```python\nprint(int(input()) * 2)\n```"


def _clear_probes() -> None:
    sandbox.probe.cache_clear()
    code_module._refusal.cache_clear()
    sandbox.warn_unisolated.cache_clear()


@pytest.fixture
def no_isolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[None]:
    """A machine where isolation does not work: `unshare` missing, or refused like in a container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if request.param == "refused":
        fake = bin_dir / "unshare"
        fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bin_dir))
    _clear_probes()
    yield
    monkeypatch.undo()
    _clear_probes()


def kill_with(token: str) -> None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    os.kill(int(pid), 9)
        except (OSError, ProcessLookupError):
            continue


def run_as_trainer(
    code: str, isolation: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A separate 'trainer' process that runs `code` in the sandbox and reports what it got back.

    Its temporary folders go under `tmp_path`: a trainer that gets killed leaves them behind.
    """
    driver = textwrap.dedent(
        f"""
        import logging, sys
        logging.disable(logging.WARNING)
        from queryrl.rewards.scorers.code import run_code
        result = run_code(sys.stdin.read(), isolation={isolation!r}, timeout_s=10.0)
        print(result.stdout)
        print("trainer alive:", result.status)
        """
    )
    return subprocess.run(
        [sys.executable, "-c", driver], input=code, capture_output=True, text=True, timeout=60,
        env={**os.environ, "TMPDIR": str(tmp_path), **(env or {})},
    )  # fmt: skip


# ---- item 11: no silent fallback to unisolated runs ----


@pytest.mark.parametrize("no_isolation", ["missing", "refused"], indirect=True)
def test_default_refuses_to_run_without_isolation(no_isolation: None) -> None:
    result = run_code("print('ran')")
    assert result.status == "sandbox_error"
    assert result.stdout == ""
    for hint in ("unshare", "CAP_SYS_ADMIN", "isolation=none", "at your own risk"):
        assert hint in result.stderr
    assert run_code("print('ran')", isolation="namespace").status == "sandbox_error"
    # the reward fails the sample (dropped, never scored 0) and the tool tells the model why
    with pytest.raises(SandboxError, match="isolation=none"):
        compute_score("code", DOUBLE, [{"input": "2", "output": "4"}])
    with pytest.raises(ToolError, match="sandbox_error"):
        python_tool({"code": "print(1)"})


@pytest.mark.parametrize("no_isolation", ["refused"], indirect=True)
def test_the_refusal_names_why_the_probe_failed(no_isolation: None) -> None:
    assert "Operation not permitted" in run_code("print(1)").stderr


@pytest.mark.skipif(not ISOLATED or os.geteuid() != 0, reason="the fallback without a user namespace is for root")
def test_the_fallback_without_a_user_namespace_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Root where user namespaces are refused (an `unshare` that refuses ``--user``) still confines, and says so."""
    real = subprocess.run(["sh", "-c", "command -v unshare"], capture_output=True, text=True).stdout.strip()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "unshare"
    fake.write_text(
        '#!/bin/sh\ncase " $* " in *" --user "*) echo "unshare: unshare failed: Operation not permitted" >&2; '
        f'exit 1;; esac\nexec {real} "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    _clear_probes()
    try:
        with caplog.at_level(logging.WARNING, logger="queryrl.rewards.scorers.sandbox"):
            first, second = run_code("print('ran')"), run_code("print('ran')")
    finally:
        monkeypatch.undo()
        _clear_probes()
    assert (first.status, first.stdout, second.status) == ("ok", "ran\n", "ok")
    warnings = [r.getMessage() for r in caplog.records if "user namespaces are refused" in r.getMessage()]
    assert len(warnings) == 1
    assert "Operation not permitted" in warnings[0]
    assert "host's root" in warnings[0]


@pytest.mark.parametrize("no_isolation", ["refused"], indirect=True)
def test_isolation_none_is_explicit_and_warns_once(no_isolation: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="queryrl.rewards.scorers.sandbox"):
        first = run_code("print('ran')", isolation="none")
        second = run_code("print('ran')", isolation="none")
    assert (first.status, first.stdout, first.isolation) == ("ok", "ran\n", "none")
    assert second.status == "ok"
    warnings = [r for r in caplog.records if "isolation=none" in r.getMessage()]
    assert len(warnings) == 1
    assert "trainer's rights" in warnings[0].getMessage()


def test_an_unknown_isolation_value_is_an_error() -> None:
    with pytest.raises(ValueError, match="isolation must be one of auto, namespace, none; got 'off'"):
        run_code("print(1)", isolation="off")  # type: ignore[arg-type]


# ---- item 11: each attack from the issue, against the default mode ----


GRANDPARENT = "int(open(f'/proc/{os.getppid()}/stat').read().rsplit(')', 1)[1].split()[1])"
KILLS = {
    "the code": "import os\nos.kill(os.getppid(), 9)\n",
    "a child": (  # a child process kills its parent's parent
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', \"import os; os.kill({GRANDPARENT}, 9)\"])\n"
    ),
}


@pytest.mark.parametrize("isolation", ["auto", "none"])
@pytest.mark.parametrize("attacker", list(KILLS))
def test_killing_the_parent_does_not_kill_the_trainer(attacker: str, isolation: str, tmp_path: Path) -> None:
    trainer = run_as_trainer(KILLS[attacker], isolation, tmp_path)
    if isolation == "none":  # the documented risk of the opt-out: the trainer dies
        assert trainer.returncode == -9
        return
    assert trainer.returncode == 0, trainer.stderr
    assert "trainer alive:" in trainer.stdout


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_the_parents_environment_is_not_readable(isolation: str, tmp_path: Path) -> None:
    secret = "sk-fake-" + uuid.uuid4().hex
    code = (
        "import os\n"
        "pids = [str(os.getppid())] + [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "paths = [f'/proc/{p}/environ' for p in pids]\n"
        "for path in paths:\n"
        "    try:\n"
        "        for item in open(path, 'rb').read().split(b'\\0'):\n"
        "            if item.startswith(b'QUERYRL_FAKE_API_KEY='):\n"
        "                print('leaked', item.decode())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    trainer = run_as_trainer(code, isolation, tmp_path, env={"QUERYRL_FAKE_API_KEY": secret})
    assert trainer.returncode == 0, trainer.stderr
    assert "trainer alive: ok" in trainer.stdout
    assert (secret in trainer.stdout) is (isolation == "none")


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_a_child_process_cannot_reach_a_loopback_server(tcp_server: socket.socket, isolation: str) -> None:
    port = tcp_server.getsockname()[1]
    child = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('child connected')"
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}])\n"
    result = run_code(code, isolation=isolation)  # type: ignore[arg-type]
    assert result.status == ("ok" if ISOLATED or isolation == "none" else "sandbox_error")
    if isolation == "none":  # the child has no Python guard: only a network namespace stops it
        assert "child connected" in result.stdout
        tcp_server.accept()[0].close()
        return
    assert "child connected" not in result.stdout
    with pytest.raises(BlockingIOError):
        tcp_server.accept()  # nothing ever connected


@pytest.mark.parametrize("isolation", ["auto", "none"])
@pytest.mark.slow
def test_a_daemon_left_behind_never_runs_on(tmp_path: Path, isolation: str) -> None:
    token, marker = uuid.uuid4().hex, tmp_path / "late.txt"
    late = f"import time; time.sleep(3); open({str(marker)!r}, 'w').write('late')"
    code = (  # the classic daemon: fork, setsid, fork again, the parent exits at once
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', {late!r}, {token!r}])\n"
        "    os._exit(0)\n"
        "print('parent done')\n"
    )
    result = run_code(code, isolation=isolation)  # type: ignore[arg-type]
    assert result.status == ("ok" if ISOLATED or isolation == "none" else "sandbox_error")
    try:
        if isolation == "none":  # unisolated, the daemon outlives the run and writes its file
            deadline = time.monotonic() + 10
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert marker.read_text() == "late"
            return
        deadline = time.monotonic() + 2  # SIGKILL lands asynchronously
        while running_with(token) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not running_with(token)
        time.sleep(3.5)
        assert not marker.exists()
    finally:
        kill_with(token)  # only the daemon this test started


# ---- item 12: the private root ----


@needs_isolation
def test_the_filesystem_is_a_private_read_only_root(tmp_path: Path) -> None:
    outside = Path("/tmp") / f"queryrl-escape-{uuid.uuid4().hex}"
    secret = tmp_path / "run" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("sk-fake")
    targets = {"passwd": "/etc/passwd", "repo": str(REPO / "pyproject.toml"), "run_folder": str(secret)}
    code = textwrap.dedent(
        f"""
        import os, sys
        for name, path in {targets!r}.items():
            try:
                open(path).read()
                print(name, "readable")
            except OSError as e:
                print(name, type(e).__name__)
        open({str(outside)!r}, "w").write("x")  # lands in the private /tmp
        print("private tmp", os.path.exists({str(outside)!r}))
        for folder in (sys.prefix, "/usr/lib", os.path.dirname(os.__file__)):
            try:
                open(os.path.join(folder, "planted.py"), "w").write("x")
                print("wrote", folder)
            except OSError as e:
                print("write", e.strerror)
        open("mine.txt", "w").write("ok")  # the working folder stays writable
        print("work", open("mine.txt").read())
        """
    )
    result = run_code(code)
    assert result.status == "ok", result.stderr
    lines = result.stdout.splitlines()
    assert {"passwd FileNotFoundError", "repo FileNotFoundError", "run_folder FileNotFoundError"} <= set(lines)
    assert "private tmp True" in lines
    assert not outside.exists()  # the host's /tmp never saw it
    assert lines.count("write Read-only file system") == 3
    assert "work ok" in lines


@needs_isolation
def test_the_writable_folders_are_bounded_and_off_the_host_disk() -> None:
    code = textwrap.dedent(
        """
        import os
        written = 0
        try:
            for i in range(20):  # 10 MB files (each under RLIMIT_FSIZE), 200 MB in all
                with open(f"blob{i}", "wb") as f:
                    f.write(b"x" * (10 << 20))
                written += 10
        except OSError as e:
            print("stopped", e.errno, "after", written)
        """
    )
    result = run_code(code, timeout_s=20.0)
    assert result.status == "ok", result.stderr
    assert result.stdout.startswith("stopped 28 after")  # ENOSPC: the working folder is a 64 MiB tmpfs
    assert int(result.stdout.split()[-1]) <= 64


@needs_isolation
def test_only_the_interpreter_is_visible_under_the_home_folder() -> None:
    home = Path.home()
    if not home.is_dir():
        pytest.skip("no home folder")
    result = run_code(
        f"import json, os\nprint(json.dumps(os.listdir({str(home)!r}) if os.path.isdir({str(home)!r}) else []))"
    )
    assert result.status == "ok", result.stderr
    visible = set(json.loads(result.stdout))
    on_a_bind = {
        Path(b).relative_to(home).parts[0] for b in sandbox.probe(sys.executable).binds if b.startswith(f"{home}/")
    }
    if not set(os.listdir(home)) - on_a_bind:
        pytest.skip("the home folder holds nothing but the interpreter: nothing to hide")
    assert visible <= on_a_bind


@needs_isolation
def test_no_capabilities_no_remount_no_other_processes() -> None:
    code = textwrap.dedent(
        """
        import ctypes, json, os, sys
        print("caps", open("/proc/self/status").read().split("CapEff:")[1].split()[0])
        libc = ctypes.CDLL(None, use_errno=True)
        flags = 32 | 4096  # MS_REMOUNT | MS_BIND, without MS_RDONLY: make it writable
        print("remount", libc.mount(None, sys.prefix.encode(), None, flags, None), ctypes.get_errno())
        print("pids", sorted(p for p in os.listdir("/proc") if p.isdigit()))
        print("dev", json.dumps(os.listdir("/dev")))
        """
    )
    result = run_code(code)
    assert result.status == "ok", result.stderr
    lines = result.stdout.splitlines()
    assert "caps 0000000000000000" in lines
    assert "remount -1 1" in lines  # EPERM
    assert "pids ['1']" in lines  # its own /proc: only itself
    assert set(json.loads(lines[-1][4:])) <= {
        "null",
        "zero",
        "full",
        "random",
        "urandom",
        "fd",
        "stdin",
        "stdout",
        "stderr",
        "shm",
    }


HOST_KERNEL_FILES = (
    "/proc/sys/kernel/core_pattern",  # "|program": run as host root at the next crash
    "/proc/sys/vm/drop_caches",
    "/proc/sys/kernel/printk_delay",
    "/proc/sysrq-trigger",
    "/proc/irq/default_smp_affinity",
    "/sys/kernel/profiling",
    "/sys/fs/cgroup/cgroup.procs",
)
OPEN_FOR_WRITING = textwrap.dedent(
    """
    import ctypes, os, sys
    for path in sys.argv[1:]:
        try:
            os.close(os.open(path, os.O_WRONLY))  # opened, never written: harmless if the test fails
            print(path, "WRITABLE")
        except OSError as e:
            print(path, "refused", e.errno)
    libc = ctypes.CDLL(None, use_errno=True)
    print("remount /proc/sys", libc.mount(None, b"/proc/sys", None, 32 | 4096, None), ctypes.get_errno())
    """
)


def _host_kernel_writes(result_stdout: str) -> list[str]:
    return [line for line in result_stdout.splitlines() if line.endswith("WRITABLE")]


@needs_isolation
def test_the_host_kernels_settings_are_not_writable() -> None:
    """As root, the sandbox's uid 0 was the host's root and wrote kernel.printk_delay; now /proc/sys and the
    other host-kernel files of its /proc are read-only, and there is no /sys."""
    code = OPEN_FOR_WRITING.replace("sys.argv[1:]", repr(list(HOST_KERNEL_FILES)))
    driver = (
        "import sys; from queryrl.rewards.scorers.code import run_code; "
        f"r = run_code({code!r}); "
        "print(r.status); print(r.stdout); print(r.stderr, file=sys.stderr)"
    )
    runs = {"as this user": [sys.executable, "-c", driver]}
    if os.geteuid() == 0:
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
        trivial = "from queryrl.rewards.scorers.code import run_code; print(run_code('print(1)').status)"
        usable = subprocess.run([*nobody, trivial], capture_output=True, text=True, timeout=120)
        if usable.stdout.strip() == "ok":  # this interpreter is usable by an unprivileged user here
            runs["as nobody"] = [*nobody, driver]
    for who, cmd in runs.items():
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": "/tmp"})
        assert done.stdout.startswith("ok"), (who, done.stdout, done.stderr)
        assert _host_kernel_writes(done.stdout) == [], who
        assert "remount /proc/sys -1 1" in done.stdout, who  # EPERM: no capability to make it writable
        assert done.stdout.count("refused") == len(HOST_KERNEL_FILES), who


@needs_isolation
def test_the_process_count_is_limited_even_as_root(run_cgroup_folders: list[str]) -> None:
    iso = sandbox.probe(sys.executable)
    if os.geteuid() == 0 and iso.cgroup_parent is None:
        pytest.skip("root without a writable pids cgroup: no process-count limit is enforced")
    code = textwrap.dedent(
        """
        import os, time
        started = 0
        try:
            for _ in range(200):
                if os.fork() == 0:
                    time.sleep(3)
                    os._exit(0)
                started += 1
        except OSError as e:
            print("refused", e.errno)
        print("started", started)
        """
    )
    before = set(os.listdir(iso.cgroup_parent or "/"))
    result = run_code(code, max_processes=16, timeout_s=10.0)
    assert result.status == "ok", result.stderr
    assert "refused 11" in result.stdout  # EAGAIN
    assert int(result.stdout.split("started")[1]) <= 15  # 16 with the code itself
    assert [f for f in run_cgroup_folders if os.path.exists(f)] == []  # removed before run_code returned
    assert _left_behind(iso.cgroup_parent, before) == []


def _left_behind(parent: str | None, before: set[str], settle_s: float = 5.0) -> list[str]:
    """Run cgroups made since `before` that hold no process and are still there after `settle_s`: left
    behind. An empty one that goes away meanwhile was another run's, made or removed at that moment (a full
    ``make test`` once saw such a one here, gone when looked at later, with this run's own removed); one
    that holds processes belongs to a run in flight elsewhere."""
    if parent is None:
        return []
    deadline = time.monotonic() + settle_s
    while True:
        left = []
        for name in set(os.listdir(parent)) - before:
            try:  # another run may remove its cgroup meanwhile
                if name.startswith("queryrl-sandbox-") and not Path(parent, name, "cgroup.procs").read_text().strip():
                    left.append(name)
            except FileNotFoundError:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def run_cgroup_folders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The cgroup folders this test's runs made (recorded as `run_code` makes them)."""
    made: list[str] = []
    real = code_module.run_cgroups

    @contextlib.contextmanager
    def recording(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real(*args, **kwargs) as cgroups:
            made.extend(cgroups.paths)
            yield cgroups

    monkeypatch.setattr(code_module, "run_cgroups", recording)
    return made


FOUR_CHILDREN_OF_400_MB = textwrap.dedent(
    """
    import os, time
    pids = []
    for i in range(4):
        pid = os.fork()
        if pid == 0:
            block = bytearray(400 << 20)
            for j in range(0, len(block), 4096):
                block[j] = 1  # touched: resident, not only reserved
            print("allocated", i, flush=True)
            time.sleep(2)
            os._exit(0)
        pids.append(pid)
    print("children", [os.waitpid(p, 0)[1] for p in pids], flush=True)
    """
)


@needs_isolation
def test_memory_is_limited_for_the_whole_sandbox(run_cgroup_folders: list[str]) -> None:
    """memory_mb was a per-process RLIMIT_AS: 4 children of 400 MB took 1.7 GB with memory_mb=512."""
    iso = sandbox.probe(sys.executable)
    if iso.memory_parent is None:
        pytest.skip("no writable memory cgroup here: the process count is capped instead (tested below)")
    before = set(os.listdir(iso.memory_parent))
    result = run_code(FOUR_CHILDREN_OF_400_MB, memory_mb=512, timeout_s=20.0)
    assert result.stdout.count("allocated") <= 1, result.stdout  # 2 x 400 MB > 512 MB
    assert result.status == "memory"
    assert "went past memory_mb" in result.stderr
    own = [f for f in run_cgroup_folders if f.startswith(iso.memory_parent)]
    assert own, run_cgroup_folders  # the run had a memory cgroup of its own ...
    assert [f for f in own if os.path.exists(f)] == []  # ... removed before run_code returned
    assert _left_behind(iso.memory_parent, before) == []
    assert run_code("print(len(bytearray(100 << 20)))", memory_mb=512).stdout == f"{100 << 20}\n"


@needs_isolation
def test_without_a_memory_cgroup_the_process_count_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    from queryrl.rewards.scorers.sandbox_cgroups import (
        MAX_PROCESSES_WITHOUT_MEMORY_CGROUP,
        processes_without_memory_cgroup,
    )

    assert processes_without_memory_cgroup(64, None) == MAX_PROCESSES_WITHOUT_MEMORY_CGROUP
    assert processes_without_memory_cgroup(64, "/sys/fs/cgroup/memory") == 64
    iso = sandbox.probe(sys.executable)
    if iso.cgroup_parent is None:
        pytest.skip("no writable pids cgroup: the cap is RLIMIT_NPROC, which does not bind root")
    monkeypatch.setattr(sandbox, "probe", lambda python: dataclasses.replace(iso, memory_parent=None))
    forks = "import os, time\nn = 0\ntry:\n    for _ in range(40):\n        if os.fork() == 0:\n"
    forks += "            time.sleep(2)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)"
    result = run_code(forks, timeout_s=10.0)
    assert int(result.stdout) <= MAX_PROCESSES_WITHOUT_MEMORY_CGROUP - 1  # the code itself is one


@needs_isolation
def test_an_interpreter_under_tmp_is_not_hidden_by_the_private_tmp(tmp_path: Path) -> None:
    """A fresh clone under /tmp (its .venv there too) failed 7 sandbox tests: the private /tmp hid it."""
    venv = Path(tempfile.mkdtemp(prefix="queryrl-venv-", dir="/tmp"))
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        python = str(venv / "bin" / "python")
        result = run_code("import sys, os\nprint(sys.prefix, os.path.exists(sys.executable))", python=python)
        assert (result.status, result.stdout) == ("ok", f"{venv} True\n"), result.stderr
        sandbox.probe.cache_clear()
    finally:
        shutil.rmtree(venv, ignore_errors=True)


@needs_isolation
def test_the_venvs_packages_and_subprocesses_still_work() -> None:
    code = (
        "import subprocess, sys, numpy\nprint(numpy.add(2, 3), flush=True)\nsubprocess.run(['echo', 'hi'], check=True)"
    )
    result = run_code(code)
    assert (result.status, result.stdout) == ("ok", "5\nhi\n"), result.stderr


@needs_isolation
def test_a_failed_set_up_is_a_sandbox_error_that_code_cannot_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = "import os\nos.write(2, b'queryrl sandbox setup failed: x\\n')\nos._exit(125)"
    assert run_code(fake).status == "error"  # the code cannot make its failure a dropped sample
    real = sandbox.confine_spec
    monkeypatch.setattr(
        sandbox, "confine_spec", lambda *a, **k: real(*a, **k).replace('"pivot_root": ', '"pivot_root": -1, "x": ')
    )
    result = run_code("print('ran')")
    assert result.status == "sandbox_error"
    assert "pivot_root" in result.stderr
    assert "ran" not in result.stdout
