"""queryrl against TRL's GRPOTrainer on a real-sized GRPO step (LoRA on a Qwen2-0.5B-shaped model), in CPU time.

    python benchmarks/trl_vs_queryrl_real.py                 # 2 pairs, writes results/trl_vs_queryrl_real.json
    python benchmarks/trl_vs_queryrl_real.py --pairs 1 --steps 2 --layers 2   # a smoke run

The setting (a reviewer's, in #28): a Qwen2ForCausalLM with Qwen2-0.5B's shape (494 M parameters; built
in code with random weights, nothing downloaded), LoRA rank 16 (alpha 32, no dropout) on all seven
projections, ``--batch`` prompts x ``--n`` samples, prompts of ``--prompt-tokens`` tokens, responses of
``--response-length`` tokens, one optimizer step per generation batch (no old-log-prob pass), KL off (no
reference model), token-mean loss, clip 0.2, AdamW, gradient checkpointing off, one thread. The compute
dtype is bfloat16 over float32 master weights where the CPU does bf16 natively (AMX or AVX512-BF16) and
float32 elsewhere (emulated bf16 is slower than float32); TRL gets the same (``bf16=True`` or not).

Equal work: the same model folder, the same prompts (a parquet of chat prompts that the tokenizer turns into
``--prompt-tokens`` tokens with the chat template, or one or two fewer where a word's tokens do not cut
exactly), the same reward function (queryrl's toy string
similarity), the same sampling (temperature 1, no top-k/top-p). The model's vocabulary is Qwen2's (151,936
rows), the tokenizer queryrl's tiny one (512 tokens): sampled ids outside it decode to nothing, in both
trainers alike. The response length is not forced by a logits processor; with random weights the EOS token
has a probability near 1/151,936 per step, so every response runs to the limit (the mean lengths are
recorded for both).

A pair runs queryrl and TRL one after the other in fresh processes, the order alternating; the ratio is
taken within a pair and the reported ratio is the median of the pairs'. Per step: CPU time (the process's
``time.process_time``, which a shared machine does not inflate the way it does wall time) and wall time;
per phase: generation and the update (queryrl's own ``timing_cpu_s/<phase>`` and ``timing_s/<phase>``
metrics, which ``trainer.cpu_timing=true`` turns on; TRL's methods wrapped); the worker's peak RSS. The
first ``--warmup`` steps are dropped.

The physical limit: the step's matmul work counted from the model's shape, at the machine's measured
one-thread matmul peak (a 2048^2 matmul in the compute dtype), plus, for each decode step, the larger of
its matmuls and streaming the weights once at the measured memory bandwidth. Two counts (``limit``):
``nominal`` runs every sequence's prompt through the update (the reviewer's count in #28: generation
prefills each distinct prompt once, the update does not share) and ``shared_prompt`` runs each distinct
prompt once in the update too. The update is a forward and the input-gradient half of a backward (the
base weights are frozen), plus LoRA's matmuls. Attention scores are counted; norms and activations are not.

``--trl-malloc same``: TRL's process gets the glibc malloc thresholds queryrl's trainer sets for itself
(as in benchmarks/trl_vs_queryrl.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import (
    QUIET_OVERRIDES,
    QWEN2_05B,
    REPO,
    RESULTS,
    TOY_CONFIG,
    machine,
    median,
    one_thread,
    peak_rss_mb,
    queryrl_malloc_env,
    run_worker,
    version_of,
    write_json,
)
from trl_vs_queryrl import grpo_overrides, pairs_table, reward_for_trl, trl_config

SCRIPT = Path(__file__).resolve()
MODELS = REPO / "runs" / "bench_models"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = {"rank": 16, "alpha": 32, "dropout": 0.0}
FILLER = "the customer asks about the phone price delivery warranty battery colour and stock today "


def shape(layers: int) -> dict[str, Any]:
    """Qwen2-0.5B's shape, with `layers` decoder layers (24 = the real depth)."""
    return {**QWEN2_05B, "num_hidden_layers": layers}


