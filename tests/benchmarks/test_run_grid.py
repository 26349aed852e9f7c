"""benchmarks/run_grid.py: the grid's cells and their commands, its refusals, and the scheduler (real processes that
stand in for the bench: the bench itself is an hour a cell)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import run_grid  # benchmarks/run_grid.py (benchmarks/ is on the tests' path: pyproject.toml)


def _plan(tmp_path: Path, *argv: str) -> list[run_grid.Cell]:
    """The cells `argv` plans (work folders and results under tmp_path)."""
    where = ["--runs", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "res")]
    at = argv.index("--") if "--" in argv else len(argv)
    return run_grid.plan(*run_grid.parse([*argv[:at], *where, *argv[at:]]))


def test_a_splits_first_grpo_seed_trains_the_warm_up_the_others_start_from(tmp_path: Path) -> None:
    cells = _plan(tmp_path, "g", "--splits", "0", "1", "--grpo-seeds", "7", "8")
    assert [c.name for c in cells] == ["s0_g7", "s1_g7", "s0_g8", "s1_g8"]  # the warm-ups first
    s0g7, s1g7, s0g8, _ = cells
    assert s0g7.after is None
    assert s0g7.warmup_from is None
    assert "--warmup-model" not in s0g7.commands[0]
    assert s0g8.after == "s0_g7"
    assert s0g8.warmup_from == s0g7.work / "warmup"
    cmd = s0g8.commands[0]
    assert cmd[cmd.index("--warmup-model") + 1] == str(s0g7.work / "warmup")
    assert cmd[cmd.index("--seed") + 1] == "0"
    assert cmd[-1] == "trainer.seed=8"
    assert s1g7.result == tmp_path / "res" / "grid_g_s1_g7.json"
    assert s1g7.work == tmp_path / "runs" / "g" / "s1_g7"
    assert len(s0g7.commands) == 1  # no --val: no validation eval


def test_folds_bench_arguments_and_the_validation_eval(tmp_path: Path) -> None:
    cells = _plan(tmp_path, "f", "--folds", "5", "--fold-list", "3", "--val", "--", "--grpo-steps", "2", "a.b=1")
    (cell,) = cells
    assert cell.name == "fold3of5_g7"
    bench, val = cell.commands
    assert bench[bench.index("--fold") + 1 : bench.index("--fold") + 4] == ["3", "--folds", "5"]
    assert bench[-4:] == ["--grpo-steps", "2", "a.b=1", "trainer.seed=7"]  # the bench's args, then the grid's seed
    assert val[-2:] == [str(run_grid.VAL_EVAL), str(cell.result)]


def test_warmups_from_another_grid_start_every_cell_from_its_warm_ups(tmp_path: Path) -> None:
    cells = _plan(tmp_path, "lever", "--splits", "2", "--grpo-seeds", "7", "8", "--warmups-from", "base")
    assert [c.warmup_from for c in cells] == [tmp_path / "runs" / "base" / "s2_g7" / "warmup"] * 2
    assert all(c.after is None for c in cells)


def test_own_warmups_build_a_splits_warm_up_from_the_base_grids_and_share_it(tmp_path: Path) -> None:
    argv = ["lever", "--splits", "2", "--grpo-seeds", "7", "8", "--warmups-from", "base", "--own-warmups"]
    first, second = _plan(tmp_path, *argv, "--", "--warmup-rounds", "2")
    assert first.warmup_from == tmp_path / "runs" / "base" / "s2_g7" / "warmup"
    assert first.after is None
    assert (second.warmup_from, second.after) == (first.work / "warmup", first.name)
    assert all(c.commands[0][-3:-1] == ["--warmup-rounds", "2"] for c in (first, second))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["g", "--splits", "0", "--", "trainer.seed=3"], "trainer.seed is the grid's"),
        (["g", "--folds", "10", "--fold-list", "10"], "--fold-list [10] is outside 0 to --folds - 1 (9)"),
        (["g", "--folds", "2"], "--folds must be 3 or more"),
        (["../g", "--splits", "0"], "a grid name is letters"),
        (["g", "--splits", "0", "--grpo-seeds", "7", "7"], "must not repeat a seed"),
        (["g", "--splits", "0", "--own-warmups"], "--own-warmups builds on the warm-ups of --warmups-from BASE"),
        (["g", "--splits", "0", "--model", "nowhere"], "--model must be a model folder with config.json"),
        (["g", "--splits", "0", "--val", "--", "--grpo-rows", "val"], "--val evaluates the validation conversations"),
        (["g", "--splits", "0", "--val", "--", "--grpo-rows=val"], "--val evaluates the validation conversations"),
    ],
)
def test_a_grid_that_cannot_run_is_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_grid.main([*argv[:1], "--runs", str(tmp_path), *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("run_grid: ")
    assert message in err
    assert err.count("\n") == 1
    assert not any(tmp_path.iterdir())  # nothing was started or written


def test_missing_warm_ups_of_the_base_grid_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    argv = ["lever", "--splits", "0", "--warmups-from", "base", "--model", str(model), "--runs", str(tmp_path / "r")]
    assert run_grid.main(argv) == 2
    assert f"no warm-up model at {tmp_path / 'r' / 'base' / 's0_g7' / 'warmup'}" in capsys.readouterr().err


def _stand_in(cell: run_grid.Cell, events: Path, fail: bool = False) -> None:
    """The cell's bench replaced by a process that writes a result (or fails), noting its start and end in `events`."""
    note = f"open({str(events)!r}, 'a').write(f'{{time.time()}} {{{{}}}} {cell.name}\\n'.format"
    code = (
        f"import json, sys, time; {note}('start')); time.sleep(0.3); {note}('end')); "
        + ("sys.exit(3); " if fail else "")
        + f"json.dump({{'final_eval': {{}}, 'wall_time_s': 0.3}}, open({str(cell.result)!r}, 'w'))"
    )
    cell.commands = [[sys.executable, "-c", code]]


