"""One policy-update micro-batch with logits for the whole sequence vs for the response only.

    python benchmarks/logits_memory.py                 # writes benchmarks/results/logits.json
    python benchmarks/logits_memory.py --layers 4 --pairs 1

The model is a Qwen2ForCausalLM with Qwen2-0.5B's shape (hidden 896, 24 layers, intermediate
4864, vocabulary 151936, 14 heads, 2 KV heads, tied embeddings), built in code with random
weights (nothing is downloaded), float32 on the CPU. One micro-batch is what
``queryrl.engine.update.actor_micro_step`` does in a GRPO update: the forward pass, log-probs and
entropy of the response tokens, the clipped policy loss, and the backward pass, for ``--batch``
sequences of ``--prompt`` prompt tokens and ``--response`` response tokens.

``before``: the model projects every position to the vocabulary and the response's rows are sliced
after (what ``response_logits`` did: ``model(...).logits[:, P - 1 : -1]``). ``after``: the model
is called with ``logits_to_keep=T + 1`` so the LM head sees the response's rows only (what it
does now). Every micro-batch runs in a fresh one-thread process, ``--pairs`` pairs with the order
alternating, and the medians are reported: its time, the process's peak RSS, and that peak above
the RSS before the micro-batch (weights and data loaded: the update's own memory). The workers run
with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed at 1 MiB, so that every freed tensor goes back to the
system and RSS follows the live tensors (glibc's default threshold adapts and keeps freed memory
resident, which blurs a peak). The loss and gradient norms of both modes are reported too: they
must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    QWEN2_05B,
    RESULTS,
    machine,
    median,
    peak_rss_mb,
    random_batch,
    run_worker,
    table,
    version_of,
    write_json,
)

SCRIPT = Path(__file__).resolve()


def rss_mb() -> float:
    """The current resident set size of this process, in MiB."""
    import os

    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(s: dict[str, Any]) -> dict[str, Any]:
    """Time `s['reps']` update micro-batches in mode `s['mode']` (before | after)."""
    from common import one_thread

    one_thread()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import queryrl.engine.policy as policy
    from queryrl.algos import LossNormalizer
    from queryrl.config import load_config
    from queryrl.engine.update import actor_micro_step

    if s["mode"] == "before":  # the old path: every position through the LM head, sliced after
        policy.keeps_logits = lambda model: False  # type: ignore[assignment]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**{**QWEN2_05B, "num_hidden_layers": s["layers"]})).train()
    n, p, t, vocab = s["batch"], s["prompt"], s["response"], QWEN2_05B["vocab_size"]
    batch = random_batch(n, p, t, vocab, 2, seed=1)
    cfg = load_config(None, ["actor.use_kl_loss=false", "actor.entropy_coeff=0.001"])
    norm = LossNormalizer.from_mask(batch.response_mask)
    before_rss = rss_mb()
    times, losses = [], []
    for _ in range(s["reps"]):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        metrics = actor_micro_step(cfg, model, batch, norm)
        times.append(time.perf_counter() - start)
        losses.append(metrics["actor/pg_loss"])
    head = model.get_output_embeddings().weight.grad  # tied: the embedding's gradient
    layer0 = model.model.layers[0].mlp.down_proj.weight.grad
    assert head is not None
    assert layer0 is not None
    peak = peak_rss_mb()
    return {
        "mode": s["mode"],
        "seconds": times,
        "seconds_median": median(times),
        "peak_rss_mb": round(peak, 1),
        "rss_before_update_mb": round(before_rss, 1),
        "update_peak_above_weights_mb": round(peak - before_rss, 1),
        "pg_loss": losses[-1],
        "grad_norm_embedding": float(head.norm()),
        "grad_norm_layer0_down_proj": float(layer0.norm()),
        "parameters": sum(q.numel() for q in model.parameters()),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of one mode's runs (the numbers that must agree are taken from the first)."""
    out = {k: runs[0][k] for k in ("pg_loss", "grad_norm_embedding", "grad_norm_layer0_down_proj", "parameters")}
    out["seconds_median"] = median([s for r in runs for s in r["seconds"]])
    for key in ("peak_rss_mb", "rss_before_update_mb", "update_peak_above_weights_mb"):
        out[key] = round(median([r[key] for r in runs]), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=24, help="decoder layers (Qwen2-0.5B has 24)")
    parser.add_argument("--batch", type=int, default=4, help="sequences in the micro-batch")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    parser.add_argument("--response", type=int, default=48, help="response tokens")
    parser.add_argument("--pairs", type=int, default=2, help="before/after pairs, each in fresh processes")
    parser.add_argument("--out", type=Path, default=RESULTS / "logits.json")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    settings = {k: getattr(args, k) for k in ("layers", "batch", "prompt", "response", "pairs")}
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(2**20)  # inherited by the workers (see the module doc)
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for i in range(args.pairs):
        for mode in ("before", "after") if i % 2 == 0 else ("after", "before"):
            print(f"pair {i + 1}/{args.pairs} {mode}: {settings} ...", file=sys.stderr, flush=True)
            job = {**settings, "mode": mode, "reps": 1}
            runs[mode].append(run_worker(sys.executable, SCRIPT, ["--worker", json.dumps(job)]))
    b, a = (summary(runs[mode]) for mode in ("before", "after"))
    n, p, t, v = args.batch, args.prompt, args.response, QWEN2_05B["vocab_size"]
    result = {
        "what": "one GRPO update micro-batch (forward, log-probs + entropy, PPO-clip loss, backward), float32, CPU, "
        "1 thread; before = LM head over every position then sliced, after = logits_to_keep (response only)",
        "model": {**QWEN2_05B, "num_hidden_layers": args.layers, "parameters": a["parameters"], "weights": "random"},
        "settings": settings,
        "note": "the full Qwen2-0.5B depth (24 layers)"
        if args.layers == 24
        else f"{args.layers} of Qwen2-0.5B's 24 layers, to fit the machine's memory and time",
        "logits_mb_float32": {
            "before": round(n * (p + t) * v * 4 / 2**20, 1),
            "after": round(n * (t + 1) * v * 4 / 2**20, 1),
        },
        "before": b,
        "after": a,
        "runs": runs,
        "time_saved_frac": round(1 - a["seconds_median"] / b["seconds_median"], 3),
        "peak_rss_saved_mb": round(b["peak_rss_mb"] - a["peak_rss_mb"], 1),
        "update_memory_saved_mb": round(b["update_peak_above_weights_mb"] - a["update_peak_above_weights_mb"], 1),
        "same_numbers": {
            "pg_loss_abs_diff": abs(a["pg_loss"] - b["pg_loss"]),
            "grad_norm_embedding_rel_diff": abs(a["grad_norm_embedding"] / b["grad_norm_embedding"] - 1),
            "grad_norm_layer0_rel_diff": abs(a["grad_norm_layer0_down_proj"] / b["grad_norm_layer0_down_proj"] - 1),
        },
        "machine": machine(),
        "versions": {"torch": version_of("torch"), "transformers": version_of("transformers")},
    }
    write_json(args.out, result)
    rows = [
        [m, r["seconds_median"], r["peak_rss_mb"], r["update_peak_above_weights_mb"]]
        for m, r in (("before", b), ("after", a))
    ]
    print(table(["logits for", "s / micro-batch", "peak RSS MiB", "update peak above weights MiB"], rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
