"""Shared fixtures: the tiny model is built once per test session into a temporary cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from queryrl.config import load_config
from tests.helpers import FAKE_VLLM
from tests.timeouts import REFERENCE_GFLOPS, scaled_timeout, timeout_factor

torch.set_num_threads(1)


def _explicit_timeout(config: pytest.Config) -> bool:
    """Whether the run was given its timeout (``--timeout``, ``PYTEST_TIMEOUT``) rather than pyproject's."""
    import os

    return config.getoption("timeout", None) is not None or bool(os.environ.get("PYTEST_TIMEOUT"))


@pytest.hookimpl(trylast=True)  # after pytest-timeout has read its settings
def pytest_configure(config: pytest.Config) -> None:
    """pyproject's timeout scaled to this machine's measured one-thread float32 matmul rate
    (:mod:`tests.timeouts`); a timeout given on the command line or in ``PYTEST_TIMEOUT`` is kept as given."""
    if not hasattr(config, "_env_timeout") or _explicit_timeout(config):
        return
    from queryrl.machine import machine_info

    rate = machine_info().matmul_gflops["float32"]
    config._timeout_factor = timeout_factor(rate)  # type: ignore[attr-defined]
    config._timeout_rate = rate  # type: ignore[attr-defined]
    if config._env_timeout:  # type: ignore[attr-defined]
        config._env_timeout = scaled_timeout(config._env_timeout, rate)  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> str | None:
    factor = getattr(config, "_timeout_factor", None)
    if factor is None:
        return None
    rate = config._timeout_rate  # type: ignore[attr-defined]
    return (
        f"timeouts x{factor:.2f}: one-thread float32 matmul {rate:g} GFLOP/s here, {REFERENCE_GFLOPS:g} on the "
        f"machine the limits were set on (tests/timeouts.py)"
    )


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder for built tiny models, shared by the whole session."""
    return tmp_path_factory.mktemp("queryrl-cache")


@pytest.fixture
def tiny_cfg(model_cache: Path) -> DictConfig:
    """The default config, with the tiny model built into the session cache."""
    return load_config(None, [f"model.cache_dir={model_cache}"])


@pytest.fixture(scope="session")
def tiny_bundle(model_cache: Path) -> Any:
    """The tiny policy, tokenizer and reference (shared: do not train it in place)."""
    from queryrl.models import load_policy

    cfg = load_config(None, [f"model.cache_dir={model_cache}"])
    return load_policy(cfg.model, torch.device("cpu"), None, need_ref=True)


# A Ray worker that dies of a native crash, quoted from its log by WorkerDiedError ("Fatal Python error:
# Segmentation fault" with "__libc_malloc" and no Python traceback, during an FSDP weight sync over
# gloo): seen once in about 330 Ray clusters started by this suite on the development machine. Such a test runs once
# more (reported as a rerun, "R"); any other failure, or the same crash again, fails it.
NATIVE_CRASH = r"WorkerDiedError: .*Fatal Python error: (Segmentation fault|Aborted|Bus error)"

# code runs in the sandbox (test_code_forgery.py too: through the code reward's evaluator); a run of another
# xdist worker beside test_sandbox_isolation.py's cgroup checks shows there as an empty cgroup left behind
SANDBOX_TEST_FILES = {"test_sandbox_isolation.py", "test_code.py", "test_code_forgery.py", "test_tools.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``ray`` run one after another on one xdist worker (``make test`` runs two: each starts a
    Ray cluster of its own, and two at once would share the machine's two cores with the other worker's
    tests), and once more after a worker's native crash (:data:`NATIVE_CRASH`); tests marked ``gpu`` are
    skipped, with the reason, on a machine without CUDA; a ``timeout`` marker's limit is scaled to the
    machine as the default is (:func:`pytest_configure`)."""
    factor = getattr(config, "_timeout_factor", 1.0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        if factor > 1.0 and marker is not None and marker.args and isinstance(marker.args[0], int | float):
            # a test's own limit scales as the default does (the closest marker is the one pytest-timeout reads)
            limit = scaled_timeout(float(marker.args[0]), config._timeout_rate)  # type: ignore[attr-defined]
            item.add_marker(pytest.mark.timeout(limit, *marker.args[1:], **marker.kwargs), append=False)
        if "ray" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("ray"))
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=[NATIVE_CRASH]))
        elif Path(str(item.fspath)).name in SANDBOX_TEST_FILES:
            # they make pids cgroups under one parent, and one checks that none is left: together, one at a time
            item.add_marker(pytest.mark.xdist_group("sandbox"))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu); none is available here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CPU stand-in for vLLM 0.32 (tests/rollout/fake_vllm) as ``vllm``, for this process and for Ray workers
    started during the test (``PYTHONPATH``); the real vLLM, if installed, is out of the way until the test ends."""
    import importlib
    import os
    import sys

    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(FAKE_VLLM))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(FAKE_VLLM), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    module = importlib.import_module("vllm")
    assert Path(module.__file__).parent.parent == FAKE_VLLM
    module.LLM.instances.clear()
    yield module
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
