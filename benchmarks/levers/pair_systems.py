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
every turn of each, 5,000 replicates, seed 0: :func:`~queryrl.apps.query_rewrite.eval.metrics.group_interval`,
which ``queryrl eval`` now reports too, with its own 1,000). The turns of one KdConv conversation share its
entity and its difficulty; with 15 conversations in a split that matters.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from queryrl.apps.query_rewrite.eval.metrics import group_interval, paired_bootstrap


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
        if args.conversations:  # the eval's own interval over conversations, with 5,000 replicates
            d = [x - y for x, y in zip(a, b, strict=True)]
            grouped = group_interval(d, [str(r["conversation_id"]) for r in rows], n_boot=5000)
            stats |= {
                "conversation_low": round(grouped["group_low"], 4),
                "conversation_high": round(grouped["group_high"], 4),
            }
        out[metric] = stats
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
