"""Run a grid of ``make bench-real`` runs and read it with ``seed_grid.py``: one command for a whole grid.

A lever counts when it moves the pooled grid (several split seeds x several GRPO seeds), not one run
(``experiments/logs/real_model.md``). This runs the grid's cells, a few at a time, and then reads them:

    python benchmarks/run_grid.py defaults --splits 0 1 2 --grpo-seeds 7 8 9 --val
    python benchmarks/run_grid.py folds --folds 10 --grpo-seeds 7 --val
    python benchmarks/run_grid.py temp125 --splits 0 1 2 --grpo-seeds 7 8 9 --warmups-from defaults --val \\
        -- rollout.temperature=1.25

A cell is one bench run: a split (``--seed S``, or fold K of ``--folds N`` with ``--fold-seed``) and a GRPO seed
(``trainer.seed``). Per split, the first GRPO seed's cell runs the whole bench (warm-up data, SFT, GRPO, evals) and the
split's other GRPO seeds start GRPO from its ``warmup`` folder (``--warmup-model``), so a split's GRPO seeds share one
warm-up. With ``--warmups-from BASE`` every cell starts from the grid BASE's warm-ups and the summary adds the grid
minus BASE's (``seed_grid.py --against``): a lever measured from the same warm-ups. A lever that changes the warm-up
itself from BASE's (``--warmup-rounds 2``) adds ``--own-warmups``: a split's first GRPO seed builds it from BASE's
warm-up and the split's other seeds start from that cell's. Everything after ``--`` goes to
the bench (its options, then ``key=value`` overrides; ``trainer.seed`` is the grid's).

Each cell runs ``benchmarks/real_model.py --threads 1 --fp32-check 0 --no-zero-shot`` in its own process with one
thread (``OMP_NUM_THREADS=1``), ``--jobs`` at a time (default 2, one a core of a 2-core machine), its work folder
``runs/grid/NAME/CELL``, its console ``runs/grid/NAME/CELL.log`` and its result
``benchmarks/results/grid_NAME_CELL.json`` (``--results-dir``); with ``--val`` then ``benchmarks/val_eval.py`` on it.
A cell whose result is already there is not run again, so a grid stopped halfway goes on where it was. A failed cell
is reported with its log, the cells that need its warm-up are not run, the others go on, and the command exits 1.
``touch runs/grid/NAME/STOP`` starts no more cells and lets the running ones finish (the next call goes on).

What it cost: ``runs/grid/NAME/run_grid.json`` (written after every cell) holds each cell's command, status, wall
time and commit (a cell an earlier call finished keeps what that call recorded, and so does one this call does not
list), whether the tree had changes, and the machine. At the end the grid summary (``seed_grid.py``'s
JSON, rows ``both`` with ``--val`` else ``test``) goes to ``--results-dir``'s ``seed_grid_NAME.json`` with that record
under ``cost`` (``seed_grid_NAME_folds0_3.json`` for ``--fold-list 0 3``: a grid name reused for other folds does not
write over the first call's summary). Run the grid from a checkout that does not change while it runs (a ``git
worktree`` at a commit): each cell starts Python anew and reads the code as it is then.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, machine, python_exe, write_json
from seed_grid import BOOTSTRAP, GridError, _load, grid_summary

BENCH = REPO / "benchmarks" / "real_model.py"
VAL_EVAL = REPO / "benchmarks" / "val_eval.py"
DEFAULT_MODEL = REPO / "runs" / "models" / "gemma3-270m"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
POLL_S = 2.0


class GridSetupError(ValueError):
    """A grid that cannot be run as asked: one line naming what (exit 2)."""


@dataclass
class Cell:
    """One bench run of the grid: its name, split arguments, GRPO seed and the cell whose warm-up it starts from."""

    name: str
    split_args: list[str]
    grpo_seed: int
    work: Path
    result: Path
    log: Path
    warmup_from: Path | None = None  # a warm-up folder to start GRPO from (None: the cell trains its own)
    after: str | None = None  # the cell that writes that warm-up, when it is one of this grid's
    commands: list[list[str]] = field(default_factory=list)


def split_cells(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """The grid's splits: (label, the bench's split options)."""
    if args.splits is not None:
        return [(f"s{s}", ["--seed", str(s)]) for s in args.splits]
    folds = args.fold_list if args.fold_list is not None else list(range(args.folds))
    bad = [k for k in folds if not 0 <= k < args.folds]
    if bad:
        raise GridSetupError(f"--fold-list {bad} is outside 0 to --folds - 1 ({args.folds - 1})")
    tag = f"s{args.fold_seed}" if args.fold_seed else ""
    return [
        (f"fold{k}of{args.folds}{tag}", ["--seed", str(args.fold_seed), "--fold", str(k), "--folds", str(args.folds)])
        for k in folds
    ]


def plan(args: argparse.Namespace, bench_args: list[str]) -> list[Cell]:
    """Every cell of the grid, in the order they may start, with its commands."""
    grid_dir = args.runs / args.name
    base_dir = args.runs / args.warmups_from if args.warmups_from else None
    cells: list[Cell] = []
    for label, split_args in split_cells(args):
        first: Cell | None = None
        for g in args.grpo_seeds:
            name = f"{label}_g{g}"
            cell = Cell(
                name=name,
                split_args=split_args,
                grpo_seed=g,
                work=grid_dir / name,
                result=args.results_dir / f"grid_{args.name}_{name}.json",
                log=grid_dir / f"{name}.log",
            )
            if base_dir is not None and (first is None or not args.own_warmups):
                cell.warmup_from = base_dir / f"{label}_g{args.grpo_seeds[0]}" / "warmup"
            elif first is not None:
                cell.warmup_from, cell.after = first.work / "warmup", first.name
            first = first or cell
            cmd = [python_exe(), str(BENCH), "--model", str(args.model), *split_args, "--work", str(cell.work)]
            cmd += ["--out", str(cell.result), "--threads", "1", "--fp32-check", "0", "--no-zero-shot"]
            if cell.warmup_from is not None:
                cmd += ["--warmup-model", str(cell.warmup_from)]
            cell.commands.append([*cmd, *bench_args, f"trainer.seed={g}"])
            if args.val:
                cell.commands.append([python_exe(), str(VAL_EVAL), str(cell.result)])
            cells.append(cell)
    # the cells that train a warm-up first, so the GRPO-only cells waiting on them can start as early as possible
    return sorted(cells, key=lambda c: c.after is not None)


def _first_step(cell: Cell) -> int:
    """Where the cell starts: 0 without a finished result, 1 (the validation eval) for a result without one when the
    cell has that step, ``len(cell.commands)`` when it is done."""
    try:
        data = json.loads(cell.result.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    if "final_eval" not in data:
        return 0
    return 1 if len(cell.commands) > 1 and "val_eval" not in data else len(cell.commands)


def _git(*argv: str) -> str:
    try:
        return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _earlier_cells(record_path: Path) -> dict[str, dict[str, Any]]:
    """The cells an earlier call on this grid recorded (none when there is no readable record)."""
    try:
        cells = json.loads(record_path.read_text(encoding="utf-8")).get("cells", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return cells if isinstance(cells, dict) else {}


def run_cells(cells: list[Cell], jobs: int, record: dict[str, Any], record_path: Path) -> list[str]:
    """Run the cells not done yet, `jobs` at a time, each one's commands one after another; returns the failed
    cells' names (a cell waiting on a failed one's warm-up is not run and counts as failed). A file ``STOP`` beside
    `record_path` (``touch runs/grid/NAME/STOP``) starts no more cells, those running finish; the next call removes
    it."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    status: dict[str, str] = {}
    earlier = _earlier_cells(record_path)
    names = {cell.name for cell in cells}
    # an earlier call's cells that this call does not list (a narrower --fold-list or --grpo-seeds) stay recorded
    entries: dict[str, dict[str, Any]] = {k: v for k, v in earlier.items() if k not in names}
    for cell in cells:
        entries[cell.name] = {"commands": cell.commands, "log": str(cell.log), "result": str(cell.result)}
        if _first_step(cell) == len(cell.commands):  # what an earlier call recorded of it stays (its wall time)
            entries[cell.name] = earlier.get(cell.name, entries[cell.name]) | {"status": "done before"}
            status[cell.name] = "done before"
    record["cells"] = entries
    pending = [c for c in cells if c.name not in status]
    stop = record_path.parent / "STOP"
    stop.unlink(missing_ok=True)
    running: dict[str, tuple[Cell, subprocess.Popen[bytes], int, float, Any]] = {}

    def save() -> None:
        write_json(record_path, record)

    def start(cell: Cell, step: int, began: float) -> None:
        cell.log.parent.mkdir(parents=True, exist_ok=True)
        log = open(cell.log, "ab")  # noqa: SIM115 (closed when the process ends)
        log.write(f"$ {' '.join(cell.commands[step])}\n".encode())
        log.flush()
        proc = subprocess.Popen(cell.commands[step], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        running[cell.name] = (cell, proc, step, began, log)
        entries[cell.name] |= {"status": "running", "commit": record.get("commit", "")}
        print(f"run_grid: {cell.name} started ({cell.log})", flush=True)

    save()
    try:
        while pending or running:
            if pending and stop.exists():
                for cell in pending:
                    status[cell.name] = entries[cell.name]["status"] = f"not started: {stop} was there"
                pending.clear()
            for cell in list(pending):
                if cell.after is not None and status.get(cell.after) not in ("done", "done before"):
                    if status.get(cell.after) == "failed":
                        pending.remove(cell)
                        status[cell.name] = entries[cell.name]["status"] = f"not run: {cell.after} failed"
                    continue
                if len(running) >= jobs:
                    break
                pending.remove(cell)
                start(cell, _first_step(cell), time.monotonic())
            save()
            time.sleep(POLL_S if running else 0)
            for name, (cell, proc, step, began, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                log.close()
                if proc.returncode == 0 and step + 1 < len(cell.commands):
                    start(cell, step + 1, began)
                    continue
                ok = proc.returncode == 0
                status[name] = "done" if ok else "failed"
                entries[name] |= {"status": status[name], "wall_s": round(time.monotonic() - began, 1)}
                if not ok:
                    entries[name]["exit"] = proc.returncode
                print(f"run_grid: {name} {status[name]} ({entries[name]['wall_s']} s; log {cell.log})", flush=True)
    finally:
        for cell, proc, *_ in running.values():  # interrupted: stop what runs, the finished cells stay
            proc.terminate()
            entries[cell.name]["status"] = "stopped"
        save()
    return [n for n, s in status.items() if s not in ("done", "done before")]


def summary(cells: list[Cell], against: list[Path], val: bool) -> dict[str, Any]:
    """``seed_grid.py``'s summary of the grid's results (rows ``both`` with the validation evals, else ``test``)."""
    rows_from = ("test", "val") if val else ("test",)
    runs = [_load(c.result, rows_from) for c in cells]
    baseline = [_load(p, rows_from) for p in against]
    return {"rows": "both" if val else "test", "bootstrap_replicates": BOOTSTRAP["n_boot"]} | grid_summary(
        runs, baseline
    )


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The grid's own options, and the bench's arguments after ``--``."""
    bench_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="the grid's name: its folder under --runs and its result files' prefix")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--splits", type=int, nargs="+", help="split seeds (the bench's --seed)")
    which.add_argument("--folds", type=int, help="cross-validation: fold K of this many for every K (or --fold-list)")
    parser.add_argument("--fold-list", type=int, nargs="+", default=None, help="only these folds")
    parser.add_argument("--fold-seed", type=int, default=0, help="the seed that shuffles the conversations into folds")
    parser.add_argument("--grpo-seeds", type=int, nargs="+", default=[7], help="GRPO seeds per split (default 7)")
    parser.add_argument("--warmups-from", default=None, help="start every cell from the grid of this name's warm-ups")
    parser.add_argument(
        "--own-warmups",
        action="store_true",
        help="with --warmups-from, for a lever that changes the warm-up (e.g. --warmup-rounds 2): a split's first GRPO "
        "seed builds its warm-up from BASE's and the split's other seeds start from that one",
    )
    parser.add_argument("--val", action="store_true", help="evaluate every cell on its validation conversations too")
    parser.add_argument("--jobs", type=int, default=2, help="cells at a time (default 2)")
    parser.add_argument("--model", type=Path, default=Path(os.environ.get("MODEL") or DEFAULT_MODEL))
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "grid", help="where the grids' work folders go")
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS, help="the cells' results and the summary (default %(default)s)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the cells' commands and stop")
    return parser.parse_args(own), bench_args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, bench_args = parse(argv)
    try:
        if not NAME_RE.fullmatch(args.name) or (args.warmups_from and not NAME_RE.fullmatch(args.warmups_from)):
            raise GridSetupError(f"a grid name is letters, digits, '_', '.' and '-', got {args.name!r}")
        if args.folds is not None and args.folds < 3:
            raise GridSetupError(f"--folds must be 3 or more, got {args.folds}")
        if args.own_warmups and not args.warmups_from:
            raise GridSetupError("--own-warmups builds on the warm-ups of --warmups-from BASE; name BASE")
        if args.jobs < 1 or len(set(args.grpo_seeds)) != len(args.grpo_seeds):
            raise GridSetupError("--jobs must be at least 1 and --grpo-seeds must not repeat a seed")
        if any(a.startswith("trainer.seed=") for a in bench_args):
            raise GridSetupError("trainer.seed is the grid's (--grpo-seeds), not an override after --")
        val_grpo = "--grpo-rows=val" in bench_args or ("--grpo-rows", "val") in itertools.pairwise(bench_args)
        if args.val and val_grpo:
            raise GridSetupError("--val evaluates the validation conversations, which --grpo-rows val trains GRPO on")
        cells = plan(args, bench_args)
        if args.dry_run:
            for cell in cells:
                print("\n".join(" ".join(c) for c in cell.commands))
            return 0
        if not (args.model / "config.json").is_file():
            raise GridSetupError(f"--model must be a model folder with config.json (make real-models): {args.model}")
        for cell in cells:  # --warmups-from: every warm-up is there before anything starts
            if cell.after is None and cell.warmup_from is not None and not (cell.warmup_from / "config.json").is_file():
                raise GridSetupError(f"--warmups-from {args.warmups_from}: no warm-up model at {cell.warmup_from}")
    except GridSetupError as exc:
        print(f"run_grid: {exc}", file=sys.stderr)
        return 2
    grid_dir = args.runs / args.name
    record: dict[str, Any] = {
        "name": args.name,
        "argv": argv,
        "commit": _git("rev-parse", "HEAD"),
        "tree_changed": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "jobs": args.jobs,
        "machine": machine(),
    }
    began = time.monotonic()
    failed = run_cells(cells, args.jobs, record, grid_dir / "run_grid.json")
    record["wall_s"] = round(time.monotonic() - began, 1)
    write_json(grid_dir / "run_grid.json", record)
    if failed:
        print(f"run_grid: {len(failed)} cell(s) not done: {', '.join(failed)}; their logs under {grid_dir}")
        return 1
    for cell in cells:  # what each cell's runs measured themselves (a cell done before this call has no wall_s here)
        result = json.loads(cell.result.read_text(encoding="utf-8"))
        record["cells"][cell.name]["bench_wall_s"] = result.get("wall_time_s")
        record["cells"][cell.name]["val_eval_wall_s"] = result.get("phases", {}).get("eval_val", {}).get("wall_s")
    against = [args.results_dir / f"grid_{args.warmups_from}_{c.name}.json" for c in cells] if args.warmups_from else []
    against = [p for p in against if p.is_file()]
    try:
        out = summary(cells, against, args.val) | {"cost": record}
    except GridError as exc:
        print(f"run_grid: {exc}", file=sys.stderr)
        return 2
    target = summary_path(args)
    write_json(target, out)
    print(f"run_grid: {len(cells)} cells in {record['wall_s']} s; the grid: {target}")
    return 0


def summary_path(args: argparse.Namespace) -> Path:
    """Where the grid summary goes: ``seed_grid_NAME.json`` for every fold, ``seed_grid_NAME_foldsA_B.json`` for
    ``--fold-list A B``."""
    folds = "" if args.fold_list is None else "_folds" + "_".join(str(k) for k in args.fold_list)
    return args.results_dir / f"seed_grid_{args.name}{folds}.json"


if __name__ == "__main__":
    sys.exit(main())
