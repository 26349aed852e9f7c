"""queryrl against TRL's GRPOTrainer on identical GRPO work, alternately in fresh one-thread processes.

    python benchmarks/trl_vs_queryrl.py                  # 6 pairs, writes results/trl_vs_queryrl.json
    python benchmarks/trl_vs_queryrl.py --pairs 3 --steps 8

Both trainers get the same model folder (queryrl's built-in tiny Qwen2, loaded by TRL as a plain
Hugging Face model), the same prompts (``builtin://toy_target_string/train``, chat template with
the generation prompt), the same reward function (:func:`queryrl.rewards.scorers.toy.compute_score`), and
the same GRPO settings: group size, prompts per step, response length, learning rate, AdamW with
weight decay 0.01, grad clip 1.0, constant schedule, clip 0.2, KL coefficient 0 (no reference
model), one optimizer step per generation batch (no old-log-prob pass), token-mean loss (queryrl
``loss_agg_mode=token-mean``; TRL ``loss_type="dapo"``: the sum over the step's response tokens
divided by their number), float32, sampling at temperature 1 without top-k/top-p. queryrl
generates with its ``hf`` rollout as configured by ``--fast-decode`` (default ``auto``: its own
decode loop for the Qwen2 model, queryrl/rollout/fast_decode.py; ``off``: transformers
``generate``); TRL always generates with ``generate``. The path queryrl took is recorded.

A pair runs queryrl and TRL one after the other, the order alternating from pair to pair, so the
load of a shared machine falls on both about equally; the ratio is taken within each pair and the
reported ratio is the median of the pairs' ratios. Step time is the wall time of one optimizer
step including its generation and scoring (queryrl: ``timing_s/step`` less checkpointing; TRL: a
callback's ``on_step_begin`` to ``on_step_end``); the first ``--warmup`` steps are dropped and the
median of the rest is the run's step time. Peak RSS is the worker process's ``ru_maxrss``.

queryrl's trainer sets glibc's malloc thresholds for itself (``trainer.malloc_mmap_threshold_mb``, on by
default), TRL runs with glibc's defaults; ``--trl-malloc same`` gives TRL's process the same thresholds
through the environment (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``): the like-for-like ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
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
    queryrl_malloc_env,
    run_worker,
    table,
    version_of,
    write_json,
)

SCRIPT = Path(__file__).resolve()


def reward_for_trl(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
    """TRL's reward-function contract around queryrl's toy reward (the very function queryrl calls)."""
    from queryrl.rewards.scorers.toy import compute_score

    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [compute_score("toy/target_string", t, g) for t, g in zip(texts, ground_truth, strict=True)]


def model_and_data() -> tuple[str, str]:
    """The tiny model's folder and the training parquet, built once by queryrl."""
    from queryrl.config import load_config
    from queryrl.data.builtin import resolve_data_path
    from queryrl.models.tiny import build_tiny_model

    cfg = load_config(TOY_CONFIG, [])
    return str(build_tiny_model(cfg.model.tiny, cfg.model.cache_dir)), resolve_data_path(
        str(cfg.data.train_files[0]), cfg.model.cache_dir
    )