def _most_at_once(events: Path) -> int:
    now = most = 0
    for line in sorted(events.read_text().splitlines(), key=lambda x: float(x.split()[0])):
        now += 1 if line.split()[1] == "start" else -1
        most = max(most, now)
    return most


def test_cells_run_jobs_at_a_time_and_a_failed_warm_up_stops_only_its_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_grid, "POLL_S", 0.05)
    cells = _plan(tmp_path, "g", "--splits", "0", "1", "--grpo-seeds", "7", "8")
    (tmp_path / "res").mkdir()
    events = tmp_path / "events"
    for cell in cells:
        _stand_in(cell, events, fail=cell.name == "s1_g7")
    record: dict[str, object] = {}
    failed = run_grid.run_cells(cells, 2, record, tmp_path / "run_grid.json")
    assert sorted(failed) == ["s1_g7", "s1_g8"]
    assert _most_at_once(events) == 2
    times = {(ln.split()[2], ln.split()[1]): float(ln.split()[0]) for ln in events.read_text().splitlines()}
    assert times["s0_g8", "start"] > times["s0_g7", "end"]  # the GRPO-only cell waited for its warm-up
    saved = json.loads((tmp_path / "run_grid.json").read_text())["cells"]
    assert saved["s0_g7"]["status"] == saved["s0_g8"]["status"] == "done"
    assert saved["s1_g7"]["status"] == "failed"
    assert saved["s1_g7"]["exit"] == 3
    assert saved["s1_g8"]["status"] == "not run: s1_g7 failed"
    assert not (tmp_path / "runs" / "g" / "s1_g8.log").exists()

    for cell in cells:  # again, with the failure mended and one job: only the two cells not done run, in turn
        _stand_in(cell, events)
    events.unlink()
    assert run_grid.run_cells(cells, 1, record, tmp_path / "run_grid.json") == []
    assert _most_at_once(events) == 1
    saved = json.loads((tmp_path / "run_grid.json").read_text())["cells"]
    assert saved["s0_g7"]["wall_s"] > 0.3  # the first call's wall time is kept for a cell it finished
    assert {n: c["status"] for n, c in saved.items()} == {
        "s0_g7": "done before",
        "s1_g7": "done",
        "s0_g8": "done before",
        "s1_g8": "done",
    }

    # a narrower call (one split's seeds, as when a failed cell is run again alone) keeps the other split's record
    assert run_grid.run_cells(cells[:2], 1, record, tmp_path / "run_grid.json") == []
    kept = json.loads((tmp_path / "run_grid.json").read_text())["cells"]
    assert set(kept) == set(saved)
    assert {n: kept[n] for n in saved if n not in {c.name for c in cells[:2]}} == {
        n: saved[n] for n in saved if n not in {c.name for c in cells[:2]}
    }


