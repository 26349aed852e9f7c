"""A reward of the user's beside the application's own is a config problem, in ``--dry-run`` and in the run
(issue 49, item 2: the run gave a traceback at start while ``--dry-run`` said "problems none")."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.training import REWARD_FUNCTION
from queryrl.cli import app
from queryrl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "query_rewrite_demo.yaml"


@pytest.fixture
def own_reward(tmp_path: Path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    return path


def test_a_reward_function_beside_the_app_is_a_config_error(own_reward: Path) -> None:
    with pytest.raises(ConfigError, match=r"^app\.query_rewrite\.enable=true brings its own reward; reward\.function"):
        load_config(DEMO, [f"reward.function.path={own_reward}"])
    with pytest.raises(ConfigError, match=r"reward\.functions \(.*my_reward\.py:fmt\) would replace it"):
        load_config(DEMO, [f"reward.functions=[{{path: {own_reward}, name: fmt}}]"])
    # the application's own function, as the users' launch script names it, is no conflict; nor a file without the app
    load_config(DEMO, [f"reward.function.path={REWARD_FUNCTION}"])
    load_config(DEMO, ["app.query_rewrite.enable=false", f"reward.function.path={own_reward}"])


@pytest.mark.parametrize("dry_run", [True, False])
def test_dry_run_and_run_say_it_in_one_line(tmp_path: Path, own_reward: Path, dry_run: bool) -> None:
    args = ["train", "--config", str(DEMO), f"trainer.output_dir={tmp_path / 'runs'}", "trainer.preflight=false"]
    result = CliRunner().invoke(app, [*args, f"reward.function.path={own_reward}", *(["--dry-run"] * dry_run)])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    assert "brings its own reward" in errors[0]
    assert "problems     none" not in result.output
    assert "Traceback" not in result.output
    assert "╭" not in result.output
    assert not (tmp_path / "runs").exists()
