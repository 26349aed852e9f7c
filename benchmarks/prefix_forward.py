"""``actor.share_prefix_forward`` on and off on the real-model bench's GRPO run, paired.

    python benchmarks/prefix_forward.py --model runs/grid/warmall_amd/fold2of10_g7/warmup \
        --data runs/grid/warmall_amd/fold2of10_g7/data/train.parquet   # -> benchmarks/results/prefix_forward.json

Each run is ``queryrl train`` with ``configs/query_rewrite_kdconv.yaml`` and the GRPO settings of
``benchmarks/real_model.py`` (LoRA 16 on every projection, the restricted head, 4 prompts x 4, 48-token answers,
one thread) from `--model` (a bench run's warm-up folder, so the answers are the trained length) on `--data`, for
`--steps` steps, in `--dtype` (``auto``: the bench's choice for this CPU), with ``actor.share_prefix_forward``
true or false (``actor.share_prompt_forward`` on in both: each distinct prompt runs once either way; the lever is
the prompts' common system prompt running once too). Both arms draw the same samples (the same seed and
weights), so the scores must agree. The runs alternate off, on, on, off, ... (`--pairs` pairs). The JSON holds
every run's per-step ``timing_s/{gen,ref,update_actor,step}`` and the per-arm means after the first step, their
ratios, the largest difference of ``critic/score/mean`` between arms, the machine and the load averages.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import machine, write_json  # noqa: E402
from real_model import choose_dtype  # noqa: E402
from real_model import parse_args as bench_args  # noqa: E402
from vocab_head import fresh_work, short_grpo_run, short_run_parser  # noqa: E402

PHASES = ("gen", "ref", "update_actor", "step")
SCORE = "critic/score/mean"


def run_once(args: Any, dtype: str, share: bool, index: int) -> dict[str, Any]:
    """One ``queryrl train`` run; its per-step phase times and mean scores."""
    name = f"{'on' if share else 'off'}_{index}"
    given = {"--model": args.model, "--threads": args.threads, "--grpo-steps": args.steps}
    bench = bench_args([str(x) for pair in given.items() for x in pair])
    extra = ["model.vocab.restrict=true", f"actor.share_prefix_forward={str(share).lower()}"]
    rows, wall = short_grpo_run(args, name, dtype, bench, extra, os.environ | {"OMP_NUM_THREADS": str(args.threads)})
    steps = {p: [round(float(r[f"timing_s/{p}"]), 3) for r in rows] for p in PHASES}
    return {
        "name": name,
        "share_prefix_forward": share,
        "wall_s": round(wall, 1),
        "steps_s": steps,
        "mean_after_first_s": {p: round(statistics.fmean(v[1:] or v), 3) for p, v in steps.items()},
        "score_mean": [float(r.get(SCORE, float("nan"))) for r in rows],
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each arm's mean over its runs of the per-run means, off / on per phase, and the largest score difference
    between any run and the first (the arms sample the same answers)."""
    arms = {}
    for share in (False, True):
        mine = [r["mean_after_first_s"] for r in runs if r["share_prefix_forward"] is share]
        arms["on" if share else "off"] = {p: round(statistics.fmean(m[p] for m in mine), 3) for p in PHASES}
    first = runs[0]["score_mean"]
    gap = max(abs(a - b) for r in runs[1:] for a, b in zip(first, r["score_mean"], strict=True))
    return {**arms, "speedup": {p: round(arms["off"][p] / arms["on"][p], 3) for p in PHASES}, "max_score_diff": gap}


def main(argv: list[str] | None = None) -> int:
    parser = short_run_parser(__doc__, "prefix_forward", "off/on pairs, alternating off,on,on,off,...")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    parser.set_defaults(steps=4, pairs=2)
    args = parser.parse_args(argv)
    load_before = fresh_work(args)
    if load_before is None:
        return 2
    dtype = choose_dtype(args.dtype)
    runs = []
    for pair in range(args.pairs):
        for share in (False, True) if pair % 2 == 0 else (True, False):
            runs.append(run_once(args, dtype, share, pair))
            print(json.dumps({k: runs[-1][k] for k in ("name", "mean_after_first_s")}), flush=True)
    result = {
        "command": " ".join(["python", "benchmarks/prefix_forward.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": str(args.model),
        "data": str(args.data),
        "dtype": dtype,
        "steps": args.steps,
        "threads": args.threads,
        "loadavg_before": [round(x, 2) for x in load_before],
        "machine": machine(),
        "summary": summary(runs),
        "runs": runs,
    }
    write_json(args.out, result)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