def test_a_result_without_its_validation_eval_runs_only_that_step_again(tmp_path: Path) -> None:
    (cell,) = _plan(tmp_path, "g", "--splits", "0", "--val")
    assert run_grid._first_step(cell) == 0  # no result yet
    cell.result.parent.mkdir(parents=True)
    cell.result.write_text("{not json")
    assert run_grid._first_step(cell) == 0
    cell.result.write_text(json.dumps({"final_eval": {}}))
    assert run_grid._first_step(cell) == 1  # the bench is done: the validation eval only
    cell.result.write_text(json.dumps({"final_eval": {}, "val_eval": {}}))
    assert run_grid._first_step(cell) == 2  # done
    (plain,) = _plan(tmp_path, "h", "--splits", "0")
    plain.result.write_text(json.dumps({"final_eval": {}}))
    assert run_grid._first_step(plain) == 1  # done: this grid asks for no validation eval


def test_a_stop_file_starts_no_more_cells_and_the_next_call_goes_on(tmp_path: Path) -> None:
    cells = _plan(tmp_path, "g", "--splits", "0", "1")
    (tmp_path / "res").mkdir()
    grid = tmp_path / "runs" / "g"
    events = tmp_path / "events"
    for cell in cells:
        _stand_in(cell, events)
    first = cells[0].commands[0]
    cells[0].commands = [[*first[:2], f"open({str(grid / 'STOP')!r}, 'w'); " + first[2]]]  # stop while running
    assert run_grid.run_cells(cells, 1, {}, grid / "run_grid.json") == ["s1_g7"]
    saved = json.loads((grid / "run_grid.json").read_text())["cells"]
    assert saved["s0_g7"]["status"] == "done"  # the running cell finished
    assert saved["s1_g7"]["status"].startswith("not started: ")
    assert run_grid.run_cells(cells, 1, {}, grid / "run_grid.json") == []  # STOP was removed: it goes on


def test_a_fold_list_names_its_summary_so_a_reused_grid_name_keeps_the_first_summary(tmp_path: Path) -> None:
    """``seed_grid_NAME.json`` for every fold; ``--fold-list 0 3`` writes ``seed_grid_NAME_folds0_3.json`` (a later call
    of the same grid name on other folds once wrote over a committed summary)."""
    res = ["--results-dir", str(tmp_path)]
    every, _ = run_grid.parse(["g", "--folds", "10", *res])
    some, _ = run_grid.parse(["g", "--folds", "10", "--fold-list", "0", "3", *res])
    assert run_grid.summary_path(every) == tmp_path / "seed_grid_g.json"
    assert run_grid.summary_path(some) == tmp_path / "seed_grid_g_folds0_3.json"
    splits, _ = run_grid.parse(["g", "--splits", "0", "1", *res])
    assert run_grid.summary_path(splits) == tmp_path / "seed_grid_g.json"
