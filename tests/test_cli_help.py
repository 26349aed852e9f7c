"""The command line's own surface: ``--version``, every command's ``--help`` as plain text, the built-in judges in
``serve-judge --help``, and warnings printed as ``warning: <message>`` lines."""

from __future__ import annotations

import json
import re
import warnings
from importlib.metadata import version
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from queryrl.cli import _warnings_as_lines, app
from queryrl.redaction import add_secret, clear_secrets
from queryrl.testing.judge_server import BUILTIN_JUDGES

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
WIDE = {"COLUMNS": "200", "TERMINAL_WIDTH": "200"}  # one help line is one output line
# RST inline literals and roles, and any stray backquote (markdown code)
RAW_MARKUP = re.compile(r"``|`|:(?:class|meth|func|data|mod|attr|obj|ref):")


def command_paths(group: typer.core.TyperGroup, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand under `group` (groups included), as argument tuples."""
    paths = []
    for name, command in group.commands.items():
        paths.append((*prefix, name))
        if isinstance(command, typer.core.TyperGroup):
            paths += command_paths(command, (*prefix, name))
    return paths


ROOT = typer.main.get_command(app)
assert isinstance(ROOT, typer.core.TyperGroup)
ALL_COMMANDS = [(), *command_paths(ROOT)]


def test_every_command_is_found() -> None:
    # the help test below covers the commands the apps add too, not just the core ones
    found = {" ".join(path) for path in ALL_COMMANDS}
    expected = {"train", "sft", "prepare", "prepare gsm8k", "prepare conversations", "prepare kdconv", "export"}
    expected |= {"convert-gguf", "plot", "serve-judge", "serve-rag", "eval"}
    assert expected <= found, expected - found


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda path: " ".join(path) or "queryrl")
def test_help_is_plain_text(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    markup = sorted({m.group(0) for m in RAW_MARKUP.finditer(result.output)})
    assert not markup, f"raw markup {markup} in `queryrl {' '.join(path)} --help`:\n{result.output}"


def test_the_markup_check_can_fail() -> None:
    assert RAW_MARKUP.search("Train: ``queryrl train --config FILE``")
    assert RAW_MARKUP.search("see :class:`Trainer`")
    assert not RAW_MARKUP.search("Train with RL: queryrl train --config FILE key.sub=value ...")


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str) -> None:
    result = runner.invoke(app, [flag])
    assert result.exit_code == 0, result.output
    assert result.output == f"queryrl {version('queryrl')}\n"


def test_serve_judge_help_lists_the_built_in_judges() -> None:
    output = runner.invoke(app, ["serve-judge", "--help"], env=WIDE).output
    epilog = output[output.index("Built-in judges") :]
    assert len(BUILTIN_JUDGES) >= 3
    for name, fn in BUILTIN_JUDGES.items():
        first_line = (fn.__doc__ or "").strip().splitlines()[0]
        assert re.search(rf"^\s*{re.escape(name)}\s+{re.escape(first_line)}\s*$", epilog, re.MULTILINE), name


# --- warnings ---------------------------------------------------------------------------------------------------


def test_a_warning_is_one_redacted_line_once_per_message(capsys: pytest.CaptureFixture[str]) -> None:
    secret = "sk-test-0123456789"
    add_secret(secret)
    restore = _warnings_as_lines()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # Python's own once-per-location filter is not what dedups here
            warnings.warn(f"the judge said {secret}", stacklevel=1)
            warnings.warn(f"the judge said {secret}", stacklevel=1)
            warnings.warn("another one", UserWarning, stacklevel=1)
    finally:
        restore()
        clear_secrets()
    err = capsys.readouterr().err
    assert err == "warning: the judge said <redacted>\nwarning: another one\n"
    assert warnings.showwarning.__module__ != "queryrl.cli"  # the hook is put back


def test_train_prints_a_warning_as_its_message(tmp_path: Path, model_cache: Path) -> None:
    # prompts longer than data.max_prompt_length are left out with a warning (trainer/components.py); the same
    # file given twice gives the same message twice: printed once
    data = tmp_path / "prompts.jsonl"
    row = {"data_source": "toy/target_string", "reward_model": {"ground_truth": "hello"}}
    prompts = ["say hello"] * 4 + ["say hello " + "and then say hello once more " * 20]
    data.write_text("".join(json.dumps({**row, "prompt": p}) + "\n" for p in prompts))
    args = ["train", "--config", str(REPO / "configs" / "toy_grpo.yaml"), f"model.cache_dir={model_cache}"]
    args += [f"trainer.output_dir={tmp_path / 'runs'}", "trainer.logger=[jsonl]", "trainer.plot=false"]
    args += [f"data.train_files=[{data},{data}]", "data.val_files=[]", "data.train_batch_size=4", "rollout.n=2"]
    args += ["actor.ppo_mini_batch_size=4", "trainer.total_steps=1", "trainer.save_every=0"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "prompts longer than" in line]
    expected = (
        f"warning: {data}: 1 prompts longer than data.max_prompt_length=32 were left out "
        "(logged as data/filtered_prompts)"
    )
    assert lines == [expected], result.output
    assert "UserWarning" not in result.output
    assert "warnings.warn(" not in result.output
