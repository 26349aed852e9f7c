"""Which checkpoint ``queryrl export`` exports when given a run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from queryrl.trainer.export import resolve_checkpoint


def _checkpoint(root: Path, step: int) -> Path:
    folder = root / "checkpoints" / f"step_{step}"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text("{}")
    return folder


def test_a_checkpoint_folder_is_taken_as_given(tmp_path: Path) -> None:
    first = _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 10)
    assert resolve_checkpoint(first) == first


def test_a_run_folder_or_its_checkpoints_give_the_latest_step(tmp_path: Path) -> None:
    for step in (2, 10, 9):  # numeric order, not text order: step_10 is the latest
        _checkpoint(tmp_path, step)
    (tmp_path / "checkpoints" / ".tmp-step_11").mkdir()  # a checkpoint being written is not one
    assert resolve_checkpoint(tmp_path).name == "step_10"
    assert resolve_checkpoint(tmp_path / "checkpoints").name == "step_10"


def test_a_folder_without_checkpoints_is_named_in_the_error(tmp_path: Path) -> None:
    (tmp_path / "sft").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no state\.json"):
        resolve_checkpoint(tmp_path / "sft")
