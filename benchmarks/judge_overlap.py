"""Judge latency against step time: rewards overlapping generation, or scored after it.

    python benchmarks/judge_overlap.py                    # writes results/judge_overlap.json
    python benchmarks/judge_overlap.py --latency-ms 500 --repeats 1

A judge server (:mod:`queryrl.testing.judge_server`, the toy similarity as its verdict) runs on
loopback in this process with a fixed latency per request; each mode trains the toy preset in a
fresh one-thread process whose reward function (``benchmarks/judge_reward.py``) makes one judge
call per response. Modes:

Each async mode runs once per ``--max-concurrency`` value (``reward.max_concurrency``; the mode's name
ends ``@<value>``):

- ``naive_after``: ``reward.manager=naive``, one generation chunk: after generation, one call
  after another (the time is inside ``timing_s/gen``, since the naive manager scores on submit);
- ``async_after``: ``reward.manager=async``, one generation chunk: every call starts after the
  whole batch is generated, ``reward.max_concurrency`` at a time;
- ``async_overlap_C``: ``reward.manager=async``, generation in chunks of ``C`` sequences (one mode per
  ``--chunks`` value): each chunk's calls start as soon as the chunk is generated, while the next
  chunks generate (queryrl's path whenever ``rollout.micro_batch_size`` is below the step's sequences).

Reported per mode (medians over the steps after ``--warmup``, then over the repeats): step wall
time, ``timing_s/gen``, ``timing_s/reward_wait``, and ``reward_wait`` in nominal judge latencies and
in the measured wall time of one judge call made alone (``single_call_s``: the latency plus what a
loopback HTTP round trip to the server costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import QUIET_OVERRIDES, RESULTS, TOY_CONFIG, machine, median, one_thread, run_worker, table, write_json

SCRIPT = Path(__file__).resolve()


def worker(s: dict[str, Any]) -> dict[str, Any]:
    """Train the toy preset with the judge reward in mode `s['mode']`; return its per-step metrics."""
    one_thread()
    from queryrl.config import load_config
    from queryrl.trainer.loop import Trainer

    total = s["batch"] * s["n"]
    mode, _, limit = s["mode"].partition("@")
    chunk = int(mode.rpartition("_")[2]) if mode.startswith("async_overlap_") else total
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            *QUIET_OVERRIDES,
            f"trainer.output_dir={tmp}",
            "trainer.experiment_name=bench",
            f"trainer.total_steps={s['steps']}",
            f"data.train_batch_size={s['batch']}",
            f"actor.ppo_mini_batch_size={s['batch']}",
            f"rollout.n={s['n']}",
            f"rollout.micro_batch_size={chunk}",
            f"data.max_response_length={s['response_length']}",
            f"reward.manager={'naive' if mode == 'naive_after' else 'async'}",
            f"reward.max_concurrency={limit or 1}",
            f"reward.function.path={SCRIPT.parent / 'judge_reward.py'}",
            "reward.function.name=compute_score",
            f"reward.kwargs.url={s['url']}",
        ]
        with Trainer(load_config(TOY_CONFIG, overrides)) as trainer:
            trainer.fit()
        rows = [json.loads(x) for x in (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()]
    return {"rows": rows}


def single_call_s(url: str, calls: int = 8) -> float:
    """Median wall time of one judge call made alone, by the benchmark's reward function (warm connection)."""
    import asyncio
    import time

    from judge_reward import compute_score

    async def measure() -> list[float]:
        await compute_score("", "warm-up", "hello", url=url)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            await compute_score("", "hi", "hello", url=url)
            times.append(time.perf_counter() - start)
        return times

    return statistics.median(asyncio.run(measure()))


def summarize(rows: list[dict[str, Any]], warmup: int, latency_s: float) -> dict[str, Any]:
    """Median step, generation and reward-wait times of `rows` after `warmup` steps."""
    kept = rows[warmup:]
    step = [r["timing_s/step"] - r.get("timing_s/save_checkpoint", 0.0) for r in kept]
    wait = [r.get("timing_s/reward_wait", 0.0) for r in kept]
    return {
        "step_s": median(step),
        "gen_s": median([r["timing_s/gen"] for r in kept]),
        "reward_wait_s": median(wait),
        "reward_wait_latencies": round(statistics.median(wait) / latency_s, 3),
        "score_mean": round(statistics.mean(r["critic/score/mean"] for r in kept), 4),
        "failed": sum(r.get("reward/failed", 0.0) for r in kept),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per mode")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4, help="prompts per step")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=64)
    parser.add_argument("--chunks", type=int, nargs="+", default=[4, 8, 16], help="async_overlap: sequences per chunk")
    parser.add_argument(
        "--max-concurrency", type=int, nargs="+", default=[16, 64], help="async: judge calls in flight (one set each)"
    )
    parser.add_argument("--no-naive", action="store_true", help="skip naive_after (one call after another: slow)")
    parser.add_argument("--out", type=Path, default=RESULTS / "judge_overlap.json")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    from judge_reward import judge

    from queryrl.testing.judge_server import make_app, running_server

    settings = {k: v for k, v in vars(args).items() if k not in {"worker", "out"}}
    latency_s = args.latency_ms / 1000
    app = make_app(judge, latency_ms=args.latency_ms)
    modes = [] if args.no_naive else ["naive_after"]
    for limit in args.max_concurrency:
        modes += [f"async_after@{limit}", *(f"async_overlap_{c}@{limit}" for c in args.chunks)]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with running_server(app, max_lifetime_s=3600) as url:
        one_call_s = single_call_s(url)
        print(f"one judge call alone: {one_call_s:.4f} s (nominal latency {latency_s} s)", flush=True)
        for r in range(args.repeats):
            for mode in modes if r % 2 == 0 else list(reversed(modes)):
                before = app.state.stats.requests
                app.state.stats.max_in_flight = 0
                s = {**settings, "mode": mode, "url": url}
                rows = run_worker(sys.executable, SCRIPT, ["--worker", json.dumps(s)])["rows"]
                run = summarize(rows, args.warmup, latency_s) | {
                    "judge_requests": app.state.stats.requests - before,
                    "max_in_flight": app.state.stats.max_in_flight,
                }
                runs[mode].append(run)
                print(f"repeat {r + 1} {mode:14s} {run}", flush=True)
    summary = {
        mode: {
            key: median([run[key] for run in rs])
            for key in ("step_s", "gen_s", "reward_wait_s", "reward_wait_latencies")
        }
        for mode, rs in runs.items()
    }
    for values in summary.values():
        values["reward_wait_calls"] = round(values["reward_wait_s"] / one_call_s, 3)
    results = {
        "latency_ms": args.latency_ms,
        "single_call_s": round(one_call_s, 4),
        "summary": summary,
        "goal": {"reward_wait_latencies_at_most": 1.1},
        "settings": settings | {"samples_per_step": args.batch * args.n},
        "machine": machine() | {"shared": True},
        "runs": runs,
    }
    write_json(args.out, results)
    print()
    print(
        table(
            ["mode", "step s", "gen s", "reward_wait s", "reward_wait / latency", "reward_wait / one call"],
            [
                [m, v["step_s"], v["gen_s"], v["reward_wait_s"], v["reward_wait_latencies"], v["reward_wait_calls"]]
                for m, v in summary.items()
            ],
        )
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
