"""Code-execution reward: run the model's Python against tests in a sandboxed subprocess.

The code never runs in the trainer's process. Each run gets, in layers:

- **a subprocess** in a new session (its own process group, killed as a whole on timeout), in a
  fresh temporary directory (its cwd, ``HOME`` and ``TMPDIR``; removed afterwards), with a parent-death
  signal: it dies with the trainer, and a later run removes the folders and cgroups of a killed trainer's
  runs (:mod:`queryrl.rewards.scorers.sandbox_leftovers`); its stdin is a sealed memfd, read-only;
- **a minimal environment**: an allowlist (``PATH``, ``LANG``, thread counts), nothing
  inherited, so API keys and tokens in the trainer's environment are not there; ``python -I``
  also ignores ``PYTHON*`` variables, the user site and the cwd on ``sys.path``;
- **resource limits**, set by the runner before the code starts: ``RLIMIT_AS`` (memory: the
  code gets ``MemoryError``), ``RLIMIT_CPU`` (CPU seconds, for what the wall clock misses,
  such as an orphan whose trainer died), ``RLIMIT_FSIZE`` (file size), ``RLIMIT_CORE`` = 0.
  They are set in the child's own first lines rather than a ``preexec_fn``, which is unsafe
  when the trainer has threads (the async and parallel reward managers do);
- **OS isolation** (:mod:`queryrl.rewards.scorers.sandbox`, the default): user, mount, network, PID,
  IPC and UTS namespaces (``unshare``), a private read-only root that shows only the system
  directories and the interpreter (no ``/etc/passwd``, home, repository or run folder), one
  writable folder (the run's), a private ``/tmp``, its own ``/proc``, a fresh session keyring, no
  capabilities, and a process-count limit (a ``pids`` cgroup where one is writable, e.g. as root;
  ``RLIMIT_NPROC``, which binds every user but root). No connection leaves the network namespace, from the code
  or any child; the trainer's processes (and their ``/proc/<pid>/environ``) are invisible and
  cannot be signalled; every process the code starts dies when it ends;
- **a Python guard** that always runs first: creating a socket or resolving a name raises
  ``PermissionError`` (``socketpair()``, a local pipe asyncio needs, still works).

Where no isolation works here (no ``unshare``, or namespaces refused), runs are refused with
one message naming how to get isolation, unless ``isolation="none"`` is given explicitly: then
(one warning per process) only the guard, the limits and the minimal environment apply, and
the code can read what the trainer's user can, signal the trainer, reach local servers through
a subprocess and leave processes behind. Assert tests run in another process that never runs the
model's code and calls it through the sandbox with data only (:mod:`queryrl.rewards.scorers.code_rpc`): nothing
in the code's process marks a pass, so exiting early, fake report lines or a monkeypatched ``assert``
score 0, and an object whose ``__eq__`` is always True equals nothing there.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from queryrl.rewards.scorers import sandbox
from queryrl.rewards.scorers.code_rpc import SERVE, run_asserts
from queryrl.rewards.scorers.sandbox import SandboxError
from queryrl.rewards.scorers.sandbox_cgroups import processes_without_memory_cgroup, run_cgroups
from queryrl.rewards.scorers.sandbox_leftovers import sweep_now_and_then, temp_folder

logger = logging.getLogger(__name__)

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "sandbox_error"]
Isolation = Literal["auto", "namespace", "none"]
ISOLATIONS = ("auto", "namespace", "none")  # auto and namespace: the namespaces or a refusal

MAX_OUTPUT_BYTES = 1 << 20  # per stream; past it the run is stopped (status "output_limit")
MAX_FILE_BYTES = 16 << 20
MEMORY_KILLED = "\nkilled: the sandbox's processes together went past memory_mb\n"
_TIMEOUT_RC = 124  # the runner's exit status when it runs out of CPU time (as timeout(1))
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "OMP_NUM_THREADS": "1",  # numpy/BLAS thread pools reserve memory per thread (RLIMIT_AS)
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

# The child's first lines: limits, the network guard, then the code (mode "script"), or the code
# then the requests of the assert tests' evaluator (mode "serve", :mod:`queryrl.rewards.scorers.code_rpc`).
# It sees only its argv: mode, code file, CPU seconds, memory bytes, file bytes, processes (0: no
# limit), the descriptor its replies go to (serve; its requests come on stdin).
_RUNNER = (
    r"""
