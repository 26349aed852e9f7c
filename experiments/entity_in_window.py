"""Does the policy's prompt show the gold entity? Per held-out turn of bench-real's split files.

    python experiments/entity_in_window.py runs/bench_real_defaults/data/test.parquet runs/levers/NAME/data/test.parquet

For each row with a gold title: whether the title is written in the current turn, elsewhere in the prompt the
policy reads (the history window, ``--history-chars``), only in the part of the conversation the window cuts,
or nowhere in the conversation. The reference pipeline reads the whole conversation; this says how many turns
a longer window could give the policy an entity it cannot see now (the issue's "read as much as the reference").
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import pandas as pd


def where(row: pd.Series) -> str:
    title = str(next(iter(row.reward_model["ground_truth"]["gold_titles"])))
    messages = list(row.extra_info["contexts"])
    conversation = "".join(str(m["content"]) for m in messages)
    prompt = str(row.prompt[-1]["content"])
    if title in str(messages[-1]["content"]):
        return "in the turn"
    if title in prompt:
        return "in the window"
    return "beyond the window" if title in conversation else "not in the conversation"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    kinds = ("in the turn", "in the window", "beyond the window", "not in the conversation")
    print("| file | rows with gold | " + " | ".join(kinds) + " |")
    print("| --- | ---: |" + " ---: |" * len(kinds))
    for path in args.files:
        frame = pd.read_parquet(path)
        frame = frame[[len(r["ground_truth"]["gold_titles"]) > 0 for r in frame.reward_model]]
        c = Counter(where(r) for _, r in frame.iterrows())
        print(f"| {path} | {len(frame)} | " + " | ".join(str(c[k]) for k in kinds) + " |")


if __name__ == "__main__":
    main()
