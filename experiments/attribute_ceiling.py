"""How far can any short query go on bench-real's held-out turns? Split by the gold document's attribute.

    python experiments/attribute_ceiling.py runs/levers/vocab_g7_s{0,1,2}/eval/eval_samples.jsonl \
        --out experiments/results/attribute_ceiling.json

A KdConv turn's gold documents are the ``entity::attribute`` facts the *next* reply uses. Each held-out turn with
gold is put in one class by its first gold document: ``Information`` (the entity's long description) or a short
attribute (address, phone, tickets, hours, visiting time, nearby sights). Per class, Recall@5 of the systems the eval
logged (the warm-up, GRPO, the reference pipeline) and of queries built with the gold label, which no rewriter can
see and which only bound what a query could reach with the same BM25 index:

- ``entity + attribute``: the gold entity's name and the knowledge base's field name ("前门大街 地址");
- ``<system> + attribute``: a system's own query with the field name appended;
- ``best query``: per turn, the best of all the queries above (a bound on any of them, and on a rewriter that picked
  the best one for every turn).

``--context-dependent`` keeps the turns the eval counts as context-dependent on KdConv (an earlier message: ``turn``
above 0); the table then also gives each query's Recall@5 as a multiple of ``concat_last3``'s, the goal's measure.

The index is the bench's (the KdConv knowledge base, BM25 with the titles as the entity dictionary), built the way
the reward builds it (:func:`~queryrl.apps.query_rewrite.reward.rag.corpus_documents`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # common

from common import kdconv_dir

from queryrl.apps.query_rewrite.metrics import recall_at_k
from queryrl.apps.query_rewrite.reward.rag import corpus_documents
from queryrl.atomic import atomic_write_text
from queryrl.rag import BM25Index
from queryrl.rag.index import title_entities

DESCRIPTION = "Information"  # KdConv's field for an entity's long description
SYSTEMS = ("concat_last3", "warmup", "grpo", "reference")
BEST = "best query"


def attribute_class(gold: list[str]) -> str:
    """``description`` when the first gold document is an entity's description, else ``short attribute``."""
    return "description" if gold[0].partition("::")[2] == DESCRIPTION else "short attribute"


def queries(row: dict[str, Any]) -> dict[str, str]:
    """The logged systems' queries and the label-built ones (see the module docstring)."""
    entity, _, attribute = row["gold"][0].partition("::")
    logged = {name: str(row["systems"][name]["query"]) for name in SYSTEMS if name in row["systems"]}
    built = {f"{name} + attribute": f"{query} {attribute}" for name, query in logged.items()}
    return logged | built | {"entity + attribute": f"{entity} {attribute}"}


def ceiling(files: list[Path], kb: str, context_dependent: bool = False) -> dict[str, Any]:
    documents = corpus_documents(f"kdconv:{kb}")
    index = BM25Index(documents, entities=title_entities(documents))
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if not row["gold"] or (context_dependent and (row.get("turn") or 0) == 0):
                continue
            kind = attribute_class(row["gold"])
            turn = {
                name: recall_at_k([hit.doc_id for hit in index.search(query, 5)], row["gold"], 5)
                for name, query in queries(row).items()
            }
            for name, score in (turn | {BEST: max(turn.values())}).items():
                scores[kind][name].append(score)
                scores["all"][name].append(score)
    return {
        "files": [str(f) for f in files],
        "context_dependent": context_dependent,
        "classes": {
            kind: {"turns": len(next(iter(by_query.values())))}
            | {name: round(sum(v) / len(v), 3) for name, v in by_query.items()}
            for kind, by_query in scores.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="eval_samples.jsonl of bench-real runs")
    parser.add_argument("--kb", default=str(kdconv_dir() / "kb_travel.json"), help="KdConv travel knowledge base")
    parser.add_argument("--context-dependent", action="store_true", help="only turns with an earlier message")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = ceiling(args.files, args.kb, args.context_dependent)
    names = list(next(iter(result["classes"].values())))[1:]
    print("| class | turns | " + " | ".join(names) + " |")
    print("| --- | ---: |" + " ---: |" * len(names))
    for kind, row in result["classes"].items():
        print(f"| {kind} | {row['turns']} | " + " | ".join(f"{row[n]:.3f}" for n in names) + " |")
    base = result["classes"]["all"].get("concat_last3")
    if args.context_dependent and base:
        ratios = " | ".join(f"{result['classes']['all'][n] / base:.2f}x" for n in names)
        print(f"| all, x concat_last3 | | {ratios} |")
    if args.out:
        atomic_write_text(args.out, json.dumps(result, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
