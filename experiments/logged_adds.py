"""In GRPO's logged groups: on prompts whose turn names its gold entity, how often samples add another entity and
what they score.

    python experiments/logged_adds.py runs/grid/folds/fold{0,2,3,4}of10_g7 --out experiments/results/logged_adds.json

Reads each bench-real run's ``grpo_run/samples/step_*.jsonl`` (the groups the trainer logged, with the prompt, the
response, the gold titles and the score). A prompt's turn is the text between ``当前问题：`` and ``改写后的查询`` of
the logged prompt; the knowledge base's names (two characters or more, longest first) are the entities. For the
prompts whose turn names a gold title it counts the samples whose response names an entity the turn does not
("adds"), and the mean score of those that add and of those that do not: whether the reward already pays for leaving
such a turn alone (``experiments/reference_losses.py`` counts the same habit on the held-out turns).
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

from queryrl.apps.query_rewrite.data.kdconv_prep import entity_pattern
from queryrl.atomic import atomic_write_text


def logged_groups(run: Path) -> dict[tuple[int, int], list[dict[str, Any]]]:
    groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for path in sorted((run / "grpo_run" / "samples").glob("step_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                groups[(row["step"], row["group"])].append(row)
    return groups


def count(run: Path, names: Any) -> dict[str, Any]:
    prompts = samples = adds = 0
    scores: dict[str, list[float]] = {"adds": [], "does not add": []}
    for rows in logged_groups(run).values():
        turn = rows[0]["prompt"].split("当前问题：\n")[-1].split("\n\n改写后的查询")[0]
        named = {m.group(0) for m in names.finditer(turn)}
        if not named & set(rows[0]["ground_truth"]["gold_titles"]):
            continue
        prompts += 1
        for row in rows:
            added = bool({m.group(0) for m in names.finditer(row["response"])} - named)
            samples, adds = samples + 1, adds + added
            scores["adds" if added else "does not add"].append(float(row["score"]))
    means = {k: round(sum(v) / len(v), 3) if v else None for k, v in scores.items()}
    return {
        "prompts naming the gold entity": prompts,
        "samples": samples,
        "samples that add": adds,
        "mean score": means,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="bench-real work folders (grpo_run/samples inside)")
    parser.add_argument("--kb", default=str(kdconv_dir() / "kb_travel.json"), help="KdConv travel knowledge base")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    kb = json.loads(Path(args.kb).read_text(encoding="utf-8"))
    names = entity_pattern(name for name in kb if len(name) >= 2)
    result = {str(run): count(run, names) for run in args.runs}
    text = json.dumps(result, ensure_ascii=False, indent=1)
    print(text)
    if args.out:
        atomic_write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()
