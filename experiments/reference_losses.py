"""Where GRPO and the reference pipeline part ways on bench-real's held-out turns: which entity each query names.

    python experiments/reference_losses.py runs/levers/vocab_g{7,8,9}_s{0,1,2} \
        --out experiments/results/reference_losses_restricted_grid.json

For every held-out turn with gold where GRPO's Recall@5 differs from the reference's (each run's turns counted once
per run), the turn is classed by whether each query contains the gold entity's name. A GRPO loss where only the
reference names the gold entity is classed further by the knowledge-base entities GRPO's query names instead: none
(a description such as "马未都先生创办的...", or a made-up place; or half the gold name or more, "古陶文明" for
古陶文明博物馆: a copying slip), one the conversation mentions *before* the gold entity's last mention (the policy
kept to an earlier topic), one mentioned after it, or one the conversation never mentions. The conversation is the
run's own ``data/test.parquet`` (the turn and its whole history). It also counts, over every held-out turn with gold,
how often each system's query names the gold entity (``names the gold entity``).

Turns that name their gold entity themselves ("好的，观复博物馆的地址你有吗？") need no entity added: the raw turn is
the query. ``turn names the gold entity: SYSTEM adds an entity`` counts the queries that add another knowledge-base
entity to such a turn (usually the conversation's earlier topic: "...的地址你有吗？ 798艺术区"), and ``... hits
lost`` the Recall@5 those queries lose against the raw turn, summed over the turns (added 2026-12-07).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # common

from common import kdconv_dir

from queryrl.apps.query_rewrite.data.kdconv_prep import entity_pattern
from queryrl.apps.query_rewrite.eval.samples import load_samples
from queryrl.atomic import atomic_write_text

NAMING_SYSTEMS = ("concat_last3", "reference", "warmup", "grpo")  # how often each query names the gold entity


def names_gold(query: str, gold: set[str]) -> bool:
    return any(entity in query for entity in gold)


def common_run(a: str, b: str) -> int:
    """The length of the longest run of characters `a` and `b` share."""
    best = 0
    for i in range(len(b)):
        for j in range(i + best + 1, len(b) + 1):
            if b[i:j] not in a:
                break
            best = j - i
    return best


def instead(query: str, gold: set[str], conversation: str, pattern: re.Pattern[str]) -> str:
    """What GRPO's query names in place of the gold entity (see the module docstring)."""
    others = [m.group(0) for m in pattern.finditer(query) if m.group(0) not in gold]
    if not others:
        if any(common_run(query, entity) >= max(2, len(entity) // 2) for entity in gold):
            return "no knowledge-base entity, but half the gold name or more (a copying slip)"
        return "no knowledge-base entity"
    last_gold = max(conversation.rfind(entity) for entity in gold)
    last_other = max(conversation.rfind(entity) for entity in others)
    if last_other < 0:
        return "an entity the conversation never mentions"
    return "an entity mentioned before the gold one" if last_other < last_gold else "an entity mentioned after it"


def added_entity(row: dict[str, Any], gold: set[str], pattern: re.Pattern[str]) -> Counter[str]:
    """On a turn that names its gold entity: which systems' queries add another entity, and the hits they lose
    against the raw turn (see the module docstring); empty on other turns."""
    counts: Counter[str] = Counter()
    turn = str(row["last_turn"])
    if not names_gold(turn, gold):
        return counts
    counts["turn names the gold entity"] += 1
    named = {m.group(0) for m in pattern.finditer(turn)}
    raw = row["systems"]["raw_turn"]["recall@5"]
    for system in NAMING_SYSTEMS:
        query = row["systems"].get(system, {}).get("query")
        if query is None or not {m.group(0) for m in pattern.finditer(query)} - named:
            continue
        counts[f"turn names the gold entity: {system} adds an entity"] += 1
        lost = raw - row["systems"][system]["recall@5"]
        counts[f"turn names the gold entity: {system} adds an entity, hits lost"] += lost
    return counts


def classify(run: Path, pattern: re.Pattern[str]) -> Counter[str]:
    rows = [json.loads(line) for line in (run / "eval" / "eval_samples.jsonl").read_text("utf-8").splitlines()]
    samples = load_samples(str(run / "data" / "test.parquet"), max_samples=len(rows))
    counts: Counter[str] = Counter()
    for row, sample in zip(rows, samples, strict=True):
        if not row["gold"]:
            continue
        gold = {doc.partition("::")[0] for doc in row["gold"]}
        counts["turns with gold"] += 1
        for system in NAMING_SYSTEMS:
            if system in row["systems"] and names_gold(row["systems"][system]["query"], gold):
                counts[f"names the gold entity: {system}"] += 1
        counts.update(added_entity(row, gold, pattern))
        grpo, ref = row["systems"]["grpo"], row["systems"]["reference"]
        diff = grpo["recall@5"] - ref["recall@5"]
        if diff == 0:
            continue
        side = "GRPO above" if diff > 0 else "GRPO below"
        named = f"GRPO {'names' if names_gold(grpo['query'], gold) else 'omits'} it, " + (
            f"reference {'names' if names_gold(ref['query'], gold) else 'omits'} it"
        )
        counts[f"{side}: {named}"] += 1
        if diff < 0 and not names_gold(grpo["query"], gold) and names_gold(ref["query"], gold):
            conversation = "".join(str(m["content"]) for m in sample.contexts)
            counts[f"GRPO below, names instead: {instead(grpo['query'], gold, conversation, pattern)}"] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="bench-real work folders (eval/ and data/ inside)")
    parser.add_argument("--kb", default=str(kdconv_dir() / "kb_travel.json"), help="KdConv travel knowledge base")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    kb = json.loads(Path(args.kb).read_text(encoding="utf-8"))
    pattern = entity_pattern(name for name in kb if len(name) >= 2)
    total: Counter[str] = Counter()
    per_run = {}
    for run in args.runs:
        counts = classify(run, pattern)
        per_run[str(run)] = dict(sorted(counts.items()))
        total.update(counts)
    for key, n in sorted(total.items()):
        print(f"{n:7g}  {key}")
    if args.out:
        result: dict[str, Any] = {"runs": per_run, "total": dict(sorted(total.items()))}
        atomic_write_text(args.out, json.dumps(result, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
