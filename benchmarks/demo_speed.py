"""What the two speed levers of the query-rewrite demo save (``make bench-demo-speed``).

    python benchmarks/demo_speed.py            # writes results/demo_speed.json
    python benchmarks/demo_speed.py --grpo-steps 12 --sft-steps 20

1. GRPO: ``actor.share_prompt_forward`` (each distinct prompt of a micro-batch runs once, only the
   responses per sample) against the plain forward. Each setting trains ``--grpo-steps`` steps of
   ``configs/query_rewrite_demo.yaml`` (8 prompts x 8 samples; the demo's tiny model, randomly
   initialised) in a fresh ``queryrl train`` process; the first ``--warmup`` steps are dropped and
   the median of each ``timing_s/*`` phase is reported.
2. SFT with the prompt loss: ``sft.micro_batch_size`` 16 (one micro-batch per batch of 16) against
   4 (micro-batches cut from the batch sorted by length, so each pads to its own length). The same
   ``--sft-steps`` random batches of the demo's train split go through
   :func:`queryrl.trainer.sft.accumulate_gradients` (forward and backward; the optimizer step,
   the same in both, is left out), in this process; mean seconds per batch and the share of real
   (not padding) tokens are reported.

One CPU thread throughout (``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import QUIET_OVERRIDES, REPO, RESULTS, machine, one_thread, table, write_json

DEMO_CONFIG = REPO / "configs" / "query_rewrite_demo.yaml"
PHASES = ["gen", "old_log_prob", "ref", "update_actor", "step"]


def grpo_rows(share: bool, steps: int, out: Path) -> list[dict[str, float]]:
    """`steps` GRPO steps of the demo config from its random tiny model; the rows of metrics.jsonl."""
    name = f"share_{str(share).lower()}"
    cmd = [
        str(Path(sys.executable).with_name("queryrl")),
        "train",
        "--config",
        str(DEMO_CONFIG),
        *QUIET_OVERRIDES,
        f"trainer.output_dir={out}",
        f"trainer.experiment_name={name}",
        f"trainer.total_steps={steps}",
        f"actor.share_prompt_forward={str(share).lower()}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def grpo_bench(steps: int, warmup: int) -> dict[str, Any]:
    settings: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for share in (False, True):
            rows = grpo_rows(share, steps, Path(tmp))[warmup:]
            settings[str(share).lower()] = {
                p: round(statistics.median(r[f"timing_s/{p}"] for r in rows), 4)
                for p in PHASES
                if all(f"timing_s/{p}" in r for r in rows)
            }
    plain, shared = settings["false"], settings["true"]
    speedup = {p: round(plain[p] / shared[p], 2) for p in plain if shared.get(p)}
    print(
        table(
            ["GRPO phase", "plain (s)", "share_prompt_forward (s)", "speed-up"],
            [[p, plain[p], shared.get(p, "-"), speedup.get(p, "-")] for p in plain],
        )
    )
    return {"median_s": settings, "speedup": speedup}


def sft_bench(steps: int) -> dict[str, Any]:
    import torch

    from queryrl.config import load_config
    from queryrl.models import load_policy
    from queryrl.trainer.sft import accumulate_gradients, build_sft_data

    cfg = load_config(str(DEMO_CONFIG), [])
    bundle = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False)
    data = build_sft_data(
        list(cfg.data.train_files),
        bundle.tokenizer,
        cfg.sft.target_key,
        cfg.data.max_prompt_length,
        cfg.data.max_response_length,
    )
    rng = random.Random(0)
    batches = [rng.sample(data.examples, 16) for _ in range(steps)]
    pad = bundle.tokenizer.pad_token_id
    results: dict[str, dict[str, float]] = {}
    for micro in (16, 4):
        real = padded = 0
        for batch in batches:
            ordered = sorted(len(e.prompt_ids) + len(e.target_ids) for e in batch)
            real += sum(ordered)
            padded += sum(micro * max(ordered[i : i + micro]) for i in range(0, len(ordered), micro))
        start = time.perf_counter()
        for batch in batches:
            accumulate_gradients(bundle.model, batch, micro, pad, torch.device("cpu"), cfg.sft.prompt_loss_weight)
            bundle.model.zero_grad(set_to_none=True)
        seconds = (time.perf_counter() - start) / steps
        results[str(micro)] = {"s_per_batch": round(seconds, 4), "real_token_share": round(real / padded, 3)}
    print(
        table(
            ["SFT micro-batch", "s per batch of 16", "real tokens"],
            [[m, r["s_per_batch"], r["real_token_share"]] for m, r in results.items()],
        )
    )
    return {
        "micro_batch_size": results,
        "speedup": round(results["16"]["s_per_batch"] / results["4"]["s_per_batch"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grpo-steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sft-steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS / "demo_speed.json")
    args = parser.parse_args()
    one_thread()
    grpo = grpo_bench(args.grpo_steps, args.warmup)
    sft = sft_bench(args.sft_steps)
    write_json(
        args.out,
        {
            "settings": {k: v for k, v in vars(args).items() if k != "out"}
            | {"config": str(DEMO_CONFIG.relative_to(REPO))},
            "machine": {**machine(), "threads": 1},
            "grpo_share_prompt_forward": grpo,
            "sft_sorted_micro_batches": sft,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
