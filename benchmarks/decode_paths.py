"""The hf rollout's two decode paths on bench-trl's generation, alternately in fresh one-thread processes.

    python benchmarks/decode_paths.py                 # every case, 6 pairs each, writes results/decode_paths.json
    python benchmarks/decode_paths.py --case lora     # one case (the other cases' entries are kept)
    python benchmarks/decode_paths.py --pairs 3 --reps 10
    python benchmarks/decode_paths.py --model runs/models/smollm2-135m --case plain --n 1 --tokens 64 --greedy
        # a Hugging Face folder instead of the tiny model: writes results/decode_paths_<folder name>.json

One generation is what a bench-trl step generates: the tiny Qwen2 of configs/toy_grpo.yaml, the
first ``--prompts`` chat-templated prompts of ``builtin://toy_target_string/train`` times ``--n``
samples in one micro-batch, ``--tokens`` new tokens at temperature 1 (no top-k/top-p), through
``HFRollout.generate`` (so padding, EOS masking and the rollout log-probs are included). A worker
process times ``--reps`` generations after ``--warmup`` untimed ones and reports the median; a pair
runs ``fast_decode=off`` (transformers ``generate``) and ``auto`` (queryrl/rollout/fast_decode.py),
the order alternating from pair to pair; the speed-up is taken within each pair and its median is
reported, of wall time (``speedup_fast_over_generate``) and of the worker's CPU time
(``speedup_cpu_time``: less moved by other jobs on a shared machine).

``--model DIR`` times that causal-LM folder (SmolLM2-135M: ``LlamaForCausalLM``; any architecture the
fast path supports) with its own tokenizer and chat template on the same prompts, instead of the tiny
Qwen2; ``--greedy`` decodes greedily, so that both paths produce the same tokens and stop at the same
step (sampled rows of a real model end at EOS at other steps on the two paths, which draw other random
numbers).

Cases: ``plain`` (the model as it is; the top-level entries of the JSON), ``lora`` (the same model
as a peft LoRA policy, rank ``--lora-rank`` on all seven projections; the JSON's ``lora`` entry) and
``lora_bf16`` (the same over a bfloat16 base, fp32 adapters: the setting a real model trains LoRA
in; the ``lora_bf16`` entry). In the LoRA cases every timed generation follows an in-place touch of
the adapters (what an optimizer step does), so the fast path rebuilds its merged weights inside the
timed call: the cost a training loop pays once per rollout is included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import RESULTS, TOY_CONFIG, machine, median, one_thread, run_worker, table, version_of, write_json

SCRIPT = Path(__file__).resolve()
CASES = ["plain", "lora", "lora_bf16"]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def worker(s: dict[str, Any]) -> dict[str, Any]:
    """Time `s['reps']` generations with ``fast_decode=s['mode']``; return per-call seconds."""
    one_thread()
    import torch

    from queryrl.config import load_config
    from queryrl.data.builtin import BUILTIN_DATASETS
    from queryrl.data.prompts import encode_prompt
    from queryrl.models import load_policy
    from queryrl.rollout import HFRollout, SamplingParams

    lora = [f"model.lora.rank={s['lora_rank']}", f"model.lora.target_modules=[{','.join(LORA_TARGETS)}]"]
    is_lora = s["case"] in ("lora", "lora_bf16")
    lora += ["model.dtype=bfloat16"] if s["case"] == "lora_bf16" else []
    overrides = [f"model.path={s['model']}"] if s["model"] else []
    cfg = load_config(TOY_CONFIG, overrides + (lora if is_lora else []))
    bundle = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False)
    adapters = [p for p in bundle.model.parameters() if p.requires_grad] if is_lora else []
    rows = BUILTIN_DATASETS["toy_target_string"]("train")[: s["prompts"]]
    prompts = [encode_prompt(bundle.tokenizer, row["prompt"]) for row in rows]
    backend = HFRollout(bundle.model, bundle.tokenizer, micro_batch_size=s["prompts"] * s["n"], fast_decode=s["mode"])
    params = SamplingParams(temperature=1.0, n=s["n"], max_new_tokens=s["tokens"], do_sample=not s["greedy"])
    torch.manual_seed(s["seed"])
    times, cpu_times, widths = [], [], []
    for i in range(s["warmup"] + s["reps"]):
        with torch.no_grad():
            for param in adapters:  # an optimizer step's in-place update: the merged weights are stale
                param.add_(0.0)
        start, cpu_start = time.perf_counter(), time.process_time()
        out = backend.generate(prompts, params)
        if i >= s["warmup"]:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
            widths.append(out.response_ids.shape[1])
    return {
        "decode_path": backend.decode_path,
        "generate_s": times,
        "cpu_s": cpu_times,
        "response_width": widths,
        "mean_response_length": float(out.response_lengths.float().mean()),
        "prompt_lengths": [len(p) for p in prompts],
        "last_response_ids": out.response_ids.tolist(),
        "architecture": type(getattr(bundle.model, "get_base_model", lambda: bundle.model)()).__name__,
        "versions": {p: version_of(p) for p in ("torch", "transformers")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--model", type=Path, help="a Hugging Face causal-LM folder (default: the tiny Qwen2)")
    parser.add_argument("--greedy", action="store_true", help="greedy decoding (default: temperature 1)")
    parser.add_argument("--out", type=Path, help="default: results/decode_paths[_<model folder name>].json")
    args = parser.parse_args()
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there (want a Hugging Face causal-LM folder)")
    if args.out is None:
        args.out = RESULTS / (f"decode_paths_{args.model.resolve().name}.json" if args.model else "decode_paths.json")
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    # each case replaces its own entries: the plain case the top level, the others their own key
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for case in CASES if args.case == "all" else [args.case]:
        print(f"case {case}", flush=True)
        measured = run_case(args, case)
        if case == "plain":
            results = measured | {k: v for k, v in results.items() if k in CASES}
        else:
            results[case] = measured
        write_json(args.out, results)
        print()
        print(decode_table(measured))
        print(f"\n{case}: speed-up {measured['speedup_fast_over_generate']}x; wrote {args.out}\n")


def run_case(args: argparse.Namespace, case: str) -> dict[str, Any]:
    """`args.pairs` pairs of (generate, fast) workers for `case`; the medians and every pair."""
    settings = {k: getattr(args, k) for k in ("reps", "warmup", "prompts", "n", "tokens", "seed")}
    settings |= {"case": case, "lora_rank": args.lora_rank, "greedy": args.greedy}
    settings["model"] = str(args.model.resolve()) if args.model else None
    pairs = []
    for i in range(args.pairs):
        order = ["off", "auto"] if i % 2 == 0 else ["auto", "off"]
        pair: dict[str, Any] = {"order": order}
        runs = {}
        for mode in order:
            run = runs[mode] = run_worker(sys.executable, SCRIPT, ["--worker", json.dumps(settings | {"mode": mode})])
            pair[mode] = {
                "decode_path": run["decode_path"],
                "median_generate_s": median(run["generate_s"]),
                "min_generate_s": round(min(run["generate_s"]), 4),
                "median_cpu_s": median(run["cpu_s"]),
                "response_width": sorted(set(run["response_width"])),
                "mean_response_length": round(run["mean_response_length"], 2),
            }
            print(f"pair {i + 1} fast_decode={mode:4s} median {pair[mode]['median_generate_s']:.4f} s", flush=True)
        if args.greedy:  # the same function: the same tokens (of the last timed generation)
            pair["same_tokens"] = runs["off"]["last_response_ids"] == runs["auto"]["last_response_ids"]
        pair["speedup"] = round(pair["off"]["median_generate_s"] / pair["auto"]["median_generate_s"], 3)
        pair["speedup_cpu"] = round(pair["off"]["median_cpu_s"] / pair["auto"]["median_cpu_s"], 3)
        pairs.append(pair)
    if args.model:
        model = f"{args.model.resolve().name} ({run['architecture']}), "
    else:
        model = "queryrl built-in tiny Qwen2 (configs/toy_grpo.yaml model.tiny), "
    model += "bfloat16" if case == "lora_bf16" else "float32"
    if case != "plain":
        model += (
            f", as a peft LoRA policy (rank {args.lora_rank} on {', '.join(LORA_TARGETS)}; "
            "merged weights rebuilt in every timed call)"
        )
    return {
        "speedup_fast_over_generate": round(statistics.median(p["speedup"] for p in pairs), 3),
        # the process's CPU time: less moved than wall time by other jobs on a shared machine
        "speedup_cpu_time": round(statistics.median(p["speedup_cpu"] for p in pairs), 3),
        "median_generate_s": {
            "generate": median([p["off"]["median_generate_s"] for p in pairs]),
            "fast": median([p["auto"]["median_generate_s"] for p in pairs]),
        },
        "settings": settings
        | {
            "model": model,
            "model_path": settings["model"],
            "sequences": args.prompts * args.n,
            "prompt_lengths": run["prompt_lengths"],
            "sampling": ("greedy" if args.greedy else "temperature 1, no top-k/top-p") + ", one micro-batch",
        },
        "versions": run["versions"],
        "machine": machine() | {"shared": True},
        "pairs": pairs,
    }


def decode_table(d: dict[str, Any]) -> str:
    """One row per pair and the medians."""
    rows: list[list[Any]] = [
        [i + 1, " then ".join(p["order"]), p["off"]["median_generate_s"], p["auto"]["median_generate_s"], p["speedup"]]
        for i, p in enumerate(d["pairs"])
    ]
    rows.append(
        [
            "**median**",
            "",
            d["median_generate_s"]["generate"],
            d["median_generate_s"]["fast"],
            f"**{d['speedup_fast_over_generate']}**",
        ]
    )
    return table(["pair", "order (fast_decode)", "generate s", "fast path s", "speed-up"], rows)


if __name__ == "__main__":
    main()