import os, resource, signal, sys, types
_mode, _path, _reply_fd = sys.argv[1], sys.argv[2], int(sys.argv[7])
_cpu, _mem, _fsize, _nproc = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
def _out_of_cpu(signum, frame):
    os.write(2, b"\nCPU time limit exceeded\n")
    os._exit(124)
signal.signal(signal.SIGXCPU, _out_of_cpu)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
if _nproc:  # counted per user namespace: binds every user but root (the pids cgroup binds root)
    resource.setrlimit(resource.RLIMIT_NPROC, (_nproc, _nproc))

import socket, _socket
def _no_network(*args, **kwargs):
    raise PermissionError(1, "network access is disabled in this sandbox")
_base = _socket.socket
class _GuardedSocket(_base):  # socket.socket.__init__ calls _socket.socket.__init__: this one
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None:  # socketpair() wraps sockets it made itself: allowed (asyncio needs it)
            _no_network()
        _base.__init__(self, family, type, proto, fileno)
_socket.socket = _socket.SocketType = _GuardedSocket
for _name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname",
              "gethostbyname_ex", "gethostbyaddr", "getnameinfo", "fromfd"):
    for _module in (socket, _socket):
        if hasattr(_module, _name):
            setattr(_module, _name, _no_network)

def _main():
    with open(_path, encoding="utf-8") as f:
        code = compile(f.read(), _path, "exec")
    module = types.ModuleType("__main__")
    module.__file__ = _path
    sys.modules["__main__"] = module
    sys.argv = [_path]
    if _mode == "script":
        exec(code, module.__dict__)
        return
    import traceback
    try:
        exec(code, module.__dict__)
    except BaseException:  # SystemExit too: exiting before the tests fails them (nothing is served)
        traceback.print_exc()
        return
    _serve(module, _reply_fd)
"""
    + SERVE
    + """
