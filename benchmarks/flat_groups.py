"""How many GRPO groups are flat under today's reward, and with the graded retrieval component? An offline proxy.

    python benchmarks/flat_groups.py                 # demo rows, and KdConv travel's where KDCONV_DIR has it
    python benchmarks/flat_groups.py --rows 16 --out /tmp/flat.json

No model is trained or sampled: there are no recorded rollouts in the repository. For each retrieval turn (the
demo's validation rows with gold; KdConv travel's dev rows with gold where present) a pool of rewrites stands in
for a warm policy's samples: the reference pipeline's query (what the warm-up copies), the same without
punctuation, the same with its last word moved to the front, the raw turn and the last 3 turns joined. Each turn
gets `--groups` groups of 4 drawn from the pool with replacement, the reference's query drawn with probability
0.4 (a warm policy repeats it), the others 0.15 each. Every distinct rewrite is scored once with the real reward
(the demo/KdConv configs' ``mix``: judge 0.5 (offline), retrieval_rank 1.0, format 0.2, the intent check), and a
group is flat when all its rewards are equal (as ``reward/zero_std_group_frac``). Reported: the share of groups
whose 4 rewrites are one text (flat under any reward), those whose 4 rewrites all miss the gold document in the
top 5 (no retrieval component of depth 5 splits them), the flat share under today's reward and with
``weights.retrieval_graded`` 0.5 and 1.0 added, and, for the stuffing check, the mean graded component of the
reference's query against three stuffed variants (and the gold entity named once), with and without the
component's guard (the length budget and the intent check). The flat shares again with ``rag.rank_depth`` 20
(both rank rewards read 20 documents deep; today's rank reward at depth 100 was lever 7). A proxy for what
training would see, not a training result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from common import RESULTS, kdconv_dir, machine, one_thread, write_json

from queryrl.apps.query_rewrite.data.kdconv import kdconv_missing

KDCONV = kdconv_dir()
WEIGHTS = {"judge": 0.5, "retrieval_rank": 1.0, "format": 0.2, "retrieval_graded": 1.0}  # graded split off below
GRADED_WEIGHTS = (0.5, 1.0)
DRAW = {"reference": 0.4, "no_punctuation": 0.15, "last_word_first": 0.15, "turn": 0.15, "concat_last3": 0.15}
DEEP = 20  # the second measurement's rag.rank_depth
PUNCTUATION = "？?。！!，,、；;：:"


def pool(row: dict[str, Any], reference: str) -> dict[str, str]:
    """The stand-in samples of one turn (see the module doc)."""
    contexts = row["extra_info"]["contexts"]
    words = reference.split()
    moved = " ".join(words[-1:] + words[:-1]) if len(words) > 1 else reference
    return {
        "reference": reference,
        "no_punctuation": reference.translate({ord(c): None for c in PUNCTUATION}).strip() or reference,
        "last_word_first": moved,
        "turn": str(contexts[-1]["content"]),
        "concat_last3": " ".join(str(m["content"]) for m in contexts[-3:]),
    }


def stuffed(row: dict[str, Any], reference: str, entity: str) -> dict[str, str]:
    """The stuffed variants of the reference's query: the entity x3, the last 3 turns copied, 3x its length; and the
    entity once (``entity_x1``: naming the gold entity, the fair baseline of ``entity_x3``)."""
    last3 = " ".join(str(m["content"]) for m in row["extra_info"]["contexts"][-3:])
    return {
        "entity_x1": f"{reference} {entity}",
        "entity_x3": f"{reference} {entity} {entity} {entity}",
        "copied_turns": f"{reference} {last3}",
        "three_times": " ".join([reference] * 3),
    }


def score(row: dict[str, Any], query: str, **flat: Any) -> dict[str, Any]:
    """The reward's result for `query` on `row` (mix with the graded component at weight 1)."""
    from queryrl.apps.query_rewrite.reward.score import compute_score

    answer = json.dumps({"rewritten_query": query}, ensure_ascii=False)
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    return asyncio.run(compute_score(row["data_source"], answer, gt, info, weights=WEIGHTS, **flat))


def unguarded(out: dict[str, Any], gold: list[str]) -> float:
    """The graded component of a result without its guard (no length budget, intent ignored)."""
    from queryrl.apps.query_rewrite.reward.modes import retrieval_graded_reward

    docs = out["candidate_documents"]
    value = retrieval_graded_reward([d["doc_id"] for d in docs], [d["score"] for d in docs], gold)
    return 0.0 if value is None else value


