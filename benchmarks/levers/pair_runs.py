"""Paired differences between a system of one ``queryrl eval`` run and a system of another, on the same rows.

    python benchmarks/levers/pair_runs.py runs/levers/entropy_s0/eval/eval_samples.jsonl:grpo \
      runs/bench_real_bf16/eval/eval_samples.jsonl:grpo

`pair_systems.py` pairs two systems of one eval; two lever runs evaluated separately (each with its own eval,
the same held-out file) are paired here, after checking that both evals hold the same turns in the same
order. Prints, as JSON, for Recall@5 and MRR: ``A - B`` with the eval's paired bootstrap interval over turns
and, where the rows name conversations, over whole conversations (``group_low`` / ``group_high``), and the
turns on which each system's query names a gold entity (the KdConv document ids are ``entity::attribute``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.eval.metrics import paired_bootstrap


def _side(spec: str) -> tuple[Path, str]:
    path, _, system = spec.rpartition(":")
    if not path or not system:
        raise SystemExit(f"{spec}: give FILE:SYSTEM (an eval_samples.jsonl and a system in it)")
    return Path(path), system


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="FILE:SYSTEM, e.g. runs/x/eval/eval_samples.jsonl:grpo")
    parser.add_argument("b", help="FILE:SYSTEM on the same rows")
    args = parser.parse_args()
    (file_a, sys_a), (file_b, sys_b) = _side(args.a), _side(args.b)
    rows_a, rows_b = _rows(file_a), _rows(file_b)
    if [r["last_turn"] for r in rows_a] != [r["last_turn"] for r in rows_b]:
        raise SystemExit(f"{file_a} and {file_b} do not hold the same turns in the same order")
    keep = [i for i, r in enumerate(rows_b) if r.get("gold")]
    ids = [rows_b[i].get("conversation_id") for i in keep]
    groups = [str(c) for c in ids] if any(ids) else None

    def named(rows: list[dict[str, Any]], system: str) -> int:
        return sum(any(g.split("::")[0] in rows[i]["systems"][system]["query"] for g in rows[i]["gold"]) for i in keep)

    out: dict[str, Any] = {"a": args.a, "b": args.b, "n": len(keep)}
    for metric in ("recall@5", "mrr"):
        values_a = [float(rows_a[i]["systems"][sys_a][metric]) for i in keep]
        values_b = [float(rows_b[i]["systems"][sys_b][metric]) for i in keep]
        out[metric] = {k: round(v, 4) for k, v in paired_bootstrap(values_a, values_b, groups=groups).items()}
    out["names_gold_entity"] = {"a": named(rows_a, sys_a), "b": named(rows_b, sys_b)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
