"""How well candidate SFT targets retrieve on the bench's warm-up turns, before any training (lever 17).

    python experiments/warmup_targets.py --seed 0      # JSON on stdout
    python experiments/warmup_targets.py --seed 1 --rows 320 --history-chars 160

The turns are those ``make bench-real`` warms up on: the KdConv travel split of ``--seed`` prepared as the bench
prepares it (:func:`~queryrl.apps.query_rewrite.data.kdconv_prep.prepare`, text answers), shuffled with the same
seed, the first ``--rows`` training turns. Each candidate query is retrieved with the embedded BM25 over the
knowledge base (top 5, the bench's RAG) and checked by the intent check the warm-up applies
(:func:`~queryrl.apps.query_rewrite.intent.check.check_intent`):

- ``reference``: the reference rewriter's answer on the prompt's window (the bench's default target);
- ``gold_entity``: :func:`~queryrl.apps.query_rewrite.data.kdconv_targets.gold_entity_query` (the turn, then the
  gold entity where the window shows it and the turn does not name it; else the reference's);
- ``gold``: :func:`~queryrl.apps.query_rewrite.data.kdconv_targets.gold_query` (the gold entity, the turn, the gold
  attribute words);
- ``turn_entity_always``: the turn and the gold entity even where the window does not show it (an oracle the
  policy cannot copy: the entity is not in its prompt).
- ``question_entity``: :func:`~queryrl.apps.query_rewrite.data.kdconv_targets.question_entity_query` (``gold_entity``
  of the turn without the clauses that tell a value beside its question, lever 22);
- ``question_attribute``: :func:`~queryrl.apps.query_rewrite.data.kdconv_targets.question_attribute_query`
  (``question_entity`` and the knowledge base's field names of the gold attributes the turn asks for);
- ``best_of``: per turn the better-ranked of ``gold_entity`` and ``question_entity`` among those the intent check
  keeps (ties to ``gold_entity``): ConvSearch-R1's rank selection over the two rule-built candidates.

Per candidate: turns whose top 5 holds a gold document (``hit``), the mean reciprocal rank, turns the intent
check keeps, turns both kept and hit (what the warm-up keeps), and turns whose query names the gold entity.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_KDCONV = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "kdconv" / "travel"


def candidates(window: Sequence[dict[str, Any]], gold: Sequence[str], reference: str) -> dict[str, str]:
    """Each candidate's query for one turn (see the module doc)."""
    from queryrl.apps.query_rewrite.data.kdconv import doc_entity
    from queryrl.apps.query_rewrite.data.kdconv_targets import (
        gold_entity_query,
        gold_query,
        question_attribute_query,
        question_entity_query,
    )

    entity = doc_entity(gold[0])
    current = str(window[-1]["content"]).strip()
    return {
        "reference": reference,
        "gold_entity": gold_entity_query(window, gold, reference),
        "gold": gold_query(window, gold, reference),
        "question_entity": question_entity_query(window, gold, reference),
        "question_attribute": question_attribute_query(window, gold, reference),
        "turn_entity_always": current if entity in current else f"{current} {entity}",
    }


def measure(rows: Any, search: Callable[[str], list[str]], history_chars: int) -> dict[str, Any]:
    """The counts of the module doc over `rows` (a data frame of prepared training rows)."""
    from queryrl.apps.query_rewrite.data.kdconv import doc_entity
    from queryrl.apps.query_rewrite.data.kdconv_prep import history_window
    from queryrl.apps.query_rewrite.intent.check import check_intent
    from queryrl.apps.query_rewrite.reward.intent import intent_sources
    from queryrl.apps.query_rewrite.reward.modes import parse_answer

    counts: Counter[str] = Counter()
    rr: defaultdict[str, float] = defaultdict(float)  # summed reciprocal ranks
    turns = 0
    for _, row in rows.iterrows():
        info = row["extra_info"]
        gold = list(row["reward_model"]["ground_truth"]["gold_doc_ids"])
        if not gold:
            continue
        turns += 1
        contexts = list(info["contexts"])
        window = history_window(contexts, history_chars)
        entity = doc_entity(gold[0])
        counts["entity_in_window"] += any(entity in str(m["content"]) for m in window)
        ranks: dict[str, tuple[int, bool]] = {}
        parsed = parse_answer(info["sft_target"], answer_format="text")
        assert parsed is not None  # the reference's own answer
        for name, query in candidates(window, gold, parsed.rewritten_query).items():
            hits = search(query)
            rank = next((r for r, d in enumerate(hits) if d in gold), None)
            kept = check_intent(contexts, query, intent_sources(info)).kept
            counts[f"{name}/hit"] += rank is not None
            rr[name] += 0.0 if rank is None else 1.0 / (rank + 1)
            counts[f"{name}/intent_kept"] += kept
            counts[f"{name}/kept_and_hit"] += kept and rank is not None
            counts[f"{name}/names_gold_entity"] += entity in query
            ranks[name] = (rank if rank is not None else 99, kept)
        # the better-ranked of gold_entity and question_entity among the kept ones, ties to gold_entity
        best = min(("gold_entity", "question_entity"), key=lambda n: (not ranks[n][1], ranks[n][0]))
        best_rank, best_kept = ranks[best]
        counts["best_of/hit"] += best_rank < 99
        rr["best_of"] += 0.0 if best_rank == 99 else 1.0 / (best_rank + 1)
        counts["best_of/intent_kept"] += best_kept
        counts["best_of/kept_and_hit"] += best_kept and best_rank < 99
        counts["best_of/chose_question_entity"] += best == "question_entity" and ranks[best] != ranks["gold_entity"]
    out: dict[str, Any] = {"turns": turns, "entity_in_window": counts["entity_in_window"]}
    out["best_of_chose_question_entity"] = counts["best_of/chose_question_entity"]
    names = ("reference", "gold_entity", "gold", "question_entity", "question_attribute", "turn_entity_always")
    for name in (*names, "best_of"):
        out[name] = {
            key: counts[f"{name}/{key}"] for key in ("hit", "intent_kept", "kept_and_hit", "names_gold_entity")
        }
        out[name]["recall_at_5"] = round(counts[f"{name}/hit"] / max(turns, 1), 3)
        out[name]["mrr"] = round(rr[name] / max(turns, 1), 3)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import pandas as pd

    from queryrl.apps.query_rewrite.data.kdconv_prep import kb_name, prepare
    from queryrl.apps.query_rewrite.reward.rag import embedded_rag

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kdconv-dir", type=Path, default=DEFAULT_KDCONV)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", type=int, default=320)
    parser.add_argument("--history-chars", type=int, default=160)
    args = parser.parse_args(argv)
    if not (args.kdconv_dir / "dev.json").is_file():
        print(f"no KdConv dev.json in {args.kdconv_dir}: nothing to measure")
        return 0
    kb = args.kdconv_dir / kb_name(args.kdconv_dir)
    with tempfile.TemporaryDirectory() as tmp:
        data = prepare(args.kdconv_dir, Path(tmp), None, args.seed, args.history_chars, answer_format="text")
        frame = pd.read_parquet(data["files"]["train"])
    rows = frame.sample(frac=1.0, random_state=args.seed).head(args.rows)
    rag = embedded_rag(f"kdconv:{kb}", 5)

    def search(query: str) -> list[str]:
        return [h.doc_id for h in rag.index.search(query, rag.top_k)] if query.strip() else []

    result = {"seed": args.seed, "rows": args.rows, "history_chars": args.history_chars}
    print(json.dumps({**result, **measure(rows, search, args.history_chars)}, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
