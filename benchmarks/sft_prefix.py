"""``sft.share_prefix_forward`` on and off on the real-model bench's warm-up SFT, paired.

    python benchmarks/sft_prefix.py --model runs/models/gemma3-270m \
        --data runs/grid/warmall_amd/fold2of10_g7/warmup_data/warmup.parquet   # -> benchmarks/results/sft_prefix.json

Each run is the bench's own ``queryrl sft`` command (``real_model.sft_cmd``: LoRA 16 on the attention projections,
the restricted head, batches of 8 in micro-batches of 4, 48-token targets, one thread) on `--data` (a bench run's
``warmup_data/warmup.parquet``) for `--steps` optimizer steps, with ``sft.share_prefix_forward`` true or false. The runs
alternate off, on, off, on (`--pairs` pairs), so that a change of the machine's load falls on both arms alike. The
JSON holds every run's per-step ``timing_s/step`` and ``sft/loss`` (the arms see the same batches in the same order:
the losses must agree to float rounding), the per-arm mean step time, their ratio, the largest loss difference,
the machine and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import machine, write_json  # noqa: E402
from real_model import parse_args as bench_args  # noqa: E402
from real_model import sft_cmd  # noqa: E402


def run_once(args: argparse.Namespace, share: bool, index: int) -> dict[str, Any]:
    """One short ``queryrl sft`` run; its per-step times and losses."""
    name = f"{'on' if share else 'off'}_{index}"
    work = args.work / name
    shutil.rmtree(work, ignore_errors=True)
    bench = bench_args(["--model", str(args.model), "--threads", "1"])
    queryrl = str(Path(sys.executable).with_name("queryrl"))
    cmd = sft_cmd(queryrl, bench, args.model, str(args.data), work, "warmup")
    cmd = [c for c in cmd if not c.startswith("sft.max_steps=")]
    cmd += [f"sft.max_steps={args.steps}", f"sft.share_prefix_forward={str(share).lower()}", "trainer.plot=false"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = (work / "warmup" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    return {
        "name": name,
        "share_prefix": share,
        "step_s": [round(float(r["timing_s/step"]), 2) for r in rows],
        "loss": [float(r["sft/loss"]) for r in rows],
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean step time per arm, the off/on ratio and the largest per-step loss difference between arms."""
    steps = {arm: [s for r in runs if r["share_prefix"] is arm for s in r["step_s"]] for arm in (False, True)}
    off, on = statistics.mean(steps[False]), statistics.mean(steps[True])
    losses = [r["loss"] for r in runs]
    gap = max(abs(a - b) for other in losses[1:] for a, b in zip(losses[0], other, strict=True))
    return {
        "mean_step_s_off": round(off, 2),
        "mean_step_s_on": round(on, 2),
        "speedup": round(off / on, 3),
        "max_loss_diff": gap,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the bench's model folder (Gemma 3 270M)")
    parser.add_argument("--data", type=Path, required=True, help="a bench run's warmup_data/warmup.parquet")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps a run")
    parser.add_argument("--pairs", type=int, default=2, help="off/on pairs, alternating")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench_sft_prefix")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sft_prefix.json")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file (a bench run's warmup_data/warmup.parquet)")
    loadavg_before = [round(x, 2) for x in os.getloadavg()]
    runs = [run_once(args, share, i) for i in range(args.pairs) for share in (False, True)]
    result = {
        "command": " ".join(sys.argv),
        "data": str(args.data),
        "steps": args.steps,
        "runs": runs,
        "summary": summary(runs),
        "loadavg_before": loadavg_before,
        "machine": machine(),
    }
    write_json(args.out, result)
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
