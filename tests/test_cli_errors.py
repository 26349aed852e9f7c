"""User errors get one line and exit 2 (a run whose rewards keep failing: exit 3); --debug and
QUERYRL_DEBUG=1 show the traceback. Every case writes no run folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import Result
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.rewards import RewardError

REPO = Path(__file__).resolve().parents[1]
TOY = str(REPO / "configs" / "toy_grpo.yaml")
runner = CliRunner()


def train(tmp_path: Path, model_cache: Path, *overrides: str, env: dict[str, str] | None = None) -> Result:
    args = ["train", "--config", TOY, f"model.cache_dir={model_cache}", f"trainer.output_dir={tmp_path / 'runs'}"]
    args += ["trainer.logger=[jsonl]", "trainer.plot=false", "data.val_files=[]", "trainer.total_steps=6"]
    return runner.invoke(app, [*args, *overrides], env=env)


def assert_one_line(result: Result, *parts: str, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    assert "Traceback" not in result.output
    assert "╭" not in result.output  # no rich traceback box either
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def always_raises(tmp_path: Path) -> Path:
    path = tmp_path / "always_raises.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    raise RuntimeError('the judge key is not set')\n"
    )
    return path


def test_a_parquet_without_prompt(tmp_path: Path, model_cache: Path) -> None:
    bad = tmp_path / "no_prompt.parquet"
    pd.DataFrame({"data_source": ["toy/target_string"], "question": ["hi"]}).to_parquet(bad)
    result = train(tmp_path, model_cache, f"data.train_files=[{bad}]")
    assert_one_line(result, str(bad), "row 0", "'prompt'")
    assert not (tmp_path / "runs").exists()


def test_a_torn_jsonl_line(tmp_path: Path, model_cache: Path) -> None:
    bad = tmp_path / "torn.jsonl"
    bad.write_text(json.dumps({"data_source": "toy/target_string", "prompt": "say hello"}) + '\n{"data_source": "to\n')
    assert_one_line(train(tmp_path, model_cache, f"data.train_files=[{bad}]"), str(bad), "line 2", "invalid JSON")


def test_a_file_that_is_not_parquet_or_not_utf8(tmp_path: Path, model_cache: Path) -> None:
    noise = tmp_path / "noise.parquet"
    noise.write_bytes(bytes(range(256)) * 12)  # no parquet magic: pyarrow's ArrowInvalid was a 95-line traceback
    assert_one_line(train(tmp_path, model_cache, f"data.train_files=[{noise}]"), str(noise), "cannot read parquet")
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(json.dumps({"data_source": "toy/target_string", "prompt": "caf\u00e9"}).encode() + b"\n")
    latin.write_bytes(latin.read_bytes() + '{"data_source": "toy/target_string", "prompt": "café"}\n'.encode("latin-1"))
    result = train(tmp_path, model_cache, f"data.train_files=[{latin}]")
    assert_one_line(result, str(latin), "line 2", "not UTF-8")
    assert not (tmp_path / "runs").exists()


def test_a_missing_data_file(tmp_path: Path, model_cache: Path) -> None:
    missing = tmp_path / "nowhere.parquet"
    assert_one_line(train(tmp_path, model_cache, f"data.train_files=[{missing}]"), str(missing), "does not exist")


def test_a_missing_reward_file(tmp_path: Path, model_cache: Path) -> None:
    missing = tmp_path / "my_reward.py"
    assert_one_line(train(tmp_path, model_cache, f"reward.function.path={missing}"), str(missing), "not found")
    assert not (tmp_path / "runs").exists()


def test_a_folder_where_a_file_belongs_is_called_a_folder(tmp_path: Path, model_cache: Path) -> None:
    folder = tmp_path / "my_reward.py"
    folder.mkdir()
    assert_one_line(train(tmp_path, model_cache, f"reward.function.path={folder}"), str(folder), "is a folder")
    result = runner.invoke(app, ["train", "--config", str(tmp_path)])
    assert_one_line(result, f"config file {tmp_path} is a folder, not a file")
    assert not (tmp_path / "runs").exists()


def test_a_reward_file_that_fails_to_import(tmp_path: Path, model_cache: Path) -> None:
    broken = tmp_path / "broken_reward.py"
    broken.write_text("import a_module_that_is_not_installed\n")
    result = train(tmp_path, model_cache, f"reward.function.path={broken}")
    assert_one_line(result, str(broken), "failed to import", "a_module_that_is_not_installed")


def test_debug_and_queryrl_debug_show_the_traceback(tmp_path: Path, model_cache: Path) -> None:
    missing = f"reward.function.path={tmp_path / 'my_reward.py'}"
    for result in (
        train(tmp_path, model_cache, "--debug", missing),
        train(tmp_path, model_cache, missing, env={"QUERYRL_DEBUG": "1"}),
    ):
        assert result.exit_code == 1
        assert isinstance(result.exception, RewardError)
    # QUERYRL_DEBUG=0 is off
    assert train(tmp_path, model_cache, missing, env={"QUERYRL_DEBUG": "0"}).exit_code == 2


def test_a_model_folder_with_broken_weights(tmp_path: Path, model_cache: Path) -> None:
    built = next(model_cache.glob("tiny-qwen2-*"), None)
    if built is None:  # build the tiny model once (a 1-step run)
        assert train(tmp_path / "build", model_cache, "trainer.total_steps=1").exit_code == 0
        built = next(model_cache.glob("tiny-qwen2-*"))
    folder = tmp_path / "my_model"
    shutil.copytree(built, folder)
    (folder / "model.safetensors").write_bytes(b"")  # a download cut short
    result = train(tmp_path, model_cache, f"model.path={folder}")
    assert_one_line(result, "model: SafetensorError", str(folder))
    assert not (tmp_path / "runs").exists()


def test_resume_from_a_folder_that_is_not_a_checkpoint(tmp_path: Path, model_cache: Path) -> None:
    result = train(tmp_path, model_cache, f"trainer.resume={tmp_path}")
    assert_one_line(result, "checkpoint: FileNotFoundError", str(tmp_path), "no state.json")


def test_export_of_a_checkpoint_with_broken_weights(tmp_path: Path, model_cache: Path) -> None:
    assert train(tmp_path, model_cache, "trainer.total_steps=1").exit_code == 0
    step = tmp_path / "runs" / "toy_grpo" / "checkpoints" / "step_1"
    for weights in (step / "actor").glob("*.safetensors"):
        weights.write_bytes(b"")
    result = runner.invoke(app, ["export", str(step), str(tmp_path / "exported")])
    # the export verifies the manifest first: the emptied file is named with its recorded size
    assert_one_line(result, f"checkpoint {step} is damaged", "actor/model.safetensors has 0 bytes, the manifest says")
    assert not (tmp_path / "exported").exists()


def test_a_reward_that_always_fails_stops_the_run_with_exit_3(
    tmp_path: Path, model_cache: Path, always_raises: Path
) -> None:
    result = train(tmp_path, model_cache, f"reward.function.path={always_raises}", "trainer.preflight=false")
    line = assert_one_line(result, "3 steps in a row", "RuntimeError: the judge key is not set", code=3)
    assert line.startswith("error: stopped: the rewards failed")
    assert "done" not in result.output


def test_debug_shows_the_traceback_of_config_and_data_errors_in_every_command(
    tmp_path: Path, model_cache: Path
) -> None:
    # train, sft and prepare gsm8k leave their config and data errors to one guard (_one_line_errors): one line
    # and exit 2, or with --debug the error itself (they once caught these first and ignored --debug)
    from queryrl.config import ConfigError
    from queryrl.data import DataError

    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"data_source": "to\n')
    cases = [
        (["train", "--config", TOY, f"model.cache_dir={model_cache}", "actor.lr=-1"], ConfigError, "actor.lr"),
        (["sft", "--config", TOY, f"model.cache_dir={model_cache}", "sft.lr=-1"], ConfigError, "sft.lr"),
        (["prepare", "gsm8k", "--input", str(torn), "--out", str(tmp_path / "o")], DataError, str(torn)),
    ]
    for args, error, named in cases:
        assert_one_line(runner.invoke(app, args), named)
        result = runner.invoke(app, [*args, "--debug"])
        assert result.exit_code == 1, result.output
        assert isinstance(result.exception, error), result.output
    assert not (tmp_path / "o").exists()
