"""Tracker backends: jsonl content and resume truncation, TensorBoard, console lines, errors.

wandb and mlflow run for real in ``test_tracking_backends.py``.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from queryrl.tracking import Tracker, as_finite, flatten_config, mlflow_name


def _tracker(run_dir: Path, loggers: list[str], start_step: int = 0, total: int = 10) -> Tracker:
    return Tracker(run_dir, loggers, "proj", "exp", {"a": {"b": 1}}, total_steps=total, start_step=start_step)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_one_record_per_step_with_nan_as_null_and_strings_dropped(tmp_path: Path) -> None:
    with _tracker(tmp_path, ["jsonl"]) as tracker:
        tracker.log({"critic/score/mean": 0.5, "actor/pg_loss": float("nan")}, step=1)
        # Written and flushed before close: a crash loses nothing already logged.
        assert _read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "critic/score/mean": 0.5, "actor/pg_loss": None}]
        tracker.log({"critic/score/mean": torch.tensor(0.25), "note": "text", "n": 3, "inf": math.inf}, step=2)
    records = _read_jsonl(tmp_path / "metrics.jsonl")
    assert records[1] == {"step": 2, "critic/score/mean": 0.25, "n": 3.0, "inf": None}


def test_jsonl_resume_drops_steps_after_the_checkpoint(tmp_path: Path) -> None:
    with _tracker(tmp_path, ["jsonl"]) as tracker:
        for step in range(1, 6):
            tracker.log({"x": float(step)}, step=step)
    # The crashed run reached step 5; the last checkpoint was step 3, so steps 4-5 are redone.
    with _tracker(tmp_path, ["jsonl"], start_step=3) as tracker:
        tracker.log({"x": 40.0}, step=4)
    records = _read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["x"]) for r in records] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    assert not list(tmp_path.glob("*.tmp"))


def test_jsonl_resume_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
    with pytest.warns(UserWarning, match="line 2"), _tracker(tmp_path, ["jsonl"], start_step=1):
        pass
    assert _read_jsonl(path) == [{"step": 1, "x": 1.0}]


def test_tensorboard_scalars_read_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with _tracker(tmp_path, ["tensorboard"]) as tracker:
        tracker.log({"critic/score/mean": 0.5, "bad": float("nan"), "text": "x"}, step=1)  # type: ignore[dict-item]
        tracker.log({"critic/score/mean": 0.75}, step=2)
    event_files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["critic/score/mean"]  # NaN and text skipped
    events = acc.Scalars("critic/score/mean")
    assert [(e.step, e.value) for e in events] == [(1, 0.5), (2, 0.75)]


def test_console_prints_plain_lines_when_not_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with _tracker(tmp_path, ["console"], total=10) as tracker:
        tracker.log({"critic/score/mean": 0.123456, "actor/pg_loss": -0.5, "other/metric": 9.0}, step=1)
        tracker.log({"timing_s/step": 2.5}, step=2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("step 1/10 |")
    assert "score=0.1235" in lines[0]
    assert "pg_loss=-0.5" in lines[0]
    assert "other" not in lines[0]  # only the console keys
    assert "eta" in lines[0]
    assert lines[1].startswith("step 2/10 |")
    assert lines[1].endswith("step_s=2.5")
    assert "\x1b[" not in lines[0]  # plain text, no ANSI escapes


def test_console_without_a_terminal_prints_every_n_steps_plus_first_and_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 100 steps: a line every 100 // 20 = 5 steps; logged every 3 steps (trainer.log_every=3), a line is printed
    # once 5 steps have passed since the last one; the first and the last step logged always print.
    assert not sys.stdout.isatty()
    with _tracker(tmp_path, ["console"], total=100) as tracker:
        for step in [*range(1, 100, 3), 100]:
            tracker.log({"critic/score/mean": step / 100}, step=step)
    steps = [int(line.split()[1].split("/")[0]) for line in capsys.readouterr().out.splitlines()]
    assert steps[:4] == [1, 7, 13, 19]
    assert steps[-2:] == [97, 100]
    assert all(b - a >= 5 for a, b in itertools.pairwise(steps[:-1]))
    assert len(steps) == 18


def test_console_resumed_run_prints_its_first_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with _tracker(tmp_path, ["console"], start_step=40, total=100) as tracker:
        for step in range(41, 47):
            tracker.log({"x": 1.0}, step=step)
    assert [line.split(" |")[0] for line in capsys.readouterr().out.splitlines()] == ["step 41/100", "step 46/100"]


def test_unknown_logger_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'nope'.*console, jsonl, mlflow, tensorboard, wandb"):
        _tracker(tmp_path, ["jsonl", "nope"])
    assert not (tmp_path / "metrics.jsonl").exists()  # checked before any backend is opened


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_missing_optional_backend_names_the_package(
    tmp_path: Path, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError, installed or not
    with pytest.raises(ImportError, match=f"pip install {package}"):
        _tracker(tmp_path, ["jsonl", package])


def test_failed_backend_closes_the_ones_already_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError):
        _tracker(tmp_path, ["jsonl", "wandb"])
    # The jsonl file handle was closed: on resume the file can be rewritten and reopened.
    with _tracker(tmp_path, ["jsonl"]) as tracker:
        tracker.log({"x": 1.0}, step=1)
    assert _read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "x": 1.0}]


def test_helpers() -> None:
    assert mlflow_name("val/score@4 (pass)") == "val/score_4 _pass_"
    assert flatten_config({"a": {"b": 1, "c": {"d": "x"}}, "e": [1, 2]}) == {"a.b": 1, "a.c.d": "x", "e": [1, 2]}
    assert as_finite(True) == 1.0
    assert as_finite(torch.tensor([2.0])) == 2.0
    assert as_finite(torch.zeros(2)) is None
    assert as_finite("1.0") is None
    assert as_finite(float("-inf")) is None


def test_tensorboard_resume_hides_steps_after_the_checkpoint(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with _tracker(tmp_path, ["tensorboard"]) as tracker:
        for step in range(1, 6):
            tracker.log({"x": float(step)}, step=step)
    with _tracker(tmp_path, ["tensorboard"], start_step=3) as tracker:
        tracker.log({"x": 40.0}, step=4)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("x")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
