"""queryrl.atomic: the target is the old content or the complete new one, and no temporary is left behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from queryrl.atomic import atomic_dir, atomic_path, atomic_write_bytes, atomic_write_text


class Boom(Exception):
    """What the writers below raise halfway."""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _write_half_then_fail(tmp: Path) -> None:
    """A writer that dies after writing part of its output to `tmp` (a file, or a file inside a folder)."""
    (tmp / "weights.bin" if tmp.is_dir() else tmp).write_bytes(b"half a li")
    raise Boom


def test_write_text_and_bytes_replace_the_file_and_leave_only_it(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "report.json"  # the parent folder is created
    atomic_write_text(target, "第一\n")
    assert target.read_text(encoding="utf-8") == "第一\n"
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert os.listdir(target.parent) == ["report.json"]


def test_a_writer_that_raises_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "metrics.jsonl"
    target.write_text("old\n")
    with pytest.raises(Boom), atomic_path(target) as tmp:
        _write_half_then_fail(tmp)
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["metrics.jsonl"]


def test_the_temporary_is_a_hidden_sibling_ending_in_tmp(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "metrics.jsonl") as tmp:
        assert tmp.parent == tmp_path
        assert tmp.name.startswith(".metrics.jsonl.")
        assert tmp.name.endswith(".tmp")
        assert tmp.is_file()


def test_a_writer_that_raises_creates_no_file(tmp_path: Path) -> None:
    with pytest.raises(Boom), atomic_path(tmp_path / "new.png"):
        raise Boom
    assert os.listdir(tmp_path) == []


def test_each_write_gets_its_own_temporary_name(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "a.txt") as first, atomic_path(tmp_path / "a.txt") as second:
        assert first != second
        first.write_text("first")
        second.write_text("second")
    assert (tmp_path / "a.txt").read_text() == "first"  # the outer block ends last and wins
    assert os.listdir(tmp_path) == ["a.txt"]


def test_file_permissions_follow_the_umask_unless_a_mode_is_given(tmp_path: Path) -> None:
    old_umask = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "plain.txt", "x")
        (tmp_path / "by_open.txt").write_text("x")
        atomic_write_text(tmp_path / "secret.txt", "x", mode=0o600)
        atomic_write_text(tmp_path / "wide.txt", "x", mode=0o644)  # exactly the mode, the umask does not cut it
    finally:
        os.umask(old_umask)
    assert _mode(tmp_path / "plain.txt") == _mode(tmp_path / "by_open.txt") == 0o640
    assert _mode(tmp_path / "secret.txt") == 0o600
    assert _mode(tmp_path / "wide.txt") == 0o644


def test_atomic_dir_renames_the_complete_folder(tmp_path: Path) -> None:
    out = tmp_path / "models" / "tiny"
    with atomic_dir(out) as tmp:
        assert not out.exists()
        (tmp / "config.json").write_text("{}")
    assert os.listdir(out) == ["config.json"]
    assert os.listdir(out.parent) == ["tiny"]


def test_atomic_dir_that_raises_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(Boom), atomic_dir(tmp_path / "model") as tmp:
        _write_half_then_fail(tmp)
    assert os.listdir(tmp_path) == []


def test_atomic_dir_does_not_replace_a_folder_unless_asked(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("old")
    with pytest.raises(OSError, match=r"not empty|exists"), atomic_dir(out) as tmp:
        (tmp / "config.json").write_text("new")
    assert (out / "config.json").read_text() == "old"
    assert os.listdir(tmp_path) == ["model"]


def test_atomic_dir_replace_swaps_the_old_folder_out(tmp_path: Path) -> None:
    out = tmp_path / "sft"
    out.mkdir()
    (out / "stale.bin").write_bytes(b"old")
    with atomic_dir(out, replace=True) as tmp:
        (tmp / "config.json").write_text("new")
        assert (out / "stale.bin").is_file()  # the old folder stays readable until the new one is complete
    assert os.listdir(out) == ["config.json"]
    assert os.listdir(tmp_path) == ["sft"]


def test_atomic_dir_replace_that_raises_keeps_the_old_folder(tmp_path: Path) -> None:
    out = tmp_path / "sft"
    out.mkdir()
    (out / "config.json").write_text("old")
    with pytest.raises(Boom), atomic_dir(out, replace=True):
        raise Boom
    assert (out / "config.json").read_text() == "old"
    assert os.listdir(tmp_path) == ["sft"]


def test_atomic_dir_mode(tmp_path: Path) -> None:
    old_umask = os.umask(0o077)
    try:
        with atomic_dir(tmp_path / "shared", mode=0o755):
            pass
        with atomic_dir(tmp_path / "plain"):
            pass
    finally:
        os.umask(old_umask)
    assert _mode(tmp_path / "shared") == 0o755
    assert _mode(tmp_path / "plain") == 0o700


def test_readable_as_umask_widens_private_files_to_what_the_umask_allows(tmp_path: Path) -> None:
    from queryrl.atomic import readable_as_umask

    (tmp_path / "sub").mkdir()
    private, secret_dir_file = tmp_path / "model.safetensors", tmp_path / "sub" / "w.bin"
    for f in (private, secret_dir_file):
        f.write_bytes(b"x")
        f.chmod(0o600)  # as safetensors writes it
    old = os.umask(0o027)
    try:
        readable_as_umask(tmp_path)
    finally:
        os.umask(old)
    assert private.stat().st_mode & 0o777 == 0o640  # group-readable: the umask allows it, others not
    assert secret_dir_file.stat().st_mode & 0o777 == 0o640


def test_a_saved_model_folder_is_readable_by_others(tmp_path: Path, tiny_bundle: Any) -> None:
    from queryrl.trainer.checkpoint import save_model

    old = os.umask(0o022)
    try:
        save_model(tiny_bundle.model, tmp_path / "m", tiny_bundle.tokenizer)
    finally:
        os.umask(old)
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "m").iterdir()}
    assert modes["model.safetensors"] == 0o644, modes  # safetensors alone writes 0600
