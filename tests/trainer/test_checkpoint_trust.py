"""A checkpoint is trusted only for what its manifest lists; a damaged run file is one line (issue 52, item 3).

The attacks of the issue, each on a copy of one real two-step run (``step_1``, ``step_2``, ``config.yaml``,
``metrics.jsonl``): a manifest of the right JSON but the wrong shape, an older step's weights copied into
the newest checkpoint under another name, a corrupt ``config.yaml``, a ``\\xff`` byte in ``metrics.jsonl``.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.errors import CheckpointError
from queryrl.trainer import checkpoint as ckpt
from queryrl.trainer.loop import Trainer
from tests.helpers import REPO, make_cfg, metrics_of, small_run

RUN = "toy_grpo"  # the toy preset's experiment name


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Path:
    """The output folder of one toy run of two steps with a checkpoint after each (made once)."""
    out = tmp_path_factory.mktemp("trained")
    Trainer(make_cfg(out, model_cache, "trainer.total_steps=2", "trainer.save_every=1")).fit()
    return out


@pytest.fixture
def run_copy(trained: Path, tmp_path: Path) -> Path:
    """A private copy of the trained output folder (the test's ``trainer.output_dir``)."""
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    return tmp_path


def edit_manifest(step: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    data = json.loads((step / "manifest.json").read_text())
    (step / "manifest.json").write_text(json.dumps(change(data)))


def drop_key(entry: str, key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(data: dict[str, Any]) -> dict[str, Any]:
        del data["files"][entry][key]
        return data

    return change


def set_entry(entry: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(data: dict[str, Any]) -> dict[str, Any]:
        data["files"][entry] = value
        return data

    return change


BAD_SHAPES: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "files an empty list": (lambda d: {"version": 1, "files": []}, '"files" is list, not an object'),
    "files an empty object": (lambda d: {"version": 1, "files": {}}, "does not list state.json"),
    "a list, not an object": (lambda d: [d], "not a version-1 manifest"),
    "another version": (lambda d: {**d, "version": 2}, "not a version-1 manifest"),
    "no size": (drop_key("optim.pt", "size"), "the entry of 'optim.pt' has no byte count \"size\""),
    "size a string": (set_entry("rng.pt", {"size": "12", "sha256": "0" * 64}), "no byte count"),
    "no sha256": (drop_key("state.json", "sha256"), 'no "sha256" of 64 hex digits'),
    "sha256 a number": (set_entry("state.json", {"size": 2, "sha256": 7}), 'no "sha256" of 64 hex digits'),
    "an entry that is a string": (set_entry("optim.pt", "abc"), "no byte count"),
    "a name outside the folder": (set_entry("../../step_1/optim.pt", {"size": 1, "sha256": "0" * 64}), "not a file"),
    "no weights listed": (
        lambda d: {"version": 1, "files": {k: v for k, v in d["files"].items() if not k.startswith("actor/")}},
        "is not listed in manifest.json",
    ),
}


@pytest.mark.parametrize("shape", list(BAD_SHAPES))
def test_a_manifest_of_the_wrong_shape_is_one_line_and_an_older_checkpoint_is_used(run_copy: Path, shape: str) -> None:
    """Before: ``{"version": 1, "files": []}`` or an entry without ``size`` was a 72-line traceback."""
    change, expected = BAD_SHAPES[shape]
    root = run_copy / RUN / "checkpoints"
    edit_manifest(root / "step_2", change)
    warned: list[str] = []
    newest, damaged = ckpt.select_checkpoint(root, warned.append)
    assert newest == root / "step_1"
    assert damaged == [root / "step_2"]
    assert len(warned) == 1
    assert "\n" not in warned[0]
    assert f"checkpoint {root / 'step_2'} is damaged (" in warned[0]
    assert expected in warned[0]
    assert warned[0].endswith("; trying an older one")


def test_a_manifest_that_is_not_utf8_json_is_damage_too(run_copy: Path) -> None:
    step = run_copy / RUN / "checkpoints" / "step_2"
    (step / "manifest.json").write_bytes(b'{"version": 1, "files": \xff}')
    assert ckpt.verify(step) == "manifest.json is unreadable (UnicodeDecodeError)"


def stray_weights(run_copy: Path) -> Path:
    """The attack: step 1's weights copied into step 2's actor folder under another name; returns step 2."""
    root = run_copy / RUN / "checkpoints"
    shutil.copy(root / "step_1" / "actor" / "model.safetensors", root / "step_2" / "actor" / "model-old.safetensors")
    return root / "step_2"


def test_an_unlisted_weights_file_is_damage_and_resume_falls_back(
    run_copy: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: every ``*.safetensors`` was merged in name order, so the copy of step 1's weights overrode step 2's
    and the run resumed at step 2 with step 1's weights."""
    step_2 = stray_weights(run_copy)
    assert ckpt.verify(step_2) == (
        "'actor/model-old.safetensors' is not listed in manifest.json: a file added after the checkpoint was "
        "written; only listed files are trusted"
    )
    capsys.readouterr()
    trainer = Trainer(make_cfg(run_copy, model_cache, "trainer.total_steps=2"))
    assert trainer.step == 1
    warned = [line for line in capsys.readouterr().err.splitlines() if "step_2" in line]
    assert "model-old.safetensors' is not listed in manifest.json" in warned[0]
    assert "trying an older one" in warned[0]


def test_a_stray_weights_file_is_never_merged_even_when_asked_for_by_name(
    run_copy: Path, model_cache: Path, tiny_bundle: Any
) -> None:
    step_2 = stray_weights(run_copy)
    with pytest.raises(CheckpointError, match=r"step_2 is damaged \('actor/model-old\.safetensors' is not listed"):
        Trainer(make_cfg(run_copy / "other", model_cache, f"trainer.resume={step_2}"))
    # the loader itself, whatever verified the folder or not: the stray file is refused, not merged
    model = copy.deepcopy(tiny_bundle.model)  # the shared one is never changed, even if this test fails
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"model-old\.safetensors: a weights file that the model's own files"):
        ckpt.load_model_weights(model, step_2 / "actor")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert ckpt.weight_files(run_copy / RUN / "checkpoints" / "step_1" / "actor") == [
        run_copy / RUN / "checkpoints" / "step_1" / "actor" / "model.safetensors"
    ]


def test_export_refuses_a_damaged_checkpoint_in_one_line(run_copy: Path) -> None:
    step_2 = stray_weights(run_copy)
    result = CliRunner().invoke(app, ["export", str(step_2), str(run_copy / "exported")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0
    assert "model-old.safetensors' is not listed in manifest.json" in result.output
    assert not (run_copy / "exported").exists()


def train_args(output_dir: Path, model_cache: Path, *more: str) -> list[str]:
    config = str(REPO / "configs" / "toy_grpo.yaml")
    return ["train", "--config", config, *small_run(output_dir, model_cache), "trainer.preflight=false", *more]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (b"trainer:\n  total_steps: [2\n", "not readable YAML at line 3, column 1 (expected ',' or ']'"),
        (b"\tkey: 1\n", "not readable YAML at line 1, column 1 (found character '\\t'"),
        (b"\xff\xfe", "not readable YAML (byte 0xff at offset"),
    ],
)
def test_a_corrupt_config_yaml_is_one_line_naming_it(
    run_copy: Path, model_cache: Path, damage: bytes, expected: str
) -> None:
    """Before: a 204-line YAML traceback (and a UnicodeDecodeError for a byte that is not UTF-8)."""
    config = run_copy / RUN / "config.yaml"
    config.write_bytes(damage)
    result = CliRunner().invoke(app, train_args(run_copy, model_cache, "trainer.total_steps=2"))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {config}: the saved config of the run in this folder is ")
    assert expected in lines[0]
    assert "trainer.resume=disable" in lines[0]


def test_a_byte_that_is_not_utf8_in_metrics_drops_that_line_and_loses_nothing(
    run_copy: Path, model_cache: Path
) -> None:
    """Before: a ``\\xff`` appended to metrics.jsonl was a 98-line UnicodeDecodeError on resume, report and plot."""
    run = run_copy / RUN
    metrics = run / "metrics.jsonl"
    rows = metrics.read_bytes()
    metrics.write_bytes(rows + b"\xff\n")
    runner = CliRunner()
    for command in (["report", str(run)], ["plot", str(run)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 0, result.output
        warned = [line for line in result.output.splitlines() if line.startswith("warning:")]
        assert len(warned) == 1, result.output
        assert f"{metrics}: line 3" in warned[0]
        assert "dropped" in warned[0]
        assert "Traceback" not in result.output
    assert metrics.read_bytes() == rows + b"\xff\n"  # readers never rewrite it
    result = runner.invoke(app, train_args(run_copy, model_cache, "trainer.total_steps=3"))
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if line.startswith("warning:") and "metrics" in line]
    assert warned == [f"warning: {metrics}: line 3 is unreadable (not UTF-8); dropped"]
    assert [r["step"] for r in metrics_of(run)] == [1, 2, 3]
    assert metrics.read_bytes().startswith(rows)