_main()
"""
)


@dataclass(frozen=True)
class ExecResult:
    """One sandboxed run.

    Attributes:
        status: ``"ok"`` (exit 0), ``"error"`` (non-zero exit, e.g. an exception), ``"timeout"``
            (wall clock or CPU time), ``"memory"`` (``MemoryError``), ``"output_limit"`` (more
            than :data:`MAX_OUTPUT_BYTES` on a stream), ``"sandbox_error"`` (could not start).
        stdout: what it printed (decoded as UTF-8, invalid bytes replaced; capped).
        stderr: its error output (same).
        returncode: the exit status (negative: killed by that signal); None if it never ran.
        elapsed_s: wall-clock seconds.
        isolation: ``"namespace"`` or ``"none"`` (only the Python guard and the limits).
    """

    status: Status
    stdout: str
    stderr: str
    returncode: int | None
    elapsed_s: float
    isolation: str


@functools.cache
def _refusal(python: str) -> str | None:
    """Why isolated runs are refused here (logged once), or None when they work."""
    try:
        sandbox.probe(python)
    except sandbox.IsolationUnavailable as e:
        logger.error("%s", e)
        return str(e)
    return None


def namespaces_available(python: str | None = None) -> bool:
    """Whether isolated runs work here (probed once per interpreter)."""
    return _refusal(python or sys.executable) is None


def _status(outcome: str, returncode: int | None, stderr: str) -> Status:
    if outcome != "exited":
        return "timeout" if outcome == "timeout" else "output_limit"
    if returncode == 0:
        return "ok"
    if returncode in (_TIMEOUT_RC, -signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"  # out of CPU time (RLIMIT_CPU)
    if "MemoryError" in stderr[-2000:]:
        return "memory"
    return "error"


def run_code(
    code: str,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    *,
    isolation: Isolation = "auto",
    python: str | None = None,
    max_output_bytes: int = MAX_OUTPUT_BYTES,
    max_processes: int = sandbox.MAX_PROCESSES,
    _serve: tuple[int, int] | None = None,
) -> ExecResult:
    """Run Python `code` in the sandbox (see the module docstring) and return what happened.

    Args:
        code: the program; it runs as ``__main__`` from ``solution.py`` in a fresh temporary cwd.
        stdin: its standard input.
        timeout_s: wall-clock limit; every process it started is killed past it. CPU time is
            limited to ``ceil(timeout_s) + 1`` seconds.
        memory_mb: address-space limit of each process (``RLIMIT_AS``) and, where a memory cgroup is
            writable, the memory of the whole sandbox (:mod:`queryrl.rewards.scorers.sandbox_cgroups`; past it a
            process is killed and the status is ``"memory"``).
        isolation: ``"auto"`` or ``"namespace"`` (the same today: the OS isolation of
            :mod:`queryrl.rewards.scorers.sandbox`, or a ``"sandbox_error"`` result saying how to get it
            where none works), ``"none"`` (explicit opt-out, one warning: guard and limits only).
        python: the interpreter (default: this one, so the same packages are importable).
        max_output_bytes: cap per stream.
        max_processes: processes and threads at once (isolated runs; see the module docstring).
        _serve: ``(requests_fd, replies_fd)``: after the code, serve the assert tests' evaluator
            (:func:`queryrl.rewards.scorers.code_rpc.run_asserts`), requests on stdin instead of `stdin`.
    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"code sandbox: isolation must be one of {', '.join(ISOLATIONS)}; got {isolation!r}")
    python = python or sys.executable
    iso: sandbox.Isolation | None = None
    if isolation == "none":
        sandbox.warn_unisolated()
    else:
        refusal = _refusal(python)
        if refusal is not None:
            return ExecResult("sandbox_error", "", refusal, None, 0.0, "none")
        iso = sandbox.probe(python)
    sweep_now_and_then((iso.cgroup_parent, iso.memory_parent) if iso is not None else ())
    base = temp_folder("sandbox")  # named after this trainer: removed by a later run if it is killed
    try:
        workdir = os.path.join(base, "work")
        os.mkdir(workdir)
        path = os.path.join(workdir, "solution.py")
        with open(path, "w", encoding="utf-8", errors="replace") as f:
            f.write(code)
        if iso is not None:  # without a memory cgroup their sum is bounded by their count only
            max_processes = processes_without_memory_cgroup(max_processes, iso.memory_parent)
        nproc = max_processes if iso is not None else 0
        limits = [str(math.ceil(timeout_s) + 1), str(memory_mb << 20), str(MAX_FILE_BYTES), str(nproc)]
        args = ["script" if _serve is None else "serve", path, *limits, str(-1 if _serve is None else _serve[1])]
        memory = memory_mb << 20
        run = _Run(python, iso, base, workdir, stdin, timeout_s, max_output_bytes, max_processes, memory, _serve)
        return run.start(args)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class _Run:
    """One process tree: start it (confined when `iso` is given), collect its output, kill what is left."""

    python: str
    iso: sandbox.Isolation | None
    base: str
    workdir: str
    stdin: str
    timeout_s: float
    max_output_bytes: int
    max_processes: int
    memory_bytes: int
    serve: tuple[int, int] | None = None  # (stdin fd, an fd the child keeps): the evaluator's pipes

    def start(self, args: list[str]) -> ExecResult:
        used = "namespace" if self.iso is not None else "none"
        interpreter = [self.python, "-I", "-B", "-X", "utf8", "-c"]
        if self.iso is None:
            return self._execute([*interpreter, _RUNNER, *args], None, used)
        root = os.path.join(self.base, "root")
        os.mkdir(root)
        ready_r, ready_w = os.pipe()  # the set-up says "done" here; the code never holds this end
        handed = False
        try:
            os.set_blocking(ready_r, False)
            parents = (self.iso.cgroup_parent, self.iso.memory_parent)
            with run_cgroups(*parents, self.max_processes, self.memory_bytes) as cgroups:
                spec = sandbox.confine_spec(self.iso, root, self.workdir, cgroups.paths, ready_w)
                cmd = [*self.iso.prefix, *interpreter, sandbox.CONFINE + _RUNNER, spec, *args]
                handed = True  # _execute closes it once the child holds it
                result = self._execute(cmd, ready_w, used)
                if cgroups.memory_exceeded() and result.status in ("error", "ok"):  # the OOM killer ended one
                    result = replace(result, status="memory", stderr=result.stderr + MEMORY_KILLED)
            try:
                confined = os.read(ready_r, 1) == b"1"
            except BlockingIOError:
                confined = False
        finally:
            os.close(ready_r)
            if not handed:
                os.close(ready_w)
        if not confined and result.status not in ("sandbox_error", "timeout"):
            reason = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.returncode}"]
            return ExecResult("sandbox_error", result.stdout, f"code sandbox: {reason[0]}", None, 0.0, used)
        return result

    def _execute(self, cmd: list[str], ready_w: int | None, used: str) -> ExecResult:
        env = {**_ENV, "HOME": self.workdir, "TMPDIR": self.workdir}
        # stdin: a sealed memfd, read-only (not a pipe: no write can block; not a host file: nothing to write to)
        stdin = -1 if self.serve is None else self.serve[0]
        try:
            if self.serve is None:
                stdin = sandbox.sealed_input(self.stdin.encode("utf-8", "replace"))
            start = time.monotonic()
            kept = (() if ready_w is None else (ready_w,)) + (() if self.serve is None else (self.serve[1],))
            try:
                proc = subprocess.Popen(
                    sandbox.dies_with_parent(cmd, self.python), stdin=stdin, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, cwd=self.workdir, env=env, start_new_session=True, pass_fds=kept,
                )  # fmt: skip
            except OSError as e:
                return ExecResult("sandbox_error", "", f"{type(e).__name__}: {e}", None, 0.0, used)
        finally:
            if ready_w is not None:
                os.close(ready_w)  # only the set-up holds it now: a read after the exit cannot block
            if self.serve is None and stdin >= 0:
                os.close(stdin)
        try:
            out, err, outcome = sandbox.collect_output(proc, start + self.timeout_s, self.max_output_bytes)
            if outcome == "exited":  # both pipes closed: the exit follows at once, unless it went on
                try:
                    proc.wait(timeout=max(0.0, start + self.timeout_s - time.monotonic()))
                except subprocess.TimeoutExpired:
                    outcome = "timeout"
        finally:
            sandbox.kill_group(proc)  # on a timeout, and any process it left behind
            returncode = proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        elapsed = time.monotonic() - start
        stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        return ExecResult(_status(outcome, returncode, stderr), stdout, stderr, returncode, elapsed, used)