def measure(rows: list[dict[str, Any]], entity_of: Any, groups: int, seed: int, **flat: Any) -> dict[str, Any]:
    """The flat shares and the stuffing means over `rows` (see the module doc)."""
    rng = random.Random(seed)
    flat_counts = {"same_text": 0, "all_miss_gold": 0, "today": 0, **{f"graded_{w}": 0 for w in GRADED_WEIGHTS}}
    stuffing: dict[str, list[tuple[float, float]]] = {}
    total = 0
    for row in rows:
        gold = [str(g) for g in row["reward_model"]["ground_truth"]["gold_doc_ids"]]
        reference = score(row, "x", **flat)["reference_query"]
        results = {name: score(row, q, **flat) for name, q in pool(row, reference).items()}
        for _ in range(groups):
            drawn = rng.choices(list(DRAW), weights=list(DRAW.values()), k=4)
            today = [results[n]["score"] - results[n]["retrieval_graded"] for n in drawn]
            total += 1
            flat_counts["same_text"] += len({results[n]["candidate_query"] for n in drawn}) == 1  # no reward splits
            flat_counts["all_miss_gold"] += all(results[n]["recall_at_5"] == 0 for n in drawn)  # nothing to grade
            flat_counts["today"] += len(set(today)) == 1
            for w in GRADED_WEIGHTS:
                mixed = [t + w * results[n]["retrieval_graded"] for t, n in zip(today, drawn, strict=True)]
                flat_counts[f"graded_{w}"] += len(set(mixed)) == 1
        variants = {"reference": results["reference"]}
        variants |= {n: score(row, q, **flat) for n, q in stuffed(row, reference, entity_of(gold[0])).items()}
        for name, out in variants.items():
            stuffing.setdefault(name, []).append((out["retrieval_graded"], unguarded(out, gold)))
    return {
        "turns": len(rows),
        "groups": total,
        "flat_share": {k: round(v / total, 3) for k, v in flat_counts.items()},
        "graded_mean": {k: round(statistics.mean(v[0] for v in vals), 3) for k, vals in stuffing.items()},
        "graded_mean_without_guard": {k: round(statistics.mean(v[1] for v in vals), 3) for k, vals in stuffing.items()},
    }


def datasets(n: int) -> dict[str, tuple[list[dict[str, Any]], Any, dict[str, Any]]]:
    """name -> (rows, gold doc id -> entity, the reward's flat settings)."""
    from queryrl.apps.query_rewrite.demo.data import make_catalogue, sales_demo_rows

    product = {d["doc_id"]: d["product"] for d in make_catalogue()}
    demo = [r for r in sales_demo_rows("val") if r["reward_model"]["ground_truth"]["gold_doc_ids"]][:n]
    out: dict[str, tuple[list[dict[str, Any]], Any, dict[str, Any]]] = {"sales_demo": (demo, product.get, {})}
    if (KDCONV / "dev.json").is_file():
        from queryrl.apps.query_rewrite.data.kdconv import doc_entity, kdconv_rows

        rows = kdconv_rows(KDCONV / "dev.json", require_gold=True)[:n]
        out["kdconv_travel"] = (rows, doc_entity, {"corpus": f"kdconv:{KDCONV / 'kb_travel.json'}"})
    else:
        print(f"KdConv travel left out: {kdconv_missing(KDCONV / 'dev.json')}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=160, help="retrieval turns per data set")
    parser.add_argument("--groups", type=int, default=4, help="groups of 4 drawn per turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "flat_groups.json")
    args = parser.parse_args()
    one_thread()
    start = time.perf_counter()
    result: dict[str, Any] = {"rows": args.rows, "groups_per_turn": args.groups, "seed": args.seed, "draw": DRAW}
    for name, (rows, entity_of, flat) in datasets(args.rows).items():
        result[name] = measure(rows, entity_of, args.groups, args.seed, **flat)
        # the same draws with both rank rewards reading 20 documents deep (rag.rank_depth; lever 7 tried 100)
        deep = measure(rows, entity_of, args.groups, args.seed, rank_depth=DEEP, **flat)
        result[name][f"flat_share_rank_depth_{DEEP}"] = deep["flat_share"]
        print(name, json.dumps(result[name], ensure_ascii=False), flush=True)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    result["machine"] = machine()
    write_json(args.out, result)
    print(f"wrote {args.out} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
