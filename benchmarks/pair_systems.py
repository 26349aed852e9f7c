"""Paired differences between two systems of one ``queryrl eval`` run (or of two runs on the same rows).

For pairs that the eval's ``--compare`` did not make:

    python benchmarks/pair_systems.py runs/levers/allrows100_s0/eval_samples.jsonl grpo_100 grpo_60
    python benchmarks/pair_systems.py --conversations runs/levers/allrows100_s0/eval_samples.jsonl \
      grpo_60 reference
    python benchmarks/pair_systems.py --conversations runs/levers/entropy_s0/eval/eval_samples.jsonl \
      grpo grpo --b-from runs/bench_real_bf16/eval/eval_samples.jsonl

Reads the per-turn metrics of ``eval_samples.jsonl`` (the turns with gold documents) and prints, for
Recall@5 and MRR, ``A - B`` with its paired bootstrap 95 % interval (the eval's own
:func:`~queryrl.apps.query_rewrite.metrics.paired_bootstrap`, 1,000 resamples, seed 0) and the shares of
turns where A or B is better, as JSON.

``--b-from OTHER`` reads B from another eval of the same rows (two lever runs evaluated separately; the turns
are checked to be the same, in the same order). Each side also counts the turns on which its query names a
gold entity (``names_gold_entity``; KdConv document ids are ``entity::attribute``).

``--conversations`` adds the interval with whole conversations resampled (``conversation_low`` /
``conversation_high``; a cluster bootstrap: each replicate draws the conversations with replacement and takes
every turn of each, 5,000 replicates, seed 0: :func:`~queryrl.apps.query_rewrite.metrics.group_interval`,
which ``queryrl eval`` now reports too, with its own 1,000). The turns of one KdConv conversation share its
entity and its difficulty; with 15 conversations in a split that matters.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.data.kdconv import doc_entity
from queryrl.apps.query_rewrite.metrics import group_interval, paired_bootstrap


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _names_gold_entity(rows: list[dict[str, Any]], system: str) -> int:
    return sum(any(doc_entity(g) in r["systems"][system]["query"] for g in r["gold"]) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples", type=Path, help="an eval_samples.jsonl")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--b-from", type=Path, default=None, help="B's eval_samples.jsonl, if not SAMPLES")
    parser.add_argument("--conversations", action="store_true", help="also resample whole conversations")
    args = parser.parse_args()
    rows = _rows(args.samples)
    rows_b = rows if args.b_from is None else _rows(args.b_from)
    if [r["last_turn"] for r in rows] != [r["last_turn"] for r in rows_b]:
        raise SystemExit(f"{args.samples} and {args.b_from} do not hold the same turns in the same order")
    kept = [i for i, r in enumerate(rows) if r.get("gold")]
    rows, rows_b = [rows[i] for i in kept], [rows_b[i] for i in kept]
    out: dict[str, object] = {"samples": str(args.samples), "a": args.a, "b": args.b, "n": len(rows)}
    if args.b_from is not None:
        out["b_from"] = str(args.b_from)
    out["names_gold_entity"] = {"a": _names_gold_entity(rows, args.a), "b": _names_gold_entity(rows_b, args.b)}
    if args.conversations:
        out["conversations"] = len({r["conversation_id"] for r in rows})
    for metric in ("recall@5", "mrr"):
        a = [float(r["systems"][args.a][metric]) for r in rows]
        b = [float(r["systems"][args.b][metric]) for r in rows_b]
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