def worker_queryrl(s: dict[str, Any]) -> dict[str, Any]:
    """Train `s['steps']` steps with queryrl's Trainer; return per-step times and peak RSS."""
    one_thread()
    from queryrl.config import load_config
    from queryrl.trainer.loop import Trainer

    model_dir, _ = model_and_data()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            *QUIET_OVERRIDES,
            f"model.path={model_dir}",
            f"trainer.output_dir={tmp}",
            *grpo_overrides(s),
            f"data.max_response_length={s['response_length']}",
            f"rollout.fast_decode={s['fast_decode']}",
        ]
        cfg = load_config(TOY_CONFIG, overrides)
        start = time.perf_counter()
        with Trainer(cfg) as trainer:
            trainer.fit()
            decode_path = str(getattr(trainer.c.rollout, "decode_path", "generate"))
        total = time.perf_counter() - start
        rows = [json.loads(x) for x in (Path(tmp) / "bench" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["timing_s/step"] - r.get("timing_s/save_checkpoint", 0.0) - r.get("timing_s/testing", 0.0) for r in rows]
    names = ("gen", "reward_wait", "reward", "adv", "update_actor")
    return {
        "step_s": steps,
        "phases_s": {k: [r.get(f"timing_s/{k}", 0.0) for r in rows] for k in names},
        "response_length_mean": [r.get("response_length/mean") for r in rows],
        "fit_wall_s": total,
        "peak_rss_mb": peak_rss_mb(),
        "versions": versions(),
        "decode_path": decode_path,
    }


def grpo_overrides(s: dict[str, Any]) -> list[str]:
    """queryrl's side of the GRPO settings both trainers share (see the module docstring)."""
    sequences = s["batch"] * s["n"]
    return [
        "trainer.experiment_name=bench",
        f"trainer.total_steps={s['steps']}",
        f"trainer.seed={s['seed']}",
        f"data.train_batch_size={s['batch']}",
        f"actor.ppo_mini_batch_size={s['batch']}",
        f"actor.ppo_micro_batch_size={sequences}",
        f"rollout.micro_batch_size={sequences}",
        f"rollout.n={s['n']}",
        "rollout.temperature=1.0",
        f"actor.lr={s['lr']}",
        "actor.weight_decay=0.01",
        "actor.grad_clip=1.0",
        "actor.lr_schedule=constant",
        "actor.warmup_steps=0",
        "actor.loss_agg_mode=token-mean",
        "actor.clip_ratio_low=0.2",
        "actor.clip_ratio_high=0.2",
        "actor.use_kl_loss=false",
        "algo.use_kl_in_reward=false",
    ]


def trl_config(s: dict[str, Any], output_dir: str, **extra: Any) -> Any:
    """TRL's ``GRPOConfig`` with the same GRPO settings as :func:`grpo_overrides`, plus `extra`."""
    from trl import GRPOConfig

    settings: dict[str, Any] = {
        "output_dir": output_dir,
        "use_cpu": True,
        "fp16": False,
        "seed": s["seed"],
        "per_device_train_batch_size": s["batch"] * s["n"],  # TRL counts completions, not prompts
        "gradient_accumulation_steps": 1,
        "num_generations": s["n"],
        "num_iterations": 1,
        "max_completion_length": s["response_length"],
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "learning_rate": s["lr"],
        "weight_decay": 0.01,
        "max_grad_norm": 1.0,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "beta": 0.0,
        "epsilon": 0.2,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "max_steps": s["steps"],
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "model_init_kwargs": {"dtype": "float32"},
    }
    return GRPOConfig(**(settings | extra))


def pairs_table(pairs: list[dict[str, Any]], step: str, ratio: str, unit: str) -> str:
    """The per-pair table both benchmarks print: step times (`step` key, in `unit`), their ratio, peak RSS."""
    return table(
        ["pair", f"queryrl {unit}", f"TRL {unit}", "ratio", "queryrl RSS MB", "TRL RSS MB", "RSS ratio"],
        [
            [
                i + 1,
                p["queryrl"][step],
                p["trl"][step],
                p[ratio],
                p["queryrl"]["peak_rss_mb"],
                p["trl"]["peak_rss_mb"],
                p["ratio_peak_rss"],
            ]
            for i, p in enumerate(pairs)
        ],
    )


def versions() -> dict[str, str | None]:
    """Versions of the packages this worker ran with."""
    return {p: version_of(p) for p in ("queryrl", "torch", "transformers", "trl", "accelerate")}


def worker_trl(s: dict[str, Any]) -> dict[str, Any]:
    """Train `s['steps']` steps with TRL's GRPOTrainer on the same work; return per-step times and peak RSS."""
    one_thread()
    import pandas as pd
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    model_dir, data_path = model_and_data()
    rows = pd.read_parquet(data_path).to_dict("records")
    dataset = Dataset.from_list(
        [
            {"prompt": [dict(m) for m in r["prompt"]], "ground_truth": str(r["reward_model"]["ground_truth"])}
            for r in rows
        ]
    )

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        """Wall time of every optimizer step (generation and scoring happen inside it)."""

        def __init__(self) -> None:
            self.begin = 0.0
            self.steps: list[float] = []

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.begin = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.steps.append(time.perf_counter() - self.begin)

    timer = StepTimer()
    phases: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        args = trl_config(s, tmp, bf16=False)
        trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_for_trl, args=args, train_dataset=dataset)
        trainer.add_callback(timer)
        for method, phase in (
            ("_generate_and_score_completions", "gen_and_score"),
            ("_generate", "generate"),
            ("_calculate_rewards", "reward"),
            ("compute_loss", "loss_forward"),
        ):
            _time_method(trainer, method, phases.setdefault(phase, []))
        start = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - start
        lengths = [h.get("completions/mean_length") for h in trainer.state.log_history if "loss" in h]
    return {
        "step_s": timer.steps,
        "phases_s": phases,
        "response_length_mean": lengths,
        "fit_wall_s": total,
        "peak_rss_mb": peak_rss_mb(),
        "versions": versions(),
        "decode_path": "vllm" if args.use_vllm else "generate",  # GRPOTrainer._generate: model.generate
    }


def _time_method(obj: Any, name: str, into: list[float]) -> None:
    """Wrap ``obj.name`` so that each call's wall time is appended to `into`."""
    original = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - start)

    setattr(obj, name, timed)


