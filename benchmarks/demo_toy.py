"""``make demo-toy`` timed: its wall time and how far the reward rises (``make bench-demo-toy``).

    python benchmarks/demo_toy.py              # 3 runs, one after another
    python benchmarks/demo_toy.py --runs 1

Each run is ``make demo-toy``'s command, ``queryrl train --config configs/toy_grpo.yaml`` (120 GRPO steps of
the built-in tiny Qwen2 learning to answer "hello", one thread), in a fresh process and a folder of its own.
Recorded per run: the wall time of the whole command (start-up, model build, training, checkpoints, the run
page) and the mean ``critic/score/mean`` of the first and last 10 steps; and the machine, with its load
average at the end (other jobs on the cores stretch the wall time): ``benchmarks/results/demo_toy.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, TOY_CONFIG, machine, write_json

SCORE = "critic/score/mean"
EDGE = 10  # steps averaged at each end


def score_ends(metrics: Path, edge: int = EDGE) -> tuple[float, float]:
    """The mean ``critic/score/mean`` of the first and of the last `edge` steps of a run's metrics.jsonl."""
    scores = []
    for line in metrics.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if SCORE in record:
            scores.append(float(record[SCORE]))
    if len(scores) < 2 * edge:
        raise ValueError(f"{metrics}: {len(scores)} steps with {SCORE}, need at least {2 * edge}")
    return statistics.fmean(scores[:edge]), statistics.fmean(scores[-edge:])


def one_run(folder: Path) -> dict[str, Any]:
    """``make demo-toy``'s command in `folder`: its wall time and the score at both ends."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    args = ["train", "--config", str(TOY_CONFIG), f"trainer.output_dir={folder}", "trainer.resume=disable"]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "queryrl.cli", *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"queryrl train failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    first, last = score_ends(folder / "toy_grpo" / "metrics.jsonl")
    return {"wall_s": round(wall, 1), "score_first": round(first, 4), "score_last": round(last, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "demo_toy.json")
    args = parser.parse_args()
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="demo_toy_") as tmp:
            runs.append(one_run(Path(tmp)))
        print(f"run {i + 1}: {json.dumps(runs[-1])}", flush=True)
    walls = [r["wall_s"] for r in runs]
    result = {
        "command": f"queryrl train --config {TOY_CONFIG.relative_to(TOY_CONFIG.parents[1])}",
        "runs": runs,
        "wall_s": {"median": statistics.median(walls), "min": min(walls), "max": max(walls)},
        "machine": machine(),
    }
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
