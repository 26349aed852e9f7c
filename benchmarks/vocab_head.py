"""The vocabulary-restricted output head (``model.vocab.restrict``) against the full one: GRPO step phases of
the real-model bench's GRPO run, paired.

    python benchmarks/vocab_head.py --model runs/models/gemma3-270m \
        --data runs/bench_real_defaults/data/train.parquet   # -> benchmarks/results/vocab_head.json

Each run is ``queryrl train`` with ``configs/query_rewrite_kdconv.yaml`` and the GRPO settings of
``benchmarks/real_model.py`` (:func:`real_model.grpo_settings`: LoRA 16 on every projection, 4 prompts x 4,
48-token answers, `--threads` torch threads; `--batch` prompts a step: the bench's 4 by default), on `--data`
(the bench's training turns), the embedded RAG over the KdConv travel knowledge base, `--steps` steps, no
validation and no checkpoint. Per dtype (float32, and bfloat16 as mixed precision over float32 weights) the
runs alternate off, on, on, off, ... (`--pairs` pairs), so that a change of the machine's load falls on both
arms alike; the JSON holds every run's per-step
``timing_s/{gen,ref,update_actor,step}``, their means over the steps after the first (the first pays one-time
costs), the kept vocabulary (``data/vocab_kept``), the machine (CPU model, bf16 flags) and the load average
before and after. Compare only numbers of one file: they are paired on one machine at one time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import kdconv_dir, write_json  # noqa: E402
from real_model import CONFIG, grpo_settings  # noqa: E402
from real_model import parse_args as bench_args  # noqa: E402

PHASES = ("gen", "ref", "update_actor", "step")


def cpu_summary() -> dict[str, Any]:
    """The CPU's model name and whether it has native bf16 arithmetic (from /proc/cpuinfo)."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return {}
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    return {"cpu": model, "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}


def short_grpo_run(
    args: argparse.Namespace, name: str, dtype: str, bench: argparse.Namespace, extra: list[str], env: Any = None
) -> tuple[list[dict[str, Any]], float]:
    """One short ``queryrl train`` run of the bench's GRPO settings (`bench`) on `args.data`, no checkpoint, with the
    `extra` overrides and `env`; its metrics rows and wall time."""
    cmd = [
        str(Path(sys.executable).with_name("queryrl")),
        "train",
        "--config",
        str(CONFIG),
        f"model.path={args.model}",
        f"trainer.output_dir={args.work}",
        f"trainer.experiment_name={name}",
        f"data.train_files=[{args.data}]",
        "data.val_files=[]",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "trainer.save_last=false",
        "trainer.resume=disable",
        f"app.query_rewrite.rag.corpus=kdconv:{args.kb}",
        *extra,
        *grpo_settings(bench, dtype),
    ]
    log = args.work / f"{name}.log"
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False, env=env).returncode
    wall = time.perf_counter() - start
    if rc != 0:
        raise SystemExit(f"{name}: queryrl train exited {rc}; see {log}")
    return [json.loads(x) for x in (args.work / name / "metrics.jsonl").read_text().splitlines()], wall


def run_once(args: argparse.Namespace, dtype: str, restrict: bool, index: int) -> dict[str, Any]:
    """One ``queryrl train`` run; its per-step phase times."""
    name = f"{dtype}_{'on' if restrict else 'off'}_{index}"
    given = {"--model": args.model, "--threads": args.threads, "--grpo-steps": args.steps, "--batch": args.batch}
    bench = bench_args([str(x) for pair in given.items() for x in pair])
    rows, wall = short_grpo_run(args, name, dtype, bench, [f"model.vocab.restrict={'true' if restrict else 'false'}"])
    steps = {p: [round(float(r[f"timing_s/{p}"]), 3) for r in rows] for p in PHASES}
    return {
        "dtype": dtype,
        "restrict": restrict,
        "wall_s": round(wall, 1),
        "vocab_kept": rows[-1].get("data/vocab_kept"),
        "steps_s": steps,
        "mean_after_first_s": {p: round(statistics.fmean(v[1:] or v), 3) for p, v in steps.items()},
        "response_length_mean": round(statistics.fmean(float(r.get("response_length/mean", 0.0)) for r in rows), 2),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per dtype: each arm's mean over its runs of the per-run means, and off / on (the speed-up)."""
    out: dict[str, Any] = {}
    for dtype in sorted({r["dtype"] for r in runs}):
        arms = {}
        for restrict in (False, True):
            mine = [r["mean_after_first_s"] for r in runs if r["dtype"] == dtype and r["restrict"] is restrict]
            arms["on" if restrict else "off"] = {p: round(statistics.fmean(m[p] for m in mine), 3) for p in PHASES}
        out[dtype] = {**arms, "speedup": {p: round(arms["off"][p] / arms["on"][p], 2) for p in PHASES}}
    return out


def short_run_parser(doc: str | None, name: str, pairs_help: str) -> argparse.ArgumentParser:
    """The options every short-run bench here takes: the model, the training rows and knowledge base, the dtypes,
    steps, alternating pairs and threads, a work folder and ``benchmarks/results/<name>.json``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / "runs" / "models" / "gemma3-270m")
    parser.add_argument("--data", type=Path, default=REPO / "runs" / "bench_real_defaults" / "data" / "train.parquet")
    parser.add_argument("--kb", type=Path, default=kdconv_dir() / "kb_travel.json")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=1, help=pairs_help)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path(f"/tmp/queryrl_{name}"))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / f"{name}.json")
    return parser


def fresh_work(args: argparse.Namespace) -> tuple[float, float, float] | None:
    """An empty ``--work`` folder and the load average before the runs; None (after one line on stderr) when the
    model, the rows or the knowledge base is missing."""
    for path in (args.model, args.data, args.kb):
        if not path.exists():
            print(f"{path} does not exist; nothing measured", file=sys.stderr)
            return None
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    return os.getloadavg()


def main(argv: list[str] | None = None) -> int:
    parser = short_run_parser(__doc__, "vocab_head", "off/on pairs per dtype, alternating off,on,on,off,...")
    parser.add_argument("--batch", type=int, default=4, help="prompts per step (the bench's 4; x rollout.n 4)")
    args = parser.parse_args(argv)
    load_before = fresh_work(args)
    if load_before is None:
        return 2
    runs = []
    for dtype in args.dtypes.split(","):
        for pair in range(args.pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)
            for restrict in order:
                runs.append(run_once(args, dtype, restrict, pair))
                print(json.dumps({k: runs[-1][k] for k in ("dtype", "restrict", "mean_after_first_s")}), flush=True)
    result = {
        "command": " ".join(["python", "benchmarks/vocab_head.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": str(args.model),
        "data": str(args.data),
        "steps": args.steps,
        "threads": args.threads,
        "batch": args.batch,
        "machine": {
            **cpu_summary(),
            "cores": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "summary": summary(runs),
        "runs": runs,
    }
    write_json(args.out, result)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
