"""Paired differences between two systems of one ``queryrl eval`` run that its ``--compare`` did not pair.

    python benchmarks/levers/pair_systems.py runs/levers/allrows100_s0/eval_samples.jsonl grpo_100 grpo_60
    python benchmarks/levers/pair_systems.py --conversations runs/levers/allrows100_s0/eval_samples.jsonl \
      grpo_60 reference

Reads the per-turn metrics of ``eval_samples.jsonl`` (the turns with gold documents) and prints, for
Recall@5 and MRR, ``A - B`` with its paired bootstrap 95 % interval (the eval's own
:func:`~queryrl.apps.query_rewrite.eval.metrics.paired_bootstrap`, 1,000 resamples, seed 0) and the shares of
turns where A or B is better, as JSON.

``--conversations`` adds the interval with whole conversations resampled (``conversation_low`` /
``conversation_high``; a cluster bootstrap: each replicate draws the conversations with replacement and takes
every turn of each, 5,000 replicates, seed 0). The eval's interval resamples turns, but the turns of one KdConv
conversation share its entity and its difficulty; with 15 conversations in a split that matters.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from queryrl.apps.query_rewrite.eval.metrics import paired_bootstrap


def conversation_interval(diffs: dict[str, list[float]], resamples: int = 5000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean per-turn difference when whole conversations are resampled."""
    rng = np.random.default_rng(seed)
    sums = np.array([sum(d) for d in diffs.values()])
    counts = np.array([len(d) for d in diffs.values()])
    picks = rng.integers(0, len(sums), size=(resamples, len(sums)))  # (R, C) conversation draws
    means = sums[picks].sum(1) / counts[picks].sum(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples", type=Path, help="an eval_samples.jsonl")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--conversations", action="store_true", help="also resample whole conversations")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.samples.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if r.get("gold")]
    out: dict[str, object] = {"samples": str(args.samples), "a": args.a, "b": args.b, "n": len(rows)}
    if args.conversations:
        out["conversations"] = len({r["conversation_id"] for r in rows})
    for metric in ("recall@5", "mrr"):
        a = [float(r["systems"][args.a][metric]) for r in rows]
        b = [float(r["systems"][args.b][metric]) for r in rows]
        stats = {k: round(v, 4) for k, v in paired_bootstrap(a, b).items()}
        if args.conversations:
            by_conversation: dict[str, list[float]] = defaultdict(list)
            for r, x, y in zip(rows, a, b, strict=True):
                by_conversation[str(r["conversation_id"])].append(x - y)
            low, high = conversation_interval(by_conversation)
            stats |= {"conversation_low": round(low, 4), "conversation_high": round(high, 4)}
        out[metric] = stats
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
