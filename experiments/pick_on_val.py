"""Choose a GRPO checkpoint on the validation rows, never on the held-out ones.

    SPLIT=val WARMUP=0 experiments/eval_all_rows.sh runs/bench_real_gemma_s0 runs/levers/val_s0 \
      grpo_20=... grpo_40=... grpo_60=...
    python experiments/pick_on_val.py runs/levers/val_s0/eval.json

Reads a ``queryrl eval`` of saved checkpoints (systems named ``<prefix>_<step>``, ``--prefix``, default
``grpo``) on the bench's validation split and prints, as JSON, each checkpoint's Recall@5 and MRR there and
the one chosen: the highest Recall@5, ties broken by MRR, then by the earlier step (the cheaper run). The
held-out rows are evaluated only for the chosen one, so the held-out figure is not the maximum over
checkpoints.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

STEP = re.compile(r"_(\d+)$")


def pick(systems: dict[str, dict[str, float]], prefix: str) -> tuple[str, list[dict[str, object]]]:
    """(the chosen system, every checkpoint's row) among `systems` (an eval's ``systems``) named
    ``<prefix>_<step>``."""
    rows = [
        {"system": name, "step": int(m.group(1)), "recall@5": s["recall@5"], "mrr": s["mrr"]}
        for name, s in systems.items()
        if name.startswith(prefix + "_") and (m := STEP.search(name))
    ]
    if not rows:
        raise SystemExit(f"no system named {prefix}_<step> in the eval")
    best = max(rows, key=lambda r: (r["recall@5"], r["mrr"], -int(str(r["step"]))))
    return str(best["system"]), sorted(rows, key=lambda r: int(str(r["step"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("eval_json", type=Path, help="eval.json of the checkpoints on the validation split")
    parser.add_argument("--prefix", default="grpo", help="the run's systems: <prefix>_<step> (default grpo)")
    args = parser.parse_args()
    result = json.loads(args.eval_json.read_text(encoding="utf-8"))
    chosen, rows = pick(result["systems"], args.prefix)
    out = {"eval": str(args.eval_json), "n": result["n_samples"], "checkpoints": rows, "chosen": chosen}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
