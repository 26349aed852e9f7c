"""The suite's timeouts measure the test, not its fixtures, and scale with the machine's speed (tests/timeouts.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timeouts import MAX_FACTOR, REFERENCE_GFLOPS, scaled_timeout, timeout_factor

REPO = Path(__file__).resolve().parents[1]


def test_a_slower_machine_gets_a_proportionally_longer_limit() -> None:
    assert timeout_factor(REFERENCE_GFLOPS / 4) == pytest.approx(4.0)
    assert scaled_timeout(300, 20.0, reference_gflops=80.0) == 1200.0
    assert scaled_timeout(300, 30.0, reference_gflops=80.0) == 800.0  # rounded up to a second


def test_never_below_the_written_limit_nor_past_the_cap() -> None:
    assert scaled_timeout(300, 400.0, reference_gflops=80.0) == 300.0  # an AMX machine keeps 300 s
    assert timeout_factor(0.01) == MAX_FACTOR
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        assert timeout_factor(bad) == MAX_FACTOR
    assert scaled_timeout(0, 1.0) == 0  # no limit stays no limit


def test_this_session_runs_under_the_scaled_limit(request: pytest.FixtureRequest) -> None:
    config = request.config
    if config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        pytest.skip("a timeout given on the command line or in PYTEST_TIMEOUT is kept as given")
    from queryrl.machine import machine_info

    rate = machine_info().matmul_gflops["float32"]
    assert config._env_timeout == scaled_timeout(float(config.getini("timeout")), rate)  # type: ignore[attr-defined]
    assert config.getini("timeout_func_only") is True


@pytest.mark.timeout(7)
def test_a_marked_limit_is_scaled_too(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    factor = getattr(request.config, "_timeout_factor", None)
    if factor is None:
        pytest.skip("the timeout was given explicitly: nothing scaled")
    assert marker.args[0] == scaled_timeout(7, request.config._timeout_rate)  # type: ignore[attr-defined]


def test_a_slow_fixture_does_not_count_against_the_test(tmp_path: Path) -> None:
    """Under this repository's pytest settings a fixture that takes longer than the limit passes; the same
    time in the test body fails it."""
    (tmp_path / "test_inner.py").write_text(
        "import time\n"
        "import pytest\n\n"
        "@pytest.fixture\n"
        "def slow():\n"
        "    time.sleep(2.5)\n\n"
        "def test_fixture_is_slow(slow):\n"
        "    pass\n\n"
        "def test_body_is_slow():\n"
        "    time.sleep(2.5)\n",
        encoding="utf-8",
    )
    env = {**os.environ, "PYTEST_TIMEOUT": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml")]
    cmd += ["--rootdir", str(tmp_path), "-p", "no:xdist", "-p", "no:randomly", str(tmp_path / "test_inner.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert "FAILED test_inner.py::test_body_is_slow" in out, out[-3000:]
