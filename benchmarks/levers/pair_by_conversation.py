"""Paired differences between two systems of one ``queryrl eval`` run with whole conversations resampled.

    python benchmarks/levers/pair_by_conversation.py runs/levers/allrows100_s0/eval_samples.jsonl grpo_60 reference

``queryrl eval``'s paired bootstrap resamples turns. The turns of one KdConv conversation share its entity
and its difficulty, so they are not independent, and a turn-level interval is too narrow when a split has
15 conversations. This resamples conversations (a cluster bootstrap: each replicate draws the split's
conversations with replacement and takes every turn of each; 5,000 replicates, seed 0) and prints, for
Recall@5 and MRR, the mean difference A - B over turns with its 95 % percentile interval, beside the
turn-level interval for comparison, as JSON.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def cluster_interval(diffs: dict[str, list[float]], resamples: int = 5000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean turn difference when whole conversations are resampled."""
    rng = np.random.default_rng(seed)
    sums = np.array([sum(d) for d in diffs.values()])
    counts = np.array([len(d) for d in diffs.values()])
    picks = rng.integers(0, len(sums), size=(resamples, len(sums)))  # (R, C) conversation draws
    means = sums[picks].sum(1) / counts[picks].sum(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def turn_interval(values: list[float], resamples: int = 5000, seed: int = 0) -> tuple[float, float]:
    """The same, resampling turns (what the eval's paired bootstrap does)."""
    rng = np.random.default_rng(seed)
    x = np.asarray(values)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples", type=Path, help="an eval_samples.jsonl")
    parser.add_argument("a")
    parser.add_argument("b")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.samples.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if r.get("gold")]
    out: dict[str, object] = {"samples": str(args.samples), "a": args.a, "b": args.b, "turns": len(rows)}
    out["conversations"] = len({r["conversation_id"] for r in rows})
    for metric in ("recall@5", "mrr"):
        by_conversation: dict[str, list[float]] = defaultdict(list)
        flat = []
        for r in rows:
            d = float(r["systems"][args.a][metric]) - float(r["systems"][args.b][metric])
            by_conversation[str(r["conversation_id"])].append(d)
            flat.append(d)
        low, high = cluster_interval(by_conversation)
        t_low, t_high = turn_interval(flat)
        out[metric] = {
            "diff": round(float(np.mean(flat)), 4),
            "conversation_low": round(low, 4),
            "conversation_high": round(high, 4),
            "turn_low": round(t_low, 4),
            "turn_high": round(t_high, 4),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