def build_inputs(layers: int, prompt_tokens: int, rows: int = 64) -> tuple[Path, Path]:
    """The model folder (random weights, Qwen2-0.5B's shape, queryrl's tiny tokenizer) and a parquet of
    `rows` chat prompts of exactly `prompt_tokens` tokens each; built once under runs/bench_models/."""
    import pandas as pd
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from queryrl.config import load_config
    from queryrl.data import encode_prompt
    from queryrl.models.tiny import build_tiny_model

    folder = MODELS / f"qwen2-0.5b-shape-random-l{layers}"
    data = MODELS / f"prompts-{prompt_tokens}.parquet"
    tiny = build_tiny_model(load_config(TOY_CONFIG, []).model.tiny)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    if not (folder / "config.json").is_file():
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        torch.manual_seed(0)
        config = Qwen2Config(
            **shape(layers),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        Qwen2ForCausalLM(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.replace(folder)
    if not data.is_file():

        def length(text: str) -> int:  # tokens of the templated prompt, as queryrl encodes it
            return len(encode_prompt(tokenizer, [{"role": "user", "content": text}]))

        records = []
        words = FILLER.split()
        for i in range(rows):
            head = f"Say hello. Request {i}:"
            filler = [words[(i + k) % len(words)] for k in range(4 * prompt_tokens)]
            low, high = 0, len(filler)  # the most filler words that keep the prompt within the length
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if length(" ".join([head, *filler[:mid]])) <= prompt_tokens else (low, mid - 1)
            text = " ".join([head, *filler[:low]])
            pad = filler[low] if low < len(filler) else "x"
            for cut in range(len(pad), 0, -1):  # then part of the next word, to reach it exactly
                if length(f"{text} {pad[:cut]}") == prompt_tokens:
                    text = f"{text} {pad[:cut]}"
                    break
            records.append(
                {
                    "data_source": "toy/target_string",
                    "prompt": [{"role": "user", "content": text}],
                    "ability": "toy",
                    "reward_model": {"style": "rule", "ground_truth": "hello"},
                    "extra_info": {"index": i, "prompt_tokens": length(text)},
                }
            )
        lengths = {r["extra_info"]["prompt_tokens"] for r in records}
        if min(lengths) < prompt_tokens - 2 or max(lengths) > prompt_tokens:  # a word's tokens may not cut exactly
            raise RuntimeError(f"prompt lengths {sorted(lengths)}, wanted {prompt_tokens}")
        data.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(records).to_parquet(data.with_suffix(".tmp"))
        data.with_suffix(".tmp").replace(data)
    return folder, data


class Clock:
    """Per-phase CPU and wall seconds of the current step, and the finished steps' totals."""

    def __init__(self) -> None:
        self.phase_cpu: dict[str, float] = {}
        self.phase_wall: dict[str, float] = {}
        self.steps: list[dict[str, Any]] = []
        self._begin = (0.0, 0.0)

    @contextmanager
    def phase(self, name: str) -> Any:
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            yield
        finally:
            self.phase_cpu[name] = self.phase_cpu.get(name, 0.0) + time.process_time() - cpu
            self.phase_wall[name] = self.phase_wall.get(name, 0.0) + time.perf_counter() - wall

    def begin(self) -> None:
        self.phase_cpu, self.phase_wall = {}, {}
        self._begin = (time.process_time(), time.perf_counter())

    def end(self) -> None:
        self.steps.append(
            {
                "cpu_s": time.process_time() - self._begin[0],
                "wall_s": time.perf_counter() - self._begin[1],
                "phases_cpu_s": dict(self.phase_cpu),
                "phases_wall_s": dict(self.phase_wall),
            }
        )


def wrap(obj: Any, name: str, clock: Clock, phase: str) -> None:
    """Time every call of ``obj.name`` as `phase` of the current step."""
    original = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        with clock.phase(phase):
            return original(*args, **kwargs)

    setattr(obj, name, timed)


def worker_queryrl(s: dict[str, Any]) -> dict[str, Any]:
    """`s['steps']` steps of queryrl's Trainer; per-step CPU/wall times, per-phase times, peak RSS.

    The times are the trainer's own (``trainer.cpu_timing=true``: ``timing_cpu_s/<phase>`` beside
    ``timing_s/<phase>`` in metrics.jsonl); a step is ``step`` less validation and checkpointing
    (:func:`queryrl_steps`).
    """
    one_thread()
    from queryrl.config import load_config
    from queryrl.trainer import loop

    folder, data = build_inputs(s["layers"], s["prompt_tokens"])
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            *QUIET_OVERRIDES,
            f"model.path={folder}",
            f"model.compute_dtype={'bfloat16' if s['bf16'] else 'null'}",
            f"model.lora.rank={LORA['rank']}",
            f"model.lora.alpha={LORA['alpha']}",
            f"model.lora.dropout={LORA['dropout']}",
            f"model.lora.target_modules=[{','.join(TARGETS)}]",
            f"data.train_files=[{data}]",
            f"data.max_prompt_length={s['prompt_tokens']}",
            f"data.max_response_length={s['response_length']}",
            f"trainer.output_dir={tmp}",
            *grpo_overrides(s),
            "model.gradient_checkpointing=false",
            "trainer.cpu_timing=true",
            *s["queryrl_overrides"],
        ]
        cfg = load_config(TOY_CONFIG, overrides)
        with loop.Trainer(cfg) as trainer:
            trainer.fit()
            decode_path = str(getattr(trainer.c.rollout, "decode_path", "generate"))
        rows = [json.loads(x) for x in (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()]
    return {
        "steps": queryrl_steps(rows),
        "response_length_mean": [r.get("response_length/mean") for r in rows],
        "prompt_length_mean": [r.get("prompt_length/mean") for r in rows],
        "peak_rss_mb": peak_rss_mb(),
        "versions": versions(),
        "decode_path": decode_path,
        "overrides": s["queryrl_overrides"],
    }


NOT_IN_STEP = ("step", "testing", "save_checkpoint")  # the step's total, and the phases around the update


def queryrl_steps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step of metrics.jsonl `rows` (a run with ``trainer.cpu_timing=true``): CPU and wall seconds of the step
    less validation and checkpointing, and each phase's, in :class:`Clock`'s layout (as TRL's side is measured)."""
    steps = []
    for row in rows:
        out: dict[str, Any] = {}
        for kind, prefix in (("cpu", "timing_cpu_s/"), ("wall", "timing_s/")):
            if f"{prefix}step" not in row:
                raise ValueError(f"metrics row of step {row.get('step')} has no {prefix}step (trainer.cpu_timing off?)")
            phases = {k[len(prefix) :]: v for k, v in row.items() if k.startswith(prefix)}
            out[f"{kind}_s"] = phases["step"] - phases.get("testing", 0.0) - phases.get("save_checkpoint", 0.0)
            out[f"phases_{kind}_s"] = {k: v for k, v in phases.items() if k not in NOT_IN_STEP}
        steps.append(out)
    return steps


def versions() -> dict[str, str | None]:
    return {p: version_of(p) for p in ("queryrl", "torch", "transformers", "trl", "peft", "accelerate")}


def worker_trl(s: dict[str, Any]) -> dict[str, Any]:
    """`s['steps']` steps of TRL's GRPOTrainer with peft LoRA on the same work."""
    one_thread()
    import pandas as pd
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    folder, data = build_inputs(s["layers"], s["prompt_tokens"])
    rows = pd.read_parquet(data).to_dict("records")
    dataset = Dataset.from_list(
        [{"prompt": [dict(m) for m in r["prompt"]], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows]
    )
    clock = Clock()

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            clock.begin()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            clock.end()

    with tempfile.TemporaryDirectory() as tmp:
        args = trl_config(s, tmp, bf16=s["bf16"], gradient_checkpointing=False)
        peft_config = LoraConfig(
            r=LORA["rank"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"], target_modules=TARGETS
        )
        trainer = GRPOTrainer(
            model=str(folder), reward_funcs=reward_for_trl, args=args, train_dataset=dataset, peft_config=peft_config
        )
        trainer.add_callback(StepClock())
        wrap(trainer, "_generate", clock, "gen")
        wrap(trainer, "_calculate_rewards", clock, "reward")
        wrap(trainer, "compute_loss", clock, "loss_forward")
        trainer.train()
        history = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "steps": clock.steps,
        "response_length_mean": [h.get("completions/mean_length") for h in history],
        "prompt_length_mean": [None for _ in history],
        "peak_rss_mb": peak_rss_mb(),
        "versions": versions(),
        "decode_path": "generate",  # GRPOTrainer without use_vllm: model.generate
        "overrides": [],
    }


def summarize_run(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Medians over the steps after `warmup`, and the raw steps."""
    kept = run["steps"][warmup:]
    phases = sorted({k for st in kept for k in st["phases_cpu_s"]})
    lengths = [x for x in run["response_length_mean"][warmup:] if x is not None]
    return {
        "median_step_cpu_s": median([st["cpu_s"] for st in kept]),
        "median_step_wall_s": median([st["wall_s"] for st in kept]),
        "median_phases_cpu_s": {k: median([st["phases_cpu_s"].get(k, 0.0) for st in kept]) for k in phases},
        "median_phases_wall_s": {k: median([st["phases_wall_s"].get(k, 0.0) for st in kept]) for k in phases},
        "peak_rss_mb": round(run["peak_rss_mb"], 1),
        "mean_response_length": round(sum(lengths) / len(lengths), 2) if lengths else None,
        "steps": run["steps"],
        "decode_path": run["decode_path"],
        "versions": run["versions"],
    }


def matmul_peak_gflops(dtype_name: str, size: int = 2048, reps: int = 8) -> float:
    """The best of `reps` one-thread ``size x size`` matmuls in `dtype_name`, in GFLOP/s."""
    import torch

    one_thread()
    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def bandwidth_gbs(mib: int = 512, reps: int = 5) -> float:
    """One thread's best read+write rate over a `mib` MiB copy, in GB/s."""
    import torch

    one_thread()
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best / 1e9


def step_flops(s: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Matmul FLOPs of one step, by phase, counted from the shape (see the module docstring)."""
    m = shape(s["layers"])
    e, i_, layers, vocab = m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"], m["vocab_size"]
    kv = m["num_key_value_heads"] * e // m["num_attention_heads"]
    body = layers * (2 * e * e + 2 * e * kv + 3 * e * i_)  # weights each token meets in the layers
    lora = layers * LORA["rank"] * ((e + e) * 2 + (e + kv) * 2 + (e + i_) * 3)
    u, b, p, t = s["batch"], s["batch"] * s["n"], s["prompt_tokens"], s["response_length"]

    def attention(tokens: float, context: float) -> float:  # q k^T and a v, per token
        return 4.0 * layers * e * context * tokens

    prefill = 2.0 * (body + lora) * u * p + attention(u * p, p / 2) + 2.0 * vocab * e * u
    decode = 2.0 * (body + lora + vocab * e) * b * (t - 1) + attention(b * (t - 1), p + t / 2)

    def update(prompt_rows: int) -> float:  # forward + input-gradient backward (2x), LoRA's weight grads
        tokens = prompt_rows * p + b * t
        forward = 2.0 * body * tokens + 2.0 * vocab * e * b * (t + 1) + attention(tokens, (p + t) / 2)
        return 2 * forward + 3 * 2.0 * lora * tokens

    return {
        "nominal": {"prefill": prefill, "decode": decode, "update": update(b)},
        "shared_prompt": {"prefill": prefill, "decode": decode, "update": update(u)},
        "per_decode_step": {"flops": decode / (t - 1), "weight_params": float(body + vocab * e)},
    }


def physical_limit(s: dict[str, Any], peak: float, bandwidth: float, bytes_per_param: int) -> dict[str, Any]:
    """Seconds the step needs at the matmul peak (GFLOP/s) and memory bandwidth (GB/s) measured here."""
    flops = step_flops(s)
    per = flops["per_decode_step"]
    decode_step = max(per["flops"] / (peak * 1e9), per["weight_params"] * bytes_per_param / (bandwidth * 1e9))
    out: dict[str, Any] = {}
    for name in ("nominal", "shared_prompt"):
        f = flops[name]
        seconds = {
            "prefill": f["prefill"] / (peak * 1e9),
            "decode": decode_step * (s["response_length"] - 1),
            "update": f["update"] / (peak * 1e9),
        }
        out[name] = {
            "tflop": {k: round(v / 1e12, 4) for k, v in f.items()},
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "total_s": round(sum(seconds.values()), 3),
        }
    return out


def probe_worker(s: dict[str, Any]) -> dict[str, Any]:
    return {
        "matmul_gflops": {d: round(matmul_peak_gflops(d), 1) for d in s["dtypes"]},
        "bandwidth_gbs": round(bandwidth_gbs(), 2),
    }


def lever_runs(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    """queryrl alone, ``--pairs`` pairs of runs without and with the ``--lever`` overrides, alternating."""
    pairs = []
    for i in range(args.pairs):
        pair: dict[str, Any] = {}
        for name in ["off", "on"] if i % 2 == 0 else ["on", "off"]:
            s = settings | {"queryrl_overrides": settings["queryrl_overrides"] + (args.lever if name == "on" else [])}
            run = run_worker(sys.executable, SCRIPT, ["--worker", "queryrl", "--settings", json.dumps(s)], timeout=7200)
            pair[name] = summarize_run(run, args.warmup)
            summary = pair[name]
            print(
                f"pair {i + 1} lever {name}: step CPU {summary['median_step_cpu_s']} s, "
                f"phases CPU {summary['median_phases_cpu_s']}, peak RSS {summary['peak_rss_mb']} MB",
                flush=True,
            )
        pair["ratio_on_over_off"] = round(pair["on"]["median_step_cpu_s"] / pair["off"]["median_step_cpu_s"], 4)
        pairs.append(pair)
    name = "_".join(x.replace("=", "-").rsplit(".", 1)[-1] for x in args.lever)
    out = args.out or RESULTS / f"trl_vs_queryrl_real_lever_{name}.json"
    write_json(
        out,
        {
            "lever": args.lever,
            "ratio_step_cpu_on_over_off": median([p["ratio_on_over_off"] for p in pairs]),
            "median_step_cpu_s": {n: median([p[n]["median_step_cpu_s"] for p in pairs]) for n in ("off", "on")},
            "median_peak_rss_mb": {n: median([p[n]["peak_rss_mb"] for p in pairs]) for n in ("off", "on")},
            "settings": settings,
            "machine": machine() | {"shared": True},
            "pairs": pairs,
        },
    )
    print(f"lever {args.lever}: step CPU on/off {median([p['ratio_on_over_off'] for p in pairs])}; wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", choices=["queryrl", "trl", "probe"], help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=2, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--layers", type=int, default=24, help="decoder layers (Qwen2-0.5B: 24; fewer for a smoke run)")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="compute dtype")
    parser.add_argument("--python-trl", default=sys.executable, help="interpreter with trl installed")
    parser.add_argument("--queryrl-override", action="append", default=[], help="extra queryrl config (key=value)")
    parser.add_argument(
        "--trl-malloc",
        choices=["default", "same"],
        default="default",
        help="TRL's glibc malloc: its defaults, or the thresholds queryrl's trainer sets for itself",
    )
    parser.add_argument(
        "--lever",
        action="append",
        default=[],
        help="queryrl only: alternate runs as configured and with these overrides (key=value), to measure one lever",
    )
    parser.add_argument("--out", type=Path, default=None, help="default results/trl_vs_queryrl_real.json")
    args = parser.parse_args()
    if args.worker:
        settings = json.loads(args.settings)
        fn = {"queryrl": worker_queryrl, "trl": worker_trl, "probe": probe_worker}[args.worker]
        print(json.dumps(fn(settings)))
        return

    from queryrl.machine import auto_dtype, warn_if_emulated_bf16

    warn_if_emulated_bf16(args.dtype, "--dtype")  # forced on a CPU that emulates it: one line
    bf16 = (auto_dtype() if args.dtype == "auto" else args.dtype) == "bfloat16"
    settings: dict[str, Any] = {
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": args.batch,
        "n": args.n,
        "prompt_tokens": args.prompt_tokens,
        "response_length": args.response_length,
        "layers": args.layers,
        "lr": args.lr,
        "seed": args.seed,
        "bf16": bf16,
        "queryrl_overrides": args.queryrl_override,
    }
    blob = json.dumps(settings)
    if args.lever:
        lever_runs(args, settings)
        return
    dtypes = ["float32", "bfloat16"] if bf16 else ["float32"]  # emulated bf16 (no AMX/AVX512-BF16) is slow
    probe = run_worker(sys.executable, SCRIPT, ["--worker", "probe", "--settings", json.dumps({"dtypes": dtypes})])
    compute = "bfloat16" if bf16 else "float32"
    limit = physical_limit(settings, probe["matmul_gflops"][compute], probe["bandwidth_gbs"], 2 if bf16 else 4)
    print(f"matmul peak {probe['matmul_gflops']} GFLOP/s, bandwidth {probe['bandwidth_gbs']} GB/s; limit {limit}")
    trl_env = queryrl_malloc_env() if args.trl_malloc == "same" else {}
    pairs = []
    for i in range(args.pairs):
        order = ["queryrl", "trl"] if i % 2 == 0 else ["trl", "queryrl"]
        pair: dict[str, Any] = {"order": order}
        for name in order:
            python = args.python_trl if name == "trl" else sys.executable
            env = trl_env if name == "trl" else {}
            run = run_worker(python, SCRIPT, ["--worker", name, "--settings", blob], timeout=7200, env_extra=env)
            pair[name] = summarize_run(run, args.warmup)
            print(
                f"pair {i + 1} {name:8s} step CPU {pair[name]['median_step_cpu_s']:.2f} s "
                f"(wall {pair[name]['median_step_wall_s']:.2f}), phases CPU {pair[name]['median_phases_cpu_s']}, "
                f"peak RSS {pair[name]['peak_rss_mb']} MB",
                flush=True,
            )
        pair["ratio_step_cpu"] = round(pair["queryrl"]["median_step_cpu_s"] / pair["trl"]["median_step_cpu_s"], 4)
        pair["ratio_peak_rss"] = round(pair["queryrl"]["peak_rss_mb"] / pair["trl"]["peak_rss_mb"], 4)
        pairs.append(pair)

    step_cpu = {n: median([p[n]["median_step_cpu_s"] for p in pairs]) for n in ("queryrl", "trl")}
    flops = step_flops(settings)
    nominal_tflop = sum(flops["nominal"].values()) / 1e12
    results = {
        "ratio_step_cpu_queryrl_over_trl": median([p["ratio_step_cpu"] for p in pairs]),
        "ratio_peak_rss_queryrl_over_trl": median([p["ratio_peak_rss"] for p in pairs]),
        "median_step_cpu_s": step_cpu,
        "median_step_wall_s": {n: median([p[n]["median_step_wall_s"] for p in pairs]) for n in ("queryrl", "trl")},
        "median_peak_rss_mb": {n: median([p[n]["peak_rss_mb"] for p in pairs]) for n in ("queryrl", "trl")},
        "physical_limit": limit,
        "queryrl_over_limit": {k: round(step_cpu["queryrl"] / v["total_s"], 3) for k, v in limit.items()},
        "achieved_gflops_nominal": {n: round(nominal_tflop * 1e3 / step_cpu[n], 1) for n in ("queryrl", "trl")},
        "machine_peak": probe,
        "goals": {"step_cpu_ratio_at_most": 0.25, "over_nominal_limit_at_most": 2.0, "peak_rss_ratio_at_most": 0.8},
        "settings": settings
        | {
            "compute_dtype": compute,
            "model": f"Qwen2ForCausalLM, Qwen2-0.5B's shape, {args.layers} layers, random weights, float32 master",
            "lora": LORA | {"target_modules": TARGETS},
            "queryrl": "loss_agg_mode=token-mean, clip 0.2, kl off, adv grpo, one mini-batch per step, "
            "gradient_checkpointing=false",
            "trl": "GRPOTrainer + peft LoraConfig (same rank, alpha, targets), loss_type=dapo, epsilon=0.2, "
            "beta=0, scale_rewards=group, num_iterations=1, gradient_accumulation_steps=1, "
            f"per_device_train_batch_size=batch*n, use_cpu, bf16={bf16}, gradient_checkpointing=False",
            "trl_malloc": args.trl_malloc,
            "trl_env": trl_env,
        },
        "versions": {n: pairs[0][n]["versions"] for n in ("queryrl", "trl")},
        "machine": machine() | {"shared": True},
        "pairs": pairs,
    }
    out = args.out or RESULTS / "trl_vs_queryrl_real.json"
    write_json(out, results)
    print()
    print(pairs_table(pairs, "median_step_cpu_s", "ratio_step_cpu", "step CPU s"))
    print(
        f"\nqueryrl/TRL step CPU {results['ratio_step_cpu_queryrl_over_trl']}, peak RSS "
        f"{results['ratio_peak_rss_queryrl_over_trl']}; queryrl / limit {results['queryrl_over_limit']}; "
        f"wrote {out}"
    )


if __name__ == "__main__":
    main()
