"""Two settings of the real-model bench's warm-up SFT, paired: ``sft.share_prefix_forward`` off and on (`--arms
share_prefix`, the default), or float32 against bfloat16 compute (`--arms dtype`: ``model.compute_dtype=bfloat16``
over float32 weights, what the bench's ``--sft-dtype bfloat16`` passes).

    python benchmarks/sft_prefix.py --model runs/models/gemma3-270m \
        --data runs/grid/warmall_amd/fold2of10_g7/warmup_data/warmup.parquet   # -> benchmarks/results/sft_prefix.json
    python benchmarks/sft_prefix.py --arms dtype --model runs/models/gemma3-270m \
        --data runs/grid/mentwarm_amd/fold2of10_g7/warmup_data/warmup.parquet --out benchmarks/results/sft_dtype.json

Each run is the bench's own ``queryrl sft`` command (``real_model.sft_cmd``: LoRA 16 on the attention projections,
the restricted head, batches of 8 in micro-batches of 4, 48-token targets, one thread) on `--data` (a bench run's
``warmup_data/warmup.parquet``) for `--steps` optimizer steps, with the arm's setting. The runs alternate first arm,
second arm (`--pairs` pairs), so that a change of the machine's load falls on both arms alike. The JSON holds every
run's per-step ``timing_s/step`` and ``sft/loss`` (the arms see the same batches in the same order: with the prefix
arms the losses must agree to float rounding; with the dtype arms they differ by bf16's rounding, reported), the
per-arm mean step time, their ratio (first arm over second), the largest loss difference, the machine and the load
average.
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

ARMS: dict[str, tuple[tuple[str, list[str]], tuple[str, list[str]]]] = {
    "share_prefix": (("off", ["sft.share_prefix_forward=false"]), ("on", ["sft.share_prefix_forward=true"])),
    "dtype": (("float32", []), ("bfloat16", ["model.compute_dtype=bfloat16"])),
}


def run_once(args: argparse.Namespace, arm: str, overrides: list[str], index: int) -> dict[str, Any]:
    """One short ``queryrl sft`` run of arm `arm` (its `overrides` added); its per-step times and losses."""
    name = f"{arm}_{index}"
    work = args.work / name
    shutil.rmtree(work, ignore_errors=True)
    bench = bench_args(["--model", str(args.model), "--threads", "1"])
    queryrl = str(Path(sys.executable).with_name("queryrl"))
    cmd = sft_cmd(queryrl, bench, args.model, str(args.data), work, "warmup")
    cmd = [c for c in cmd if not c.startswith("sft.max_steps=")]
    cmd += [f"sft.max_steps={args.steps}", *overrides, "trainer.plot=false"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = (work / "warmup" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    return {
        "name": name,
        "arm": arm,
        "step_s": [round(float(r["timing_s/step"]), 2) for r in rows],
        "loss": [float(r["sft/loss"]) for r in rows],
    }


def summary(runs: list[dict[str, Any]], arms: tuple[str, str] = ("off", "on")) -> dict[str, Any]:
    """Mean step time per arm (``mean_step_s_<arm>``), the first arm's over the second's (``speedup``) and the
    largest per-step loss difference between any two runs."""
    means = {arm: statistics.mean(s for r in runs if r["arm"] == arm for s in r["step_s"]) for arm in arms}
    losses = [r["loss"] for r in runs]
    gap = max(abs(a - b) for other in losses[1:] for a, b in zip(losses[0], other, strict=True))
    return {
        **{f"mean_step_s_{arm}": round(mean, 2) for arm, mean in means.items()},
        "speedup": round(means[arms[0]] / means[arms[1]], 3),
        "max_loss_diff": gap,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="the bench's model folder (Gemma 3 270M)")
    parser.add_argument("--data", type=Path, required=True, help="a bench run's warmup_data/warmup.parquet")
    parser.add_argument("--arms", choices=sorted(ARMS), default="share_prefix", help="the two settings compared")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps a run")
    parser.add_argument("--pairs", type=int, default=2, help="pairs of runs, the arms alternating")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench_sft_prefix")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sft_prefix.json")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file (a bench run's warmup_data/warmup.parquet)")
    loadavg_before = [round(x, 2) for x in os.getloadavg()]
    arms = ARMS[args.arms]
    runs = [run_once(args, arm, overrides, i) for i in range(args.pairs) for arm, overrides in arms]
    result = {
        "command": " ".join(sys.argv),
        "data": str(args.data),
        "arms": dict(arms),
        "steps": args.steps,
        "runs": runs,
        "summary": summary(runs, (arms[0][0], arms[1][0])),
        "loadavg_before": loadavg_before,
        "machine": machine(),
    }
    write_json(args.out, result)
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
