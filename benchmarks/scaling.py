"""Step time and peak memory of queryrl against group size, batch size and response length.

    python benchmarks/scaling.py                          # writes results/scaling.json
    python benchmarks/scaling.py --steps 4 --group-sizes 2 4 8

Each point trains the toy preset (the built-in tiny Qwen2, one CPU thread) in a fresh process,
one setting varied from the base (8 prompts x 8 responses x 32 response tokens) at a time. A
point's step time is the median ``timing_s/step`` (checkpointing excluded) after ``--warmup``
steps; its memory is the process's peak RSS. Each axis gets a least-squares slope (seconds and
MiB per unit of the setting) and a log-log slope (the exponent ``k`` of ``time ~ setting**k``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import (
    QUIET_OVERRIDES,
    RESULTS,
    TOY_CONFIG,
    machine,
    median,
    one_thread,
    peak_rss_mb,
    run_worker,
    table,
    write_json,
)

SCRIPT = Path(__file__).resolve()


def worker(s: dict[str, Any]) -> dict[str, Any]:
    """Train `s['steps']` steps at one point; return its per-step metrics and peak RSS."""
    one_thread()
    from queryrl.config import load_config
    from queryrl.trainer.loop import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            *QUIET_OVERRIDES,
            f"trainer.output_dir={tmp}",
            "trainer.experiment_name=bench",
            f"trainer.total_steps={s['steps']}",
            f"data.train_batch_size={s['batch']}",
            f"actor.ppo_mini_batch_size={s['batch']}",
            f"actor.ppo_micro_batch_size={s['batch'] * s['n']}",
            f"rollout.micro_batch_size={s['batch'] * s['n']}",
            f"rollout.n={s['n']}",
            f"data.max_response_length={s['response_length']}",
            "actor.lr=1e-5",  # the responses keep their length over the run
        ]
        with Trainer(load_config(TOY_CONFIG, overrides)) as trainer:
            trainer.fit()
        rows = [json.loads(x) for x in (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()]
    return {"rows": rows, "peak_rss_mb": peak_rss_mb()}


def slopes(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares slope of ``y`` on ``x``, and of ``log y`` on ``log x``."""

    def fit(a: list[float], b: list[float]) -> float:
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        var = sum((x - ma) ** 2 for x in a)
        return sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True)) / var if var else float("nan")

    return {
        "per_unit": round(fit(xs, ys), 6),
        "loglog": round(fit([math.log(x) for x in xs], [math.log(y) for y in ys]), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--base", type=int, nargs=3, default=[8, 8, 32], metavar=("BATCH", "N", "LENGTH"))
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--response-lengths", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--out", type=Path, default=RESULTS / "scaling.json")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    base = dict(zip(("batch", "n", "response_length"), args.base, strict=True))
    axes = {"n": args.group_sizes, "batch": args.batches, "response_length": args.response_lengths}
    points: dict[tuple[int, int, int], dict[str, Any]] = {}
    results: dict[str, Any] = {"axes": {}}
    for axis, values in axes.items():
        rows_out = []
        for value in values:
            s = base | {axis: value, "steps": args.steps}
            key = (s["batch"], s["n"], s["response_length"])
            if key not in points:  # the base point is shared by the three axes
                run = run_worker(sys.executable, SCRIPT, ["--worker", json.dumps(s)])
                kept = run["rows"][args.warmup :]
                points[key] = {
                    "step_s": median([r["timing_s/step"] - r.get("timing_s/save_checkpoint", 0.0) for r in kept]),
                    "gen_s": median([r["timing_s/gen"] for r in kept]),
                    "update_actor_s": median([r["timing_s/update_actor"] for r in kept]),
                    "tokens_per_step": median([r["perf/total_num_tokens"] for r in kept]),
                    "peak_rss_mb": round(run["peak_rss_mb"], 1),
                }
                print(f"batch={key[0]} n={key[1]} length={key[2]}: {points[key]}", flush=True)
            rows_out.append({axis: value, **points[key]})
        xs = [float(r[axis]) for r in rows_out]
        results["axes"][axis] = {
            "points": rows_out,
            "slope_step_s": slopes(xs, [r["step_s"] for r in rows_out]),
            "slope_peak_rss_mb": slopes(xs, [r["peak_rss_mb"] for r in rows_out]),
        }
    results |= {
        "settings": {"base": base, "steps": args.steps, "warmup": args.warmup},
        "machine": machine() | {"shared": True},
    }
    write_json(args.out, results)
    for axis, data in results["axes"].items():
        print(f"\n{axis}: step slope {data['slope_step_s']}, RSS slope {data['slope_peak_rss_mb']}")
        print(
            table(
                [axis, "step s", "gen s", "update s", "tokens/step", "peak RSS MB"],
                [
                    [p[axis], p["step_s"], p["gen_s"], p["update_actor_s"], p["tokens_per_step"], p["peak_rss_mb"]]
                    for p in data["points"]
                ],
            )
        )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
