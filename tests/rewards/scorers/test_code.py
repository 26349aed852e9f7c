"""The code sandbox (limits, isolation) and the code reward (stdin/stdout and assert tests)."""

from __future__ import annotations

import json
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from queryrl.rewards import RewardError, default_compute_score
from queryrl.rewards.scorers.code import (
    IOTest,
    compute_score,
    extract_code,
    namespaces_available,
    normalize_output,
    parse_tests,
    run_code,
)
from tests.rewards.helpers import gone

NAMESPACES = namespaces_available()
needs_namespaces = pytest.mark.skipif(not NAMESPACES, reason="unshare --net --pid is not permitted here")
BOTH = pytest.mark.parametrize("isolation", ["auto", "none"])  # "none": the Python guard alone

DOUBLE = "```python\nprint(int(input()) * 2)\n```"
IO_TESTS = [{"input": "2\n", "output": "4\n"}, {"input": "5", "output": "10"}, {"input": "7", "output": "15"}]


# ---- run_code ----


def test_runs_code_with_stdin() -> None:
    result = run_code("name = input()\nprint(f'hello {name}')", stdin="world\n")
    assert (result.status, result.stdout, result.returncode) == ("ok", "hello world\n", 0)
    assert result.isolation == ("namespace" if NAMESPACES else "none")


def test_large_stdin_and_output_do_not_deadlock() -> None:
    data = "x" * 500_000 + "\n"
    result = run_code("import sys\ns = sys.stdin.read()\nprint(s, end='')\nprint(len(s), file=sys.stderr)", stdin=data)
    assert result.status == "ok"
    assert result.stdout == data
    assert result.stderr.strip() == str(len(data))


def test_an_exception_is_an_error() -> None:
    result = run_code("raise ValueError('boom')")
    assert result.status == "error"
    assert result.returncode == 1
    assert "ValueError: boom" in result.stderr


@BOTH
def test_infinite_loop_is_stopped_with_its_whole_process_group(isolation: str) -> None:
    token = uuid.uuid4().hex
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])\n"
        "while True:\n    pass\n"
    )
    result = run_code(code, timeout_s=1.0, isolation=isolation)  # type: ignore[arg-type]
    assert result.status == "timeout"
    assert 1.0 <= result.elapsed_s < 3.0
    assert gone(token)  # the grandchild died with the group


@BOTH
def test_children_left_running_are_killed_not_waited_for(isolation: str) -> None:
    token = uuid.uuid4().hex
    code = (  # the child inherits stdout, so the pipe stays open after the program ends
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])\n"
        "print('done')\n"
    )
    result = run_code(code, timeout_s=5.0, isolation=isolation)  # type: ignore[arg-type]
    assert (result.status, result.stdout) == ("ok", "done\n")
    assert result.elapsed_s < 2.0
    assert gone(token)


@needs_namespaces
def test_a_child_that_leaves_the_process_group_dies_with_the_namespace() -> None:
    token = uuid.uuid4().hex
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{token}'], start_new_session=True)\n"
        "print('started')\n"
    )
    result = run_code(code, timeout_s=5.0)
    assert result.status == "ok"
    assert gone(token)


def test_memory_bomb_is_stopped() -> None:
    result = run_code("blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))", memory_mb=256)
    assert result.status == "memory"
    assert result.elapsed_s < 5.0
    assert run_code("x = bytearray(8 << 30)", memory_mb=256).status == "memory"


def test_output_is_capped() -> None:
    result = run_code("while True:\n    print('x' * 1000)", max_output_bytes=10_000)
    assert result.status == "output_limit"
    assert len(result.stdout) == 10_000


def test_writes_land_in_a_temporary_directory_that_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = "import os\nopen('out.txt', 'w').write('data')\nprint(os.getcwd())\nprint(os.listdir('.'))"
    result = run_code(code)
    assert result.status == "ok"
    workdir, listing = result.stdout.splitlines()
    assert "out.txt" in listing
    assert Path(workdir).resolve() != tmp_path.resolve()
    assert not (tmp_path / "out.txt").exists()
    assert not Path(workdir).exists()  # removed after the run