# ---- scoring ----

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}


def extract_code(solution_str: str) -> str:
    """The last fenced ```python block in `solution_str`; else the last unlabelled fence; else the text."""
    blocks = _FENCE.findall(solution_str)
    for wanted in (lambda tag: tag.lower() in _PYTHON_TAGS, lambda tag: tag == ""):
        chosen = [body for tag, body in blocks if wanted(tag)]
        if chosen:
            return str(chosen[-1])
    return solution_str


@dataclass(frozen=True)
class IOTest:
    """A stdin/stdout test: run with `input` on stdin; pass when stdout matches `output`."""

    input: str
    output: str


def _text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "\n".join(str(v) for v in value)
    return str(value)


def parse_tests(ground_truth: Any) -> list[IOTest] | list[tuple[str, bool]]:
    """The tests in `ground_truth`: stdin/stdout tests, or assert statements ``(source, counts)``.

    Accepted: a list of ``{"input": ..., "output": ...}``; a dict ``{"inputs": [...],
    "outputs": [...]}`` (APPS/TACO); either as a JSON string; or Python source of assert tests.
    In source, every top-level statement runs in order and each ``assert`` counts as one test;
    source without a top-level ``assert`` (HumanEval's ``def check(...)`` then ``check(f)``)
    is one test.

    Raises:
        ValueError: none of those forms, call-based tests (``fn_name``), or source that does not parse.
    """
    if hasattr(ground_truth, "tolist"):  # a numpy array out of a parquet file
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, str):
        try:
            decoded = json.loads(ground_truth)
        except ValueError:
            decoded = None
        if isinstance(decoded, list | dict):
            return parse_tests(decoded)
        try:
            tree = ast.parse(ground_truth)
        except SyntaxError as e:
            raise ValueError(f"code ground_truth is neither JSON tests nor Python assert tests: {e}") from e
        statements = [
            (ast.get_source_segment(ground_truth, s) or ast.unparse(s), isinstance(s, ast.Assert)) for s in tree.body
        ]
        if not any(counts for _, counts in statements):
            return [(ground_truth, True)]
        return statements
    if isinstance(ground_truth, dict):
        if ground_truth.get("fn_name"):
            raise ValueError("call-based code tests (fn_name) are not supported; use stdin/stdout or assert tests")
        if "inputs" in ground_truth and "outputs" in ground_truth:
            return [
                IOTest(_text(i), _text(o)) for i, o in zip(ground_truth["inputs"], ground_truth["outputs"], strict=True)
            ]
    if isinstance(ground_truth, list) and all(
        isinstance(t, dict) and "input" in t and "output" in t for t in ground_truth
    ):
        return [IOTest(_text(t["input"]), _text(t["output"])) for t in ground_truth]
    raise ValueError(
        "code ground_truth must be a list of {'input', 'output'} tests, {'inputs': [...], 'outputs': [...]}, "
        f"JSON of either, or Python assert tests; got {type(ground_truth).__name__}"
    )