def summarize_run(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    """The run's median step time (after `warmup` steps) and its raw numbers."""
    kept = run["step_s"][warmup:]
    lengths = [x for x in run["response_length_mean"][warmup:] if x is not None]
    return {
        "median_step_s": median(kept),
        "peak_rss_mb": round(run["peak_rss_mb"], 1),
        "mean_response_length": round(statistics.mean(lengths), 2) if lengths else None,
        "fit_wall_s": round(run["fit_wall_s"], 3),
        "step_s": [round(x, 4) for x in run["step_s"]],
        "median_phases_s": {k: median(v[warmup:]) for k, v in run["phases_s"].items() if v[warmup:]},
        "versions": run["versions"],
        "decode_path": run["decode_path"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", choices=["queryrl", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt (group size)")
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--fast-decode", choices=["auto", "off"], default="auto", help="queryrl's rollout.fast_decode")
    parser.add_argument("--python-trl", default=sys.executable, help="interpreter with trl installed")
    parser.add_argument(
        "--trl-malloc",
        choices=["default", "same"],
        default="default",
        help="TRL's glibc malloc: its defaults, or the thresholds queryrl's trainer sets for itself",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "trl_vs_queryrl.json")
    args = parser.parse_args()
    if args.worker:
        settings = json.loads(args.settings)
        result = (worker_queryrl if args.worker == "queryrl" else worker_trl)(settings)
        print(json.dumps(result))
        return

    settings = {
        "steps": args.steps,
        "warmup": args.warmup,
        "batch": args.batch,
        "n": args.n,
        "response_length": args.response_length,
        "lr": args.lr,
        "seed": args.seed,
        "fast_decode": args.fast_decode,
    }
    blob = json.dumps(settings)
    trl_env = queryrl_malloc_env() if args.trl_malloc == "same" else {}
    pairs = []
    for i in range(args.pairs):
        order = ["queryrl", "trl"] if i % 2 == 0 else ["trl", "queryrl"]
        pair: dict[str, Any] = {"order": order}
        for name in order:
            python = args.python_trl if name == "trl" else sys.executable
            env = trl_env if name == "trl" else {}
            run = run_worker(python, SCRIPT, ["--worker", name, "--settings", blob], env_extra=env)
            pair[name] = summarize_run(run, args.warmup)
            print(
                f"pair {i + 1} {name:8s} median step {pair[name]['median_step_s']:.4f} s, "
                f"peak RSS {pair[name]['peak_rss_mb']} MB",
                flush=True,
            )
        pair["ratio_step_time"] = round(pair["queryrl"]["median_step_s"] / pair["trl"]["median_step_s"], 4)
        pair["ratio_peak_rss"] = round(pair["queryrl"]["peak_rss_mb"] / pair["trl"]["peak_rss_mb"], 4)
        pairs.append(pair)

    q_steps = [p["queryrl"]["median_step_s"] for p in pairs]
    t_steps = [p["trl"]["median_step_s"] for p in pairs]
    results = {
        "ratio_step_time_queryrl_over_trl": median([p["ratio_step_time"] for p in pairs]),
        "ratio_peak_rss_queryrl_over_trl": median([p["ratio_peak_rss"] for p in pairs]),
        "median_step_s": {"queryrl": median(q_steps), "trl": median(t_steps)},
        "median_peak_rss_mb": {
            "queryrl": median([p["queryrl"]["peak_rss_mb"] for p in pairs]),
            "trl": median([p["trl"]["peak_rss_mb"] for p in pairs]),
        },
        "decode_path": {name: sorted({p[name]["decode_path"] for p in pairs}) for name in ("queryrl", "trl")},
        "goals": {"step_time_ratio_at_most": 0.5, "peak_rss_ratio_at_most": 1.0},
        "settings": settings
        | {
            "model": "queryrl built-in tiny Qwen2 (configs/toy_grpo.yaml model.tiny), float32",
            "data": "builtin://toy_target_string/train",
            "reward": "queryrl.rewards.scorers.toy.compute_score",
            "queryrl": "loss_agg_mode=token-mean, clip 0.2, kl off, adv grpo, one mini-batch per step, "
            f"rollout.fast_decode={args.fast_decode}",
            "trl": "loss_type=dapo, epsilon=0.2, beta=0, scale_rewards=group, num_iterations=1, "
            "gradient_accumulation_steps=1, per_device_train_batch_size=batch*n, use_cpu, bf16=False",
            "trl_malloc": args.trl_malloc,
            "trl_env": trl_env,
        },
        "versions": {name: pairs[0][name]["versions"] for name in ("queryrl", "trl")},
        "machine": machine() | {"shared": True},
        "pairs": pairs,
    }
    write_json(args.out, results)
    print()
    print(pairs_table(pairs, "median_step_s", "ratio_step_time", "step s"))
    print(
        f"\nratio step time queryrl/TRL {results['ratio_step_time_queryrl_over_trl']}, "
        f"peak RSS {results['ratio_peak_rss_queryrl_over_trl']}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
