"""glibc malloc thresholds for a training process (queryrl/allocator.py).

Each case runs in a fresh interpreter: the setting is process-wide and once per process. What glibc
does is read back with ``mallinfo2``: a 40 MiB block (above glibc's largest dynamic threshold, 32 MiB)
is mapped on its own by default (``hblks`` + 1) and comes from the heap once the threshold is 64 MiB,
where it stays after ``free`` (``fordblks``, the heap's free bytes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from queryrl.config import ConfigError, load_config
from queryrl.config.schema import TrainerConfig

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc only (Linux)"
)

PROBE = """
import ctypes, json, sys
from queryrl.allocator import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
said = [keep_freed_memory(int(x)) for x in sys.argv[1:]]
before = libc.mallinfo2().hblks
block = libc.malloc(40 << 20)
mapped = libc.mallinfo2().hblks - before
libc.free(block)
print(json.dumps({"said": said, "mapped": mapped, "free_heap_mib": libc.mallinfo2().fordblks >> 20}))
"""


def probe(*thresholds: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, thresholds)],
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@glibc
def test_defaults_map_a_large_block_on_its_own() -> None:
    got = probe(0)
    assert got["said"] == ["glibc malloc: defaults (threshold 0)"]
    assert got["mapped"] == 1


@glibc
def test_a_threshold_keeps_blocks_under_it_in_the_heap_after_free() -> None:
    got = probe(64)
    assert got["said"] == ["glibc malloc: blocks under 64 MiB from the heap, 256 MiB of freed memory kept"]
    assert got["mapped"] == 0
    assert got["free_heap_mib"] >= 40  # freed, and still mapped for the next allocation


@glibc
def test_once_per_process_the_first_threshold_stays() -> None:
    got = probe(64, 16)
    assert got["said"][1] == "glibc malloc: already set (64 MiB)"
    assert got["mapped"] == 0  # 16 MiB would have mapped the 40 MiB block


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MALLOC_MMAP_MAX_": "65536"}, "MALLOC_MMAP_MAX_"),
        ({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"}, "GLIBC_TUNABLES"),
    ],
)
@glibc
def test_the_users_own_malloc_settings_win(env: dict[str, str], named: str) -> None:
    got = probe(64, env=env)
    assert got["said"] == [f"glibc malloc: left to {named}"]
    assert got["mapped"] == 1  # glibc's defaults: nothing was set over the user's


@glibc
def test_the_benches_give_trl_the_same_thresholds_through_the_environment() -> None:
    """``--trl-malloc same`` (benchmarks/common.py ``queryrl_malloc_env``): glibc does as under the trainer."""
    spec = importlib.util.spec_from_file_location(
        "bench_common", Path(__file__).resolve().parents[1] / "benchmarks" / "common.py"
    )
    assert spec is not None
    assert spec.loader is not None
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    env = common.queryrl_malloc_env()
    assert env == {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
    through_env, through_trainer = probe(0, env=env), probe(TrainerConfig().malloc_mmap_threshold_mb)
    assert through_env["mapped"] == through_trainer["mapped"] == 0
    assert through_env["free_heap_mib"] >= 40
    assert through_trainer["free_heap_mib"] >= 40


def test_a_threshold_out_of_range_is_refused_by_name() -> None:
    from queryrl.allocator import MAX_THRESHOLD_MB, keep_freed_memory

    with pytest.raises(ValueError, match=r"0\.\.511 MiB, got 512"):
        keep_freed_memory(MAX_THRESHOLD_MB + 1)
    for bad in (-1, 600):
        with pytest.raises(ConfigError, match=rf"trainer\.malloc_mmap_threshold_mb must be 0\.\.511.*got {bad}"):
            load_config(None, [f"trainer.malloc_mmap_threshold_mb={bad}"])


class Stop(Exception):
    """Raised where a process would load the model: the setting must have come before."""


def _stop(*_: Any, **__: Any) -> Any:
    raise Stop


def test_every_training_process_applies_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local trainer, SFT and the Ray worker each call it with the config's value, before the model loads."""
    import queryrl.distributed.worker as worker
    import queryrl.models
    import queryrl.trainer.components as components
    import queryrl.trainer.sft as sft

    cfg = load_config(
        None, ["trainer.malloc_mmap_threshold_mb=32", "data.train_files=[builtin://toy_target_string/train]"]
    )
    seen: list[int] = []
    for module in (components, sft, worker):
        monkeypatch.setattr(module, "keep_freed_memory", seen.append)
    monkeypatch.setattr(sft, "load_policy", _stop)
    monkeypatch.setattr(queryrl.models, "load_policy", _stop)
    components._prepare_process(cfg)
    assert seen == [32]
    with pytest.raises(Stop):
        sft.train_sft(cfg)
    assert seen == [32, 32]
    with pytest.raises(Stop):
        worker.PolicyWorker(OmegaConf.to_container(cfg, resolve=True), 0, 1)  # type: ignore[arg-type]
    assert seen == [32, 32, 32]
