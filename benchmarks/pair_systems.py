"""Paired differences between two systems of one ``queryrl eval`` run (or of two runs on the same rows).

For pairs that the eval's ``--compare`` did not make (``make pair-systems``; RUN is a ``make bench-real`` work
folder, or any folder ``queryrl eval --out RUN/eval/eval.json`` wrote):

    python benchmarks/pair_systems.py RUN/eval/eval_samples.jsonl grpo reference
    python benchmarks/pair_systems.py --conversations RUN/eval/eval_samples.jsonl grpo warmup
    python benchmarks/pair_systems.py --conversations RUN_A/eval/eval_samples.jsonl grpo grpo \
      --b-from RUN_B/eval/eval_samples.jsonl      # one system of two evals of the same turns

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

A file that cannot be read, two files of other turns, or a system a row lacks: one line naming it, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.data.kdconv import doc_entity
from queryrl.apps.query_rewrite.metrics import group_interval, paired_bootstrap


class PairError(ValueError):
    """An eval file, or a system in it, that cannot be paired: one line naming which (exit 2)."""


def _rows(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise PairError(f"{path}: not readable as eval_samples.jsonl ({exc})") from None


def _names_gold_entity(rows: list[dict[str, Any]], system: str) -> int:
    return sum(any(doc_entity(g) in r["systems"][system]["query"] for g in r["gold"]) for r in rows)


def _check_system(path: Path, rows: list[dict[str, Any]], system: str) -> None:
    lacking = next((i for i, r in enumerate(rows) if system not in r.get("systems", {})), None)
    if lacking is not None:
        have = sorted(rows[lacking].get("systems", {}))
        raise PairError(f"{path}: row {lacking} has no system {system!r} (it has {', '.join(have) or 'none'})")


def pair(samples: Path, a: str, b: str, b_from: Path | None = None, conversations: bool = False) -> dict[str, object]:
    """``A - B`` for Recall@5 and MRR over the turns with gold documents (see the module docstring)."""
    rows = _rows(samples)
    rows_b = rows if b_from is None else _rows(b_from)
    if [r.get("last_turn") for r in rows] != [r.get("last_turn") for r in rows_b]:
        raise PairError(f"{samples} and {b_from} do not hold the same turns in the same order")
    kept = [i for i, r in enumerate(rows) if r.get("gold")]
    if not kept:
        raise PairError(f"{samples}: no turn with gold documents to pair")
    rows, rows_b = [rows[i] for i in kept], [rows_b[i] for i in kept]
    _check_system(samples, rows, a)
    _check_system(b_from or samples, rows_b, b)
    out: dict[str, object] = {"samples": str(samples), "a": a, "b": b, "n": len(rows)}
    if b_from is not None:
        out["b_from"] = str(b_from)
    out["names_gold_entity"] = {"a": _names_gold_entity(rows, a), "b": _names_gold_entity(rows_b, b)}
    if conversations:
        out["conversations"] = len({r["conversation_id"] for r in rows})
    for metric in ("recall@5", "mrr"):
        xs = [float(r["systems"][a][metric]) for r in rows]
        ys = [float(r["systems"][b][metric]) for r in rows_b]
        stats = {k: round(v, 4) for k, v in paired_bootstrap(xs, ys).items()}
        if conversations:  # the eval's own interval over conversations, with 5,000 replicates
            d = [x - y for x, y in zip(xs, ys, strict=True)]
            grouped = group_interval(d, [str(r["conversation_id"]) for r in rows], n_boot=5000)
            stats |= {
                "conversation_low": round(grouped["group_low"], 4),
                "conversation_high": round(grouped["group_high"], 4),
            }
        out[metric] = stats
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples", type=Path, help="an eval_samples.jsonl")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--b-from", type=Path, default=None, help="B's eval_samples.jsonl, if not SAMPLES")
    parser.add_argument("--conversations", action="store_true", help="also resample whole conversations")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    try:
        out = pair(args.samples, args.a, args.b, args.b_from, args.conversations)
    except PairError as exc:
        print(f"pair_systems: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(out, indent=1)
    print(text)
    if args.out is not None:
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