def normalize_output(text: str) -> str:
    """Output as compared: trailing spaces on each line and blank lines at either end dropped."""
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _checked(result: ExecResult) -> ExecResult:
    if result.status == "sandbox_error":  # the sample fails (is dropped), it does not score 0
        raise SandboxError(result.stderr)
    return result


def run_tests(
    code: str, tests: list[IOTest] | list[tuple[str, bool]], stop_on_failure: bool = False, **run_kwargs: Any
) -> list[bool]:
    """Pass/fail per test. Stdin/stdout tests run one process each; assert tests share one sandboxed process,
    which the tests reach from their evaluator process (:func:`queryrl.rewards.scorers.code_rpc.run_asserts`)."""
    if tests and isinstance(tests[0], IOTest):
        results: list[bool] = []
        for test in tests:
            assert isinstance(test, IOTest)
            result = _checked(run_code(code, stdin=test.input, **run_kwargs))
            results.append(result.status == "ok" and normalize_output(result.stdout) == normalize_output(test.output))
            if stop_on_failure and not results[-1]:
                break
        return results + [False] * (len(tests) - len(results))
    return run_asserts(code, [t for t in tests if isinstance(t, tuple)], run_code, **run_kwargs)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    all_or_nothing: bool = False,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    isolation: Isolation = "auto",
) -> float:
    """Code reward (verl contract): the fraction of tests the last ```python block passes.

    Args:
        data_source: unused (routing happens before).
        solution_str: the model's response; the code is :func:`extract_code` of it.
        ground_truth: the tests, see :func:`parse_tests`.
        extra_info: unused.
        all_or_nothing: 1.0 only when every test passes (stops at the first failure), else 0.0.
        timeout_s, memory_mb, isolation: per run, see :func:`run_code`. Stdin/stdout tests run
            one after another, so a manager's per-sample timeout must allow for all of them.

    Raises:
        ValueError: `ground_truth` holds no tests in a known form (a data error, not a wrong answer).
        SandboxError: the sandbox refused to run (no isolation here) or failed to start.
    """
    tests = parse_tests(ground_truth)
    if not tests:
        raise ValueError("code ground_truth holds no tests")
    results = run_tests(
        extract_code(solution_str), tests, stop_on_failure=all_or_nothing,
        timeout_s=timeout_s, memory_mb=memory_mb, isolation=isolation,
    )  # fmt: skip
    if all_or_nothing:
        return 1.0 if all(results) else 0.0
    return sum(results) / len(results)
