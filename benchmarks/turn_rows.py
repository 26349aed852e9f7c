"""Each eval's per-turn scores kept in the bench's result JSON, so a grid can be read after its run folders are gone.

``benchmarks/seed_grid.py`` pairs runs turn by turn, which the summaries in a result cannot do: it reads each run's
``eval/eval_samples.jsonl`` (and ``eval_val/``). Run folders are large and live under ``runs/``, which a machine
restart or a fresh checkout loses; the result JSONs are committed. So the bench (and ``val_eval.py``) also record,
under ``turn_rows.test`` (``turn_rows.val``), every evaluated turn as numbers and identifiers only: its index,
conversation id, turn number and whether it has gold documents, and per system its Recall@5, MRR, whether the offline
check kept the intent, and its query's length in characters. No text of the conversation or of a query is kept (the
data is KdConv's, which the repository does not copy), so a grid read from these rows takes the intent as the eval
recorded it (not re-read with today's check) and has no logged GRPO groups beyond the result's
``grpo_identical_logged_groups``.

``python benchmarks/turn_rows.py RESULT.json ...`` adds them to results written before the bench kept them, from their
run folders while those are still there.

The rows are stored column-wise (one list per field) to keep a result small; :func:`expand` gives back one dict a
turn, shaped as ``eval_samples.jsonl``'s rows (with ``query_chars`` instead of ``query``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

TURN_FIELDS = ("index", "conversation_id", "turn")
SYSTEM_FIELDS = ("recall@5", "mrr", "intent_kept")


def compact(samples: Path) -> dict[str, Any]:
    """The per-turn scores of an eval's ``eval_samples.jsonl``, column-wise (numbers and ids only)."""
    records = [json.loads(line) for line in samples.read_text(encoding="utf-8").splitlines() if line.strip()]
    systems = sorted({name for r in records for name in r["systems"]})
    table: dict[str, Any] = {key: [r[key] for r in records] for key in TURN_FIELDS}
    table["gold"] = [bool(r.get("gold")) for r in records]
    table["systems"] = {
        name: {
            **{key: [r["systems"][name].get(key) for r in records] for key in SYSTEM_FIELDS},
            "query_chars": [len(r["systems"][name].get("query") or "") for r in records],
        }
        for name in systems
    }
    return table


def expand(table: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict a turn from :func:`compact`'s columns."""
    n = len(table["index"])
    rows = []
    for i in range(n):
        row: dict[str, Any] = {key: table[key][i] for key in TURN_FIELDS}
        row["gold"] = table["gold"][i]
        row["systems"] = {
            name: {key: values[i] for key, values in columns.items()} for name, columns in table["systems"].items()
        }
        rows.append(row)
    return rows


def query_chars(system_row: dict[str, Any]) -> int:
    """A system's query length in characters, from an ``eval_samples.jsonl`` row or an expanded compact one."""
    if "query_chars" in system_row:
        return int(system_row["query_chars"])
    return len(system_row.get("query") or "")


def identical_logged_groups(samples: Path) -> float | None:
    """The share of the run's logged GRPO groups (``samples/step_*.jsonl``: the trainer logs some groups of each
    step, whole) whose responses are one text: flat under any reward. None without logged groups."""
    groups: dict[tuple[str, int], set[str]] = defaultdict(set)
    sizes: dict[tuple[str, int], int] = defaultdict(int)
    for path in sorted(samples.glob("step_*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                key = (path.name, int(row["group"]))
                groups[key].add(row["response"])
                sizes[key] += 1
    sized = [key for key, n in sizes.items() if n > 1]
    return sum(len(groups[k]) == 1 for k in sized) / len(sized) if sized else None


def backfill(result_path: Path) -> list[str]:
    """Add ``turn_rows`` (test, and val where ``val_eval.py`` ran) and ``grpo_identical_logged_groups`` to a result
    written before the bench kept them, from its run folder; the evals it added (empty when there was nothing to add).

    Raises:
        ValueError: the result names no run folder that holds its test eval's rows."""
    from common import write_json

    result = json.loads(result_path.read_text(encoding="utf-8"))
    work = Path(result["settings"]["args"]["work"])
    kept = result.setdefault("turn_rows", {})
    added = []
    for name, folder in (("test", "eval"), ("val", "eval_val")):
        samples = work / folder / "eval_samples.jsonl"
        if name not in kept and samples.is_file():
            kept[name] = compact(samples)
            added.append(name)
    if "test" not in kept:
        raise ValueError(f"{result_path}: its run folder has no {work / 'eval' / 'eval_samples.jsonl'}")
    if result.get("grpo_identical_logged_groups") is None and (work / "grpo_run" / "samples").is_dir():
        result["grpo_identical_logged_groups"] = identical_logged_groups(work / "grpo_run" / "samples")
        added.append("grpo_identical_logged_groups")
    if added:
        write_json(result_path, result)
    return added


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/turn_rows.py RESULT.json ...``: :func:`backfill` each result (exit 2 on the first that has
    no run folder to read)."""
    import sys

    paths = sys.argv[1:] if argv is None else argv
    for path in paths:
        try:
            added = backfill(Path(path))
        except (OSError, ValueError, KeyError) as exc:
            print(f"turn_rows: {exc}", file=sys.stderr)
            return 2
        print(f"{path}: {'added ' + ', '.join(added) if added else 'already kept'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
