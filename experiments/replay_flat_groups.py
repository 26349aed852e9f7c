"""Which extra reward would split GRPO's flat groups? A replay of a run's logged groups (lever 21).

    python experiments/replay_flat_groups.py runs/levers/hist320_gold_s0 runs/levers/hist320_gold_s1

For each run folder, reads the groups its GRPO samples files hold (``grpo_run/samples/step_*.jsonl``) and counts,
over the groups whose turn has gold documents: the groups with a reward spread, the flat ones, those of them whose
rewrites are all the same text, and, for the flat ones with different rewrites, how many would get a spread from

- ``margin_top5`` / ``margin_top100`` / ``margin_all``: the gold document's BM25 score minus the best other
  document's, over the top of the index's ranking (5, 100, every document), divided by the top score (the
  embedded RAG's BM25 over the KdConv travel knowledge base, retrieved again for each rewrite);
- ``entity_share``: the share of the logged top 5 whose title is a gold document's entity (KdConv ids are
  ``entity::attribute``), what ``app.query_rewrite.weights.retrieval_entity`` rewards.

Prints one JSON line per run folder.
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_KB = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kdconv" / "travel" / "kb_travel.json"


def groups_of(run: Path) -> list[list[dict[str, Any]]]:
    """The logged groups of `run`'s GRPO samples, each its rows."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for path in sorted((run / "grpo_run" / "samples").glob("step_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            groups[(row["step"], row["group"])].append(row)
    return list(groups.values())


def margin(scores: np.ndarray, doc_ids: Sequence[str], gold: set[str], depth: int) -> float:
    """(gold score - best other score) / top score over the first `depth` of the ranking; a gold document
    outside it scores 0; -1 when the query matches nothing."""
    if scores.max() <= 0:
        return -1.0
    order = np.argsort(-scores, kind="stable")[:depth]
    gold_scores = [scores[i] for i in order if doc_ids[i] in gold]
    other = [scores[i] for i in order if doc_ids[i] not in gold]
    best_gold = gold_scores[0] if gold_scores else 0.0
    best_other = other[0] if other else 0.0
    return float((best_gold - best_other) / scores[order[0]])


def replay(run: Path, index: Any) -> dict[str, Any]:
    from queryrl.apps.query_rewrite.data.kdconv import doc_entity

    doc_ids = [d.doc_id for d in index.documents]
    counts: collections.Counter[str] = collections.Counter()
    for rows in groups_of(run):
        gold = set(rows[0]["ground_truth"]["gold_doc_ids"])
        if not gold:
            continue
        counts["groups"] += 1
        if len({round(r["score"], 6) for r in rows}) > 1:
            counts["spread"] += 1
            continue
        counts["flat"] += 1
        queries = [(r.get("reward_info") or {}).get("candidate_query", r["response"]) for r in rows]
        if len(set(queries)) == 1:
            counts["flat_identical"] += 1
            continue
        counts["flat_different"] += 1
        counts["flat_different_all_miss"] += all(r["reward_parts"].get("recall_at_5", 0.0) == 0.0 for r in rows)
        scores = [index.scores(q) for q in queries]
        for name, depth in (("margin_top5", 5), ("margin_top100", 100), ("margin_all", len(doc_ids))):
            values = {round(margin(s, doc_ids, gold, depth), 4) for s in scores}
            counts[f"split_by_{name}"] += len(values) > 1
        entities = {doc_entity(g) for g in gold}
        shares = set()
        for row in rows:
            shown = (row.get("reward_info") or {}).get("candidate_documents") or []
            shares.add(sum(doc_entity(d["doc_id"]) in entities for d in shown))
        counts["split_by_entity_share"] += len(shares) > 1
    return {"run": str(run), **counts}


def main(argv: Sequence[str] | None = None) -> int:
    from queryrl.apps.query_rewrite.reward.rag import embedded_rag

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="bench-real work folders (with grpo_run/samples)")
    parser.add_argument("--kb", type=Path, default=DEFAULT_KB)
    args = parser.parse_args(argv)
    if not args.kb.is_file():
        print(f"no KdConv knowledge base at {args.kb}: nothing to replay")
        return 0
    index = embedded_rag(f"kdconv:{args.kb}", 5).index
    for run in args.runs:
        print(json.dumps(replay(run, index), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
