"""A checkpoint's ``manifest.json``: the files it vouches for, and the check that a folder holds exactly those.

``{"version": 1, "files": {"<path relative to the checkpoint>": {"size": <bytes>, "sha256": "<64 hex>"}}}``,
written last (:func:`write_manifest`). :func:`verify` trusts only what the manifest lists, and says in one
line what is wrong with anything else:

- a manifest that is not JSON, or JSON of another shape (``files`` not a mapping, an entry without an integer
  ``size`` or a 64-hex-digit ``sha256``, a name outside the folder, one of ``state.json``, ``optim.pt`` or
  ``rng.pt`` not listed);
- a listed file missing, of another size, or of another sha256;
- a file in the folder that the manifest does not list (e.g. an older step's weights copied in under
  another name: loaded, they would override the listed ones).

:func:`~queryrl.trainer.checkpoint.select_checkpoint` turns each into "damaged; trying an older one".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST = "manifest.json"
REQUIRED = ("state.json", "optim.pt", "rng.pt")  # what every checkpoint holds besides the weights
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHOWN = 80  # characters of a name or value quoted from a manifest


def files_of(folder: Path) -> Iterator[Path]:
    """Every file under `folder` but the manifest, sorted."""
    return (p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST)


def sha256_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def data_fingerprints(paths: list[str]) -> dict[str, dict[str, Any]]:
    """Each data file's size and sha256, by path as given (what a checkpoint trained on, ``state.json``'s
    ``data``): a resume whose files differ is refused (:mod:`queryrl.trainer.run_folder`)."""
    return {p: {"size": Path(p).stat().st_size, "sha256": sha256_of(Path(p))} for p in paths if Path(p).is_file()}


def write_manifest(folder: Path) -> None:
    """``folder/manifest.json``: each file's size and sha256, by path relative to `folder`."""
    files = {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256_of(p)} for p in files_of(folder)
    }
    with (folder / MANIFEST).open("w", encoding="utf-8") as f:
        json.dump({"version": 1, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _shown(value: Any) -> str:
    text = repr(value)  # repr: a name with a newline stays on one line
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _inside(name: str) -> bool:
    """Whether `name` is a relative path that stays inside the checkpoint folder."""
    path = PurePosixPath(name)
    return bool(name) and "\\" not in name and "\x00" not in name and not path.is_absolute() and ".." not in path.parts


def listed_files(folder: Path) -> dict[str, dict[str, Any]] | str:
    """The manifest's ``files`` (name -> {size, sha256}) once its shape is checked, or what is wrong with it."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError and UnicodeDecodeError
        return f"{MANIFEST} is unreadable ({type(err).__name__})"
    if not isinstance(data, dict) or data.get("version") != 1:
        return f'{MANIFEST} is not a version-1 manifest (an object with "version": 1 and "files")'
    files = data.get("files")
    if not isinstance(files, dict):
        return f'{MANIFEST}: "files" is {type(files).__name__}, not an object of file name -> size and sha256'
    for name, entry in files.items():
        if not _inside(name) or name == MANIFEST:
            return f"{MANIFEST} lists {_shown(name)}, which is not a file name inside the checkpoint"
        size = entry.get("size") if isinstance(entry, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f'{MANIFEST}: the entry of {_shown(name)} has no byte count "size" (it holds {_shown(entry)})'
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            held = _shown(entry)
            return f'{MANIFEST}: the entry of {_shown(name)} has no "sha256" of 64 hex digits (it holds {held})'
    for name in REQUIRED:
        if name not in files:
            return f"{MANIFEST} does not list {name}"
    return files


LEGACY_HINT = (
    f"no {MANIFEST}, so its files cannot be checked (every checkpoint of this queryrl has one; one written by an "
    "older queryrl does not: trainer.resume_legacy=true accepts it unhashed)"
)


def _legacy_problem(folder: Path) -> str | None:
    """Without a manifest: state.json, optim.pt, rng.pt and the weights must exist and not be empty."""
    weights = list(folder.glob("actor/*.safetensors"))
    for path in [folder / name for name in REQUIRED] + (weights or [folder / "actor" / "*.safetensors"]):
        if not path.is_file():
            return f"{path.relative_to(folder)} is missing"
        if path.stat().st_size == 0:
            return f"{path.relative_to(folder)} is empty (0 bytes)"
    return None


def verify(folder: Path, allow_unhashed: bool = False) -> str | None:
    """What is wrong with checkpoint `folder` (None: intact), in one line.

    With a manifest: its shape is right (:func:`listed_files`), every listed file exists with its size and
    sha256, and the folder holds no file it does not list. Without one, the checkpoint is damaged (a deleted
    manifest hides changed weights), unless `allow_unhashed` (``trainer.resume_legacy``, for a checkpoint
    written before manifests): then state.json, optim.pt, rng.pt and the weights must exist and not be empty,
    and :func:`~queryrl.trainer.checkpoint.select_checkpoint` warns that it was not hashed.
    """
    if not (folder / MANIFEST).is_file():
        return _legacy_problem(folder) if allow_unhashed else LEGACY_HINT
    listed = listed_files(folder)
    if isinstance(listed, str):
        return listed
    unlisted = [name for p in files_of(folder) if (name := p.relative_to(folder).as_posix()) not in listed]
    if unlisted:
        more = f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""
        return (
            f"{_shown(unlisted[0])}{more} is not listed in {MANIFEST}: a file added after the checkpoint was "
            "written; only listed files are trusted"
        )
    for name, entry in listed.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} has {size} bytes, the manifest says {entry['size']}"
        if sha256_of(path) != entry["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None
