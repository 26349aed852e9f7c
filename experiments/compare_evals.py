"""Paired Recall@5 difference of one system in two ``queryrl eval`` runs on the same rows (e.g. two GRPO
models from the same warm-up: experiments/logs/real_model.md, levers 6 and 7).

    python experiments/compare_evals.py runs/levers/depth_s0/eval/eval_samples.jsonl grpo \\
        runs/bench_real_gemma_s0/eval/eval_samples.jsonl grpo

Prints the mean difference (A - B) with a 95 % percentile bootstrap interval over rows (5,000 resamples,
seed 0), the rows compared and how many queries differ.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def rows(path: Path) -> dict[int, dict[str, Any]]:
    return {r["index"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


def paired(a: list[float], b: list[float], resamples: int = 5000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of a - b and its 95 % percentile bootstrap interval."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(resamples))
    return sum(diffs) / len(diffs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="eval_samples.jsonl of run A")
    parser.add_argument("a_system")
    parser.add_argument("b", type=Path, help="eval_samples.jsonl of run B")
    parser.add_argument("b_system")
    args = parser.parse_args(argv)
    ra, rb = rows(args.a), rows(args.b)
    common = sorted(set(ra) & set(rb))
    if not common:
        print("the two files share no row index")
        return 2
    sa = [ra[i]["systems"][args.a_system] for i in common]
    sb = [rb[i]["systems"][args.b_system] for i in common]
    mean, low, high = paired([s["recall@5"] for s in sa], [s["recall@5"] for s in sb])
    changed = sum(x["query"] != y["query"] for x, y in zip(sa, sb, strict=True))
    print(f"Recall@5 A - B: {mean:+.3f} [{low:+.3f}, {high:+.3f}] over {len(common)} rows; {changed} queries differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
