"""Shared helpers of the benchmarks: fresh worker processes, peak RSS, atomic JSON, tables."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's queryrl, whichever environment's python runs the benchmark
    sys.path.insert(1, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
# KdConv's travel folder, not in the repository (queryrl.apps.query_rewrite.data.kdconv.kdconv_missing says where it
# comes from): $KDCONV_DIR, else shared/data/kdconv/travel beside the checkout (kdconv_dir)
DEFAULT_KDCONV_DIR = REPO.parent / "shared" / "data" / "kdconv" / "travel"
# Qwen2-0.5B's shape (494 M parameters, 136 M of them the tied embedding): random models built in code from it
QWEN2_05B: dict[str, Any] = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TOY_CONFIG = REPO / "configs" / "toy_grpo.yaml"
# what a benchmark run of queryrl never needs: validation, plots, samples, extra checkpoints
QUIET_OVERRIDES = [
    "trainer.logger=[jsonl]",
    "trainer.plot=false",
    "trainer.save_every=0",
    "trainer.eval_every=0",
    "data.val_files=[]",
    "trainer.save_samples=0",
    "trainer.resume=disable",
]


def kdconv_dir() -> Path:
    """The KdConv travel folder the benches read: ``$KDCONV_DIR``, else :data:`DEFAULT_KDCONV_DIR`."""
    return Path(os.environ.get("KDCONV_DIR") or DEFAULT_KDCONV_DIR)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_thread() -> None:
    """Pin torch to one intra-op and one inter-op thread (call before any torch work)."""
    import torch

    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # already set once in this process
        torch.set_num_interop_threads(1)


def run_worker(
    python: str, script: Path, args: list[str], timeout: float = 1800, env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``python script args`` in a fresh one-thread process (`env_extra` added to its environment);
    return the JSON of its last stdout line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env |= env_extra or {}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [python, str(script), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def queryrl_malloc_env() -> dict[str, str]:
    """The glibc malloc thresholds queryrl's trainer sets for itself (``trainer.malloc_mmap_threshold_mb``'s
    default, ``queryrl/allocator.py``), as the environment variables that give another process the same:
    the TRL benches' ``--trl-malloc same``."""
    from queryrl.allocator import TRIM_FACTOR
    from queryrl.config.schema import TrainerConfig

    threshold = TrainerConfig().malloc_mmap_threshold_mb << 20
    return {"MALLOC_MMAP_THRESHOLD_": str(threshold), "MALLOC_TRIM_THRESHOLD_": str(TRIM_FACTOR * threshold)}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` to `path` atomically (a temporary file in the same folder, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    Path(tmp).replace(path)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    from queryrl.machine import machine_info

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "threads_per_process": 1,
        "loadavg_at_end": [round(x, 2) for x in load],
        # the CPU, torch's capability, native bf16, one-thread matmul rates (queryrl.machine)
        **machine_info().as_dict(),
    }


def median(values: list[float]) -> float:
    """The median, rounded to 4 decimals."""
    return round(statistics.median(values), 4)


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def version_of(package: str) -> str | None:
    """The installed version of `package`, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def python_exe() -> str:
    """The interpreter running this benchmark."""
    return sys.executable


def random_batch(n: int, prompt: int, response: int, vocab: int, group: int, seed: int) -> Any:
    """A scored GRPO batch of `n` random sequences (`prompt` + `response` tokens of ids below `vocab`, every token
    real, `group` sequences a prompt, random advantages) for the benches that time an update on a random model."""
    import torch

    from queryrl.engine.batch import Batch

    gen = torch.Generator().manual_seed(seed)
    return Batch(
        prompt_ids=torch.randint(0, vocab, (n, prompt), generator=gen),
        prompt_mask=torch.ones(n, prompt, dtype=torch.long),
        response_ids=torch.randint(0, vocab, (n, response), generator=gen),
        response_attention_mask=torch.ones(n, response, dtype=torch.long),
        response_mask=torch.ones(n, response),
        group_ids=torch.arange(n) // group,
        advantages=torch.randn(n, response, generator=gen),
    )
