"""The vocabulary-restricted head (``model.vocab.restrict``) against the full one in the real-model bench's other
stages: the warm-up SFT and the eval of a trained system, paired.

    python benchmarks/vocab_head_stages.py --model runs/models/gemma3-270m \
        --warmup-data runs/bench_real_defaults/warmup_data/warmup.parquet \
        --eval-model runs/bench_real_defaults/warmup --eval-data runs/bench_real_defaults/data/test.parquet
    # -> benchmarks/results/vocab_head_stages.json

SFT: ``queryrl sft`` as ``benchmarks/real_model.py`` runs the warm-up (:func:`real_model.sft_cmd`: LoRA on the
config's attention projections, batches of 8 in micro-batches of 4, `--threads` threads) for `--sft-steps` steps,
with and without ``model.vocab.restrict``; per run its per-step ``timing_s/step``, their mean after the first
step, the wall time (model load, the kept set and the save included) and the kept count. Eval: ``queryrl eval``
as the bench runs it (:func:`real_model._eval_cmd`: greedy, 48 tokens, batches of 8) of `--eval-model` on the
first `--eval-rows` rows of `--eval-data`, with the full head and with ``--vocab-ids`` (the restricted SFT
run's kept ids); per run the wall time, Recall@5 and format_ok, and how many replies the two heads decoded
alike. Per dtype (float32, and bfloat16 where asked) the arms alternate off, on, on, off, ... (`--pairs`
pairs), so that a change of the machine's load falls on both alike; the machine and its load before and after
are recorded. Compare only numbers of one file.
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

from common import machine  # noqa: E402
from real_model import _eval_cmd, sft_cmd  # noqa: E402
from real_model import parse_args as bench_args  # noqa: E402

QUERYRL = str(Path(sys.executable).with_name("queryrl"))


def _run(cmd: list[str], log: Path, env: dict[str, str]) -> float:
    """Run `cmd` (output to `log`); its wall time; exit with the log's name when it fails."""
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, check=False).returncode
    if rc != 0:
        raise SystemExit(f"{cmd[1]} exited {rc}; see {log}")
    return round(time.perf_counter() - start, 1)


def sft_once(args: argparse.Namespace, dtype: str, restrict: bool, index: int, env: dict[str, str]) -> dict[str, Any]:
    """One warm-up SFT run of `args.sft_steps` steps; its step times."""
    name = f"sft_{dtype}_{'on' if restrict else 'off'}_{index}"
    given = ["--model", str(args.model), "--threads", str(args.threads), *(["--restrict-vocab"] if restrict else [])]
    cmd = sft_cmd(QUERYRL, bench_args(given), args.model, str(args.warmup_data), args.work, name)
    cmd += [f"sft.max_steps={args.sft_steps}", "trainer.logger=[jsonl]", "trainer.plot=false"]
    cmd += [f"model.compute_dtype={dtype}"] if dtype != "float32" else []
    wall = _run(cmd, args.work / f"{name}.log", env)
    rows = [json.loads(x) for x in (args.work / name / "metrics.jsonl").read_text().splitlines()]
    steps = [round(float(r["timing_s/step"]), 3) for r in rows]
    return {
        "stage": "sft",
        "dtype": dtype,
        "restrict": restrict,
        "folder": str(args.work / name),
        "wall_s": wall,
        "vocab_kept": rows[-1].get("data/vocab_kept"),
        "steps_s": steps,
        "mean_after_first_s": round(statistics.fmean(steps[1:] or steps), 3),
        "final_loss": rows[-1]["sft/loss"],
    }


