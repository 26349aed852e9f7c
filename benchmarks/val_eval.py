"""A finished ``benchmarks/real_model.py`` run evaluated again on its validation conversations: a second held-out set.

Each split of the real-model bench holds out two sets of conversations: ``data/test.parquet`` (the eval every result
reports, on which the levers of ``experiments/logs/real_model.md`` were chosen) and ``data/val.parquet``, which no
phase reads: the warm-up samples training turns, GRPO runs with ``data.val_files=[]`` and picks no checkpoint. So the
validation conversations are as unseen by the trained adapters as the test ones, and unlike them no lever was chosen
on them (a run with ``--grpo-rows val`` trained GRPO on them, so it is refused). This evaluates each run's final
systems (the same systems, model folders, kept-ids files, dtype, token budget and comparisons as its final eval, read
back from ``WORK/eval/eval.json``) on ``WORK/data/val.parquet`` into ``WORK/eval_val/``, and records the summary in
the result JSON as ``val_eval`` (timing under ``phases.eval_val``). ``benchmarks/seed_grid.py --rows val`` (or
``both``) then reads those rows.

    python benchmarks/val_eval.py experiments/results/real_model_bf16_vocab_g7_s0.json ...   # one run after another

A run whose ``eval_val/eval.json`` is already there is skipped unless ``--again``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import REPO, machine, write_json
from real_model import CONFIG, run_measured, system_summary
from turn_rows import compact

VAL_FOLDER = "eval_val"


class ValEvalError(ValueError):
    """A result, or the run folder it names, that cannot be evaluated again: one line naming which (exit 2)."""


def run_folder(result: dict[str, Any]) -> Path:
    """The result's run folder (``settings.args.work``; a relative one is under the repository, where the bench ran)."""
    work = Path(result["settings"]["args"]["work"])
    return work if work.is_absolute() else REPO / work


def eval_command(result: dict[str, Any], queryrl: str) -> list[str]:
    """The ``queryrl eval`` command of `result`'s final eval, on its run's validation rows, into ``eval_val/``."""
    work = run_folder(result)
    settings = json.loads((work / "eval" / "eval.json").read_text(encoding="utf-8"))["settings"]
    systems = [s["name"] if s["path"] is None else f"{s['name']}={s['path']}" for s in settings["systems"]]
    vocab = [f"{s['name']}={s['vocab_ids']}" for s in settings["systems"] if s.get("vocab_ids")]
    cmd = [queryrl, "eval", "--config", str(CONFIG), "--data", str(work / "data" / "val.parquet")]
    cmd += ["--corpus", settings["corpus"], "--max-new-tokens", str(settings["max_new_tokens"])]
    cmd += ["--dtype", result["compute_dtype"], "--batch-size", str(settings["batch_size"])]
    cmd += ["--processes", str(settings.get("processes") or 1), "--systems", ",".join(systems)]
    cmd += ["--out", str(work / VAL_FOLDER / "eval.json")]
    cmd += ["--vocab-ids", ",".join(vocab)] if vocab else []
    return cmd + (["--compare", ",".join(settings["compare"])] if settings.get("compare") else [])


def _load(path: Path) -> dict[str, Any]:
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
        work = run_folder(result)
        result["compute_dtype"]
    except (OSError, ValueError) as exc:
        raise ValEvalError(f"{path}: not readable as JSON ({exc})") from None
    except (KeyError, TypeError) as exc:
        raise ValEvalError(f"{path}: not a benchmarks/real_model.py result (no {exc} in it)") from None
    if result["settings"]["args"].get("grpo_rows") == "val":
        raise ValEvalError(f"{path}: GRPO trained on its validation conversations (--grpo-rows val): not held out")
    for needed in (work / "eval" / "eval.json", work / "data" / "val.parquet"):
        if not needed.is_file():
            raise ValEvalError(f"{path}: its run folder has no {needed}")
    return result


def evaluate(path: Path, again: bool = False) -> bool:
    """Evaluate the run of result `path` on its validation rows and record it there; False when already done."""
    result = _load(path)
    work = run_folder(result)
    out = work / VAL_FOLDER / "eval.json"
    if out.is_file() and not again:
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    threads = str(result["settings"]["args"].get("threads") or 1)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
    queryrl = str(Path(sys.executable).parent / "queryrl")
    timing = run_measured(VAL_FOLDER, eval_command(result, queryrl), work / "logs" / f"{VAL_FOLDER}.log", env)
    evaluated = json.loads(out.read_text(encoding="utf-8"))
    result["val_eval"] = system_summary(evaluated["systems"])
    result["val_comparisons"] = evaluated.get("comparisons")
    result.setdefault("turn_rows", {})["val"] = compact(work / VAL_FOLDER / "eval_samples.jsonl")  # turn_rows.py
    result.setdefault("phases", {})[VAL_FOLDER] = timing | {"machine": machine()}
    write_json(path, result)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+", help="benchmarks/real_model.py result JSONs")
    parser.add_argument("--again", action="store_true", help="evaluate runs that already have eval_val/ again")
    args = parser.parse_args(argv)
    try:
        for path in args.results:
            _load(path)  # every result checked before the first eval
        for path in args.results:
            done = evaluate(path, args.again)
            print(f"{path}: {'evaluated on its validation rows' if done else 'already evaluated (--again redoes it)'}")
    except ValEvalError as exc:
        print(f"val_eval: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