def test_environment_secrets_are_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-fake-" + uuid.uuid4().hex
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", secret)
    result = run_code("import os\nprint(os.environ.get('OPENAI_API_KEY'))\nprint(sorted(os.environ))")
    assert result.status == "ok"
    assert secret not in result.stdout
    assert result.stdout.splitlines()[0] == "None"
    assert "HF_TOKEN" not in result.stdout


@pytest.mark.parametrize("isolation", [pytest.param("auto", marks=needs_namespaces), "none"])
def test_other_processes_environments_through_proc(isolation: str) -> None:
    # a process of the same user outside the sandbox (the trainer, a judge server) holding a key
    secret = "sk-fake-" + uuid.uuid4().hex
    holder = subprocess.Popen(["sleep", "30"], env={"OPENAI_API_KEY": secret})
    code = (
        "import os\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        f"        print('{secret}'.encode() in open(f'/proc/{{pid}}/environ', 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    try:
        result = run_code(code, isolation=isolation)  # type: ignore[arg-type]
    finally:
        holder.kill()
        holder.wait()
    assert result.status == "ok"
    # the PID namespace with its own /proc hides every process outside it; without it, a child
    # of the same user reads the key (the limitation the module docstring states)
    assert ("True" in result.stdout) is (isolation == "none")


@BOTH
def test_network_connection_is_refused(tcp_server: socket.socket, isolation: str) -> None:
    port = tcp_server.getsockname()[1]
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    result = run_code(code, isolation=isolation)  # type: ignore[arg-type]
    assert result.status == "error"
    assert "connected" not in result.stdout
    assert "PermissionError" in result.stderr  # the Python guard stops it first, in both modes
    with pytest.raises(BlockingIOError):
        tcp_server.accept()  # nothing ever connected


@BOTH
def test_name_resolution_is_refused(isolation: str) -> None:
    code = "import socket\nsocket.getaddrinfo('localhost', 80)\nprint('resolved')"
    result = run_code(code, isolation=isolation)  # type: ignore[arg-type]
    assert result.status == "error"
    assert "resolved" not in result.stdout


@needs_namespaces
def test_raw_sockets_around_the_python_guard_are_stopped_by_the_namespace(tcp_server: socket.socket) -> None:
    port = tcp_server.getsockname()[1]
    code = (  # socket(2) and connect(2) through libc: no Python socket object at all
        "import ctypes, struct\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(2, 1, 0)\n"
        f"addr = struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1]) + bytes(8)\n"
        "print('connect', libc.connect(fd, addr, 16))\n"
    )
    result = run_code(code)
    assert result.stdout.strip() == "connect -1"
    with pytest.raises(BlockingIOError):
        tcp_server.accept()


def test_local_socketpair_still_works_for_asyncio() -> None:
    result = run_code("import asyncio\nasync def f():\n    return 3\nprint(asyncio.run(f()))")
    assert (result.status, result.stdout) == ("ok", "3\n")


def test_namespace_isolation_can_be_required() -> None:
    result = run_code("print(1)", isolation="namespace")
    assert result.status == ("ok" if NAMESPACES else "sandbox_error")


# ---- extraction and test formats ----


def test_extract_code() -> None:
    text = "First try:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```\nDone."
    assert extract_code(text) == "print(2)\n"  # the last python block
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"  # an unlabelled fence
    assert extract_code("```python\nprint(4)\n```\n```text\noutput\n```") == "print(4)\n"
    assert extract_code("print(5)") == "print(5)"  # no fence: the whole text


def test_parse_tests_formats() -> None:
    expected = [IOTest("1", "2"), IOTest("3", "6")]
    as_list = [{"input": "1", "output": "2"}, {"input": "3", "output": "6"}]
    assert parse_tests(as_list) == expected
    assert parse_tests(json.dumps(as_list)) == expected
    assert parse_tests({"inputs": ["1", "3"], "outputs": ["2", "6"]}) == expected  # APPS / TACO
    assert parse_tests(json.dumps({"inputs": ["1", "3"], "outputs": ["2", "6"]})) == expected
    asserts = parse_tests("import math\nassert f(1) == 2\nassert f(2) == 4")
    assert asserts == [("import math", False), ("assert f(1) == 2", True), ("assert f(2) == 4", True)]
    humaneval = "def check(candidate):\n    assert candidate(1) == 2\n\ncheck(f)"
    assert parse_tests(humaneval) == [(humaneval, True)]  # no top-level assert: one test
    with pytest.raises(ValueError, match="fn_name"):
        parse_tests({"inputs": [[1]], "outputs": [2], "fn_name": "f"})
    with pytest.raises(ValueError, match="neither JSON tests nor Python"):
        parse_tests("assert (")
    with pytest.raises(ValueError, match="must be a list"):
        parse_tests(42)


def test_normalize_output() -> None:
    assert normalize_output("\n1 2  \n3\n\n") == "1 2\n3"
    assert normalize_output("1\r\n2\r\n") == "1\n2"


# ---- the reward ----


def test_stdin_stdout_score_is_the_fraction_passed() -> None:
    assert compute_score("codecontests", DOUBLE, IO_TESTS) == pytest.approx(2 / 3)  # 7 * 2 != 15
    assert compute_score("codecontests", DOUBLE, IO_TESTS[:2]) == 1.0
    assert compute_score("codecontests", DOUBLE, IO_TESTS, all_or_nothing=True) == 0.0
    assert compute_score("codecontests", DOUBLE, IO_TESTS[:2], all_or_nothing=True) == 1.0
    assert compute_score("codecontests", "```python\nprint(int(input()) + 1)\n```", IO_TESTS) == 0.0
    assert compute_score("codecontests", "```python\nthis is not python\n```", IO_TESTS) == 0.0


def test_assert_tests_score_each_assert() -> None:
    code = "```python\ndef f(x):\n    return 2 * x if x < 3 else 0\n```"
    tests = "assert f(1) == 2\nassert f(2) == 4\nassert f(3) == 6\nassert f(4) == 8"
    assert compute_score("code", code, tests) == 0.5
    assert compute_score("code", code, tests, all_or_nothing=True) == 0.0
    assert compute_score("code", code, tests[:33]) == 1.0  # the first two


def test_exiting_before_the_tests_scores_zero() -> None:
    tests = "assert f(1) == 2\nassert f(2) == 4"
    for exit_call in ("import sys; sys.exit(0)", "import os; os._exit(0)"):
        code = f"```python\ndef f(x):\n    return 0\n{exit_call}\n```"
        assert compute_score("code", code, tests) == 0.0
    # printing a fake report does not help: the runner's lines carry a nonce the code never sees
    fake = "```python\ndef f(x):\n    return 0\nfor i in range(2):\n    print(f'x {i} pass')\n```"
    assert compute_score("code", fake, tests) == 0.0


def test_a_test_that_hangs_fails_but_earlier_ones_count() -> None:
    code = "```python\ndef f(x):\n    while x == 2:\n        pass\n    return 2 * x\n```"
    tests = "assert f(1) == 2\nassert f(2) == 4\nassert f(3) == 6"
    assert compute_score("code", code, tests, timeout_s=1.0) == pytest.approx(1 / 3)


def test_humaneval_style_check() -> None:
    tests = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 10\n\ncheck(f)"
    assert compute_score("code", "```python\ndef f(x):\n    return 2 * x\n```", tests) == 1.0
    assert compute_score("code", "```python\ndef f(x):\n    return x + 1\n```", tests) == 0.0


def test_routing_to_the_code_reward() -> None:
    for source in ("codecontests", "apps", "taco", "leetcode", "code"):
        assert default_compute_score(source, DOUBLE, IO_TESTS[:2]) == 1.0
    assert default_compute_score("apps", DOUBLE, IO_TESTS, all_or_nothing=True) == 0.0


def test_unknown_source_lists_math_and_code_sources() -> None:
    with pytest.raises(RewardError) as info:
        default_compute_score("my/dataset", "x", "y")
    for known in ("lighteval/MATH", "HuggingFaceH4/MATH-500", "math", "codecontests", "leetcode", "gsm8k"):
        assert known in str(info.value)