def eval_once(
    args: argparse.Namespace, dtype: str, vocab: Path | None, index: int, env: dict[str, str]
) -> dict[str, Any]:
    """One ``queryrl eval`` of the trained model, with the full head or the kept ids `vocab`."""
    name = f"eval_{dtype}_{'on' if vocab else 'off'}_{index}"
    bench = bench_args(["--model", str(args.model), "--threads", str(args.threads), "--eval-processes", "1"])
    out = args.work / name / "eval.json"
    cmd = _eval_cmd(QUERYRL, str(args.eval_data), args.kb, bench, dtype, args.eval_rows)
    cmd += ["--systems", f"trained={args.eval_model}", "--out", str(out), "--bootstrap", "50"]
    cmd += ["--vocab-ids", str(vocab)] if vocab else []
    wall = _run(cmd, args.work / f"{name}.log", env)
    report = json.loads(out.read_text(encoding="utf-8"))
    system = report["systems"]["trained"]
    raws = [json.loads(x)["systems"]["trained"]["raw"] for x in (out.parent / "eval_samples.jsonl").open()]
    return {
        "stage": "eval",
        "dtype": dtype,
        "restrict": vocab is not None,
        "wall_s": wall,
        "head": report["settings"]["systems"][0],
        "rows": report["n_samples"],
        "recall@5": system.get("recall@5"),
        "format_ok": system.get("format_ok"),
        "raws": raws,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stage and dtype: each arm's mean (SFT: of the per-run step means; eval: of the walls) and off / on."""
    out: dict[str, Any] = {}
    for stage, key in (("sft", "mean_after_first_s"), ("eval", "wall_s")):
        for dtype in sorted({r["dtype"] for r in runs if r["stage"] == stage}):
            arm = {
                on: [r for r in runs if (r["stage"], r["dtype"], r["restrict"]) == (stage, dtype, on)] for on in (0, 1)
            }
            off, on = (round(statistics.fmean(r[key] for r in arm[i]), 2) for i in (0, 1))
            entry: dict[str, Any] = {"measure": key, "off": off, "on": on, "speedup": round(off / on, 2)}
            if stage == "eval":
                a, b = arm[0][0], arm[1][0]
                same = sum(x == y for x, y in zip(a["raws"], b["raws"], strict=True))
                entry |= {"same_replies": f"{same}/{len(a['raws'])}", "recall@5": [a["recall@5"], b["recall@5"]]}
            out[f"{stage}_{dtype}"] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / "runs" / "models" / "gemma3-270m")
    bench_dir = REPO / "runs" / "bench_real_defaults"
    parser.add_argument("--warmup-data", type=Path, default=bench_dir / "warmup_data" / "warmup.parquet")
    parser.add_argument("--eval-model", type=Path, default=bench_dir / "warmup", help="a trained system's folder")
    parser.add_argument("--eval-data", type=Path, default=bench_dir / "data" / "test.parquet")
    parser.add_argument(
        "--kb", type=Path, default=REPO.parent / "shared" / "data" / "kdconv" / "travel" / "kb_travel.json"
    )
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--sft-steps", type=int, default=20)
    parser.add_argument("--eval-rows", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=1, help="off/on pairs per dtype, alternating off,on,on,off,...")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("/tmp/queryrl_vocab_head_stages"))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vocab_head_stages.json")
    args = parser.parse_args(argv)
    for path in (args.model, args.warmup_data, args.eval_model, args.eval_data, args.kb):
        if not path.exists():
            print(f"{path} does not exist; nothing measured", file=sys.stderr)
            return 2
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    load_before, runs = os.getloadavg(), []
    for dtype in args.dtypes.split(","):
        vocab: Path | None = None
        for pair in range(args.pairs):
            for restrict in (False, True) if pair % 2 == 0 else (True, False):
                runs.append(sft_once(args, dtype, restrict, pair, env))
                vocab = Path(runs[-1]["folder"]) / "vocab_ids.json" if restrict else vocab
                print(json.dumps({k: runs[-1][k] for k in ("stage", "dtype", "restrict", "mean_after_first_s")}))
        for pair in range(args.pairs):
            for on in (False, True) if pair % 2 == 0 else (True, False):
                runs.append(eval_once(args, dtype, vocab if on else None, pair, env))
                print(json.dumps({k: runs[-1][k] for k in ("stage", "dtype", "restrict", "wall_s")}), flush=True)
    result = {
        "command": " ".join(
            ["python", "benchmarks/vocab_head_stages.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "model": str(args.model),
        "warmup_data": str(args.warmup_data),
        "eval_model": str(args.eval_model),
        "eval_data": str(args.eval_data),
        "sft_steps": args.sft_steps,
        "eval_rows": args.eval_rows,
        "threads": args.threads,
        "machine": machine() | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "summary": summary(runs),
        "runs": runs,
    }
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
