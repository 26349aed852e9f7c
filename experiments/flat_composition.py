"""Where GRPO's flat groups come from, read from the groups a bench-real run logged (``samples/step_*.jsonl``).

    python experiments/flat_composition.py runs/levers/vocab_g7_s0 runs/levers/default_g8_s0 ...

Each logged group (the trainer writes two of the four groups of every step) is sorted by what its samples
retrieved: ``solved`` (every sample's Recall@5 is 1), ``missed`` (every sample's is 0) or ``mixed``, and by its
rewards: ``flat`` (one reward for all samples), of which ``one rewrite`` (the samples are one text). For the
missed groups, whether the reference pipeline's query found the gold document (``reference_recall_at_5``).
Prints one markdown row per run and one for all of them.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path


def groups_of(run: Path) -> list[list[dict]]:
    by_group: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for path in sorted((run / "grpo_run" / "samples").glob("step_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            by_group[(row["step"], row["group"])].append(row)
    return list(by_group.values())


def classify(groups: list[list[dict]]) -> Counter:
    c: Counter = Counter()
    for g in groups:
        recall = [float(s["reward_parts"].get("recall_at_5", 0.0)) for s in g]
        kind = "solved" if min(recall) == 1.0 else "missed" if max(recall) == 0.0 else "mixed"
        flat = len({round(float(s["score"]), 9) for s in g if s["score"] is not None}) <= 1
        one = len({s["response"] for s in g}) == 1
        ref = float(g[0]["reward_parts"].get("reference_recall_at_5", 0.0)) > 0
        c["groups"] += 1
        c[f"{kind}"] += 1
        c[f"{kind}/flat"] += flat
        c["flat"] += flat
        c["one rewrite"] += one
        if kind == "missed":
            c["missed/reference found"] += ref
    return c


def row(name: str, c: Counter) -> str:
    n = c["groups"]

    def pct(k: str) -> str:
        return f"{100 * c[k] / n:.0f} %"

    return (
        f"| {name} | {n} | {pct('flat')} | {pct('one rewrite')} | {pct('solved/flat')} | {pct('missed/flat')} "
        f"| {pct('mixed/flat')} | {pct('mixed')} | {c['missed/reference found']} of {c['missed']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="bench-real work folders (with grpo_run/samples)")
    args = parser.parse_args()
    print(
        "| run | logged groups | flat | one rewrite | flat, all solved | flat, all missed | flat, mixed recall "
        "| mixed recall | missed groups the reference solved |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    total: Counter = Counter()
    for run in args.runs:
        c = classify(groups_of(run))
        total += c
        print(row(run.name, c))
    print(row("all", total))


if __name__ == "__main__":
    main()
