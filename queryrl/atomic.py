"""Atomic writes: a reader sees the old file (or folder) or the complete new one, never half of one.

Everything is written under a hidden temporary name beside the target (``.<name>.<random>.tmp``,
in the same folder, so the final rename stays on one file system and is atomic), then renamed
onto it; if the writer raises, the temporary is removed and the target is left as it was.

- :func:`atomic_write_text`, :func:`atomic_write_bytes`: the whole content at once;
- :func:`atomic_path`: a temporary file path for writers that want a path (``torch.save``,
  parquet, matplotlib's ``savefig``);
- :func:`atomic_dir`: a temporary folder for writers that fill one (``save_pretrained``).

The parent folder is created if missing. New files and folders get the permissions an ordinary
``open``/``mkdir`` gives them (the process umask applies) unless a `mode` is given. Nothing is
fsynced: a crash may lose the new content but never leaves a torn target. Checkpoints, which must
survive a crash, have their own durable writes (:mod:`queryrl.trainer.checkpoint`).

Only the standard library is imported here: every layer may use it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _temp_name(path: Path) -> Path:
    """A fresh hidden name beside `path`: ``.<name>.<32 hex digits>.tmp``."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[Path]:
    """A temporary file beside `path` to write; renamed onto `path` when the block ends without error.

    The temporary file exists (empty) when the block starts; the writer may overwrite it. Its name
    ends in ``.tmp``, so a writer that picks its format from the extension (matplotlib) must be
    told the format.

    Args:
        path: the file to write (replaced if it exists).
        mode: the new file's permission bits (e.g. ``0o600`` for a secret); None = what ``open`` gives.

    Yields:
        The temporary path.

    Raises:
        Whatever the block raises (the temporary is removed and `path` left untouched), or an
        ``OSError`` from creating the temporary file or renaming it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
    finally:
        os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """Write `data` to `path` atomically (see the module docstring); `mode` as in :func:`atomic_path`."""
    with atomic_path(path, mode=mode) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(
    path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", mode: int | None = None
) -> None:
    """Write `text` to `path` atomically (see the module docstring); `mode` as in :func:`atomic_path`."""
    with atomic_path(path, mode=mode) as tmp:
        tmp.write_text(text, encoding=encoding)


@contextmanager
def atomic_dir(path: str | os.PathLike[str], *, mode: int | None = None, replace: bool = False) -> Iterator[Path]:
    """A temporary folder beside `path` to fill; renamed to `path` when the block ends without error.

    The temporary folder is removed in every case (after a successful rename nothing is left of it).

    Args:
        path: the folder to write.
        mode: the folder's permission bits, set exactly; None = what ``mkdir`` gives (umask applies).
        replace: an existing `path` is replaced: it is first renamed aside, then the new folder takes
            its name, then the old one is deleted (if the second rename fails, the old folder is put
            back). False: the rename fails with an ``OSError`` if `path` exists and is not empty.

    Yields:
        The temporary folder.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path)
    os.mkdir(tmp, 0o777 if mode is None else mode)
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        yield tmp
        if replace and path.exists():
            _swap_into_place(tmp, path)
        else:
            tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Rename folder `tmp` to the existing `path`: the old `path` aside first, deleted only afterwards."""
    old = _temp_name(path)
    path.rename(old)
    try:
        tmp.rename(path)
    except BaseException:
        old.rename(path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def readable_as_umask(folder: str | os.PathLike[str]) -> None:
    """Give the files under `folder` the permissions a new file gets (``0o666 & ~umask``, e.g. 0644).

    For folders written by libraries that create private files: safetensors writes ``model.safetensors``
    as 0600, so a model folder saved on a shared server could not be read by a teammate. Only files more
    private than that are widened; nothing becomes more open than the umask allows.
    """
    mask = os.umask(0)
    os.umask(mask)
    wanted = 0o666 & ~mask
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            mode = os.stat(path).st_mode & 0o777
            if mode | wanted != mode:
                os.chmod(path, mode | wanted)
