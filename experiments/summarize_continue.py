"""The result JSON of one ``experiments/continue_grpo.sh`` run (lever 8 of experiments/logs/real_model.md).

    python experiments/summarize_continue.py OUT RESULT.json

Reads ``OUT/eval/eval.json`` (the systems and their paired comparisons), ``OUT/eval/eval_samples.jsonl``
(paired differences between the saved steps) and ``OUT/grpo_run/metrics.jsonl`` (per 20-step window: the
share of zero-variance groups, the steps without a gradient, the mean step time) and writes RESULT.json.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # common, real_model

from common import write_json
from compare_evals import paired, rows
from real_model import system_summary


def windows(metrics: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """Per `every` steps: the mean zero-variance share, the steps with no group spread, the mean step time."""
    out = []
    for start in range(0, len(metrics), every):
        part = metrics[start : start + every]
        zero = [float(r.get("reward/zero_std_group_frac", 0.0)) for r in part]
        out.append(
            {
                "steps": f"{part[0]['step']}-{part[-1]['step']}",
                "zero_variance_groups": round(sum(zero) / len(zero), 3),
                "steps_without_gradient": sum(z == 1.0 for z in zero),
                "step_s": round(sum(float(r["timing_s/step"]) for r in part) / len(part), 1),
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(__doc__)
        return 2
    out, result = Path(args[0]), Path(args[1])
    evaluation = json.loads((out / "eval" / "eval.json").read_text(encoding="utf-8"))
    systems = system_summary(evaluation["systems"])
    steps = sorted(int(k.split("_")[1]) for k in systems if k.startswith("grpo_"))
    base = systems["concat_last3"]["ctx_dep_recall@5"]
    for k in steps:
        s = systems[f"grpo_{k}"]
        s["ctx_dep_over_concat_last3"] = round(s["ctx_dep_recall@5"] / base, 3) if base else None
    comparisons = {
        name: {m: c["recall@5"][m] for m in ("diff", "low", "high")}
        for name, c in (evaluation.get("comparisons") or {}).items()
    }
    samples = rows(out / "eval" / "eval_samples.jsonl")
    for k in steps[1:]:  # each later step against the first saved one, on the same rows
        later = [r["systems"][f"grpo_{k}"]["recall@5"] for r in samples.values()]
        first = [r["systems"][f"grpo_{steps[0]}"]["recall@5"] for r in samples.values()]
        diff, low, high = paired(later, first)
        comparisons[f"grpo_{k}-grpo_{steps[0]}"] = {"diff": diff, "low": low, "high": high}
    metrics = [json.loads(line) for line in (out / "grpo_run" / "metrics.jsonl").read_text().splitlines()]
    every = steps[1] - steps[0] if len(steps) > 1 else len(metrics)
    payload = {
        "eval_rows": len(samples),
        "systems": systems,
        "comparisons_recall@5": comparisons,
        "training_windows": windows(metrics, every),
        "run": str(out),
    }
    write_json(result, payload)
    print(f"wrote {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
