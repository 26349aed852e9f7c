"""A row whose reward compares against ``reward_model.ground_truth`` and has none is a data error naming file
and row, before anything loads (issue 49, item 2: a row with ``reward_model: null`` trained against the
target string "None"). A reward of the user's, or the query-rewrite app's (rows without gold are valid
there), decides for itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.config import load_config
from queryrl.data import DataError, load_records
from queryrl.data.builtin import toy_target_string
from queryrl.trainer.components import build_components
from queryrl.trainer.plan import build_plan
from queryrl.trainer.row_checks import row_problem, truth_rule
from tests.helpers import small_run

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "configs" / "toy_grpo.yaml"
DEMO = REPO / "configs" / "query_rewrite_demo.yaml"


def write_rows(tmp_path: Path, second: dict[str, Any] | None) -> Path:
    """Four toy rows as JSON lines; the second one's reward_model is `second`."""
    rows = toy_target_string("train")[:4]
    rows[1] = {**rows[1], "reward_model": second}
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("second", "said"),
    [
        (None, "missing or null"),
        ({"style": "rule"}, "without ground_truth"),
        ({"style": "rule", "ground_truth": None}, "with ground_truth null"),
    ],
)
def test_a_row_without_ground_truth_under_the_built_in_reward(
    tmp_path: Path, second: dict[str, Any] | None, said: str
) -> None:
    path = write_rows(tmp_path, second)
    cfg = load_config(TOY, [f"data.train_files=[{path}]", "data.val_files=[]"])
    assert row_problem(cfg) == (
        f"{path}: row 1 (line 2): field 'reward_model': {said}, but data_source 'toy/target_string' is scored "
        "against reward_model.ground_truth (give the row its answer, or score it with a reward of your own: "
        "reward.function.path)"
    )
    assert build_plan(cfg, "train").problems == [row_problem(cfg)]
    with pytest.raises(DataError, match=r"row 1 \(line 2\): field 'reward_model'"):
        load_records(path, needs_truth=truth_rule(cfg))


def test_the_command_line_stops_in_one_line_before_the_model_loads(tmp_path: Path) -> None:
    path = write_rows(tmp_path, None)
    args = ["train", "--config", str(TOY), f"data.train_files=[{path}]", "data.val_files=[]"]
    for extra in ([f"trainer.output_dir={tmp_path / 'runs'}"], ["--dry-run"]):
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 2, result.output
        errors = [line for line in result.output.splitlines() if "row 1 (line 2): field 'reward_model'" in line]
        assert len(errors) == 1, result.output
        assert "Traceback" not in result.output
        assert "done" not in result.output
    assert not (tmp_path / "runs").exists()


def test_the_trainer_refuses_the_row_too(tmp_path: Path, model_cache: Path) -> None:
    """Without the command line (Trainer, build_components) the loader applies the same rule."""
    path = write_rows(tmp_path, {"style": "rule"})
    cfg = load_config(TOY, [*small_run(tmp_path / "runs", model_cache), f"data.train_files=[{path}]"])
    with pytest.raises(DataError, match=r"row 1 \(line 2\): field 'reward_model': without ground_truth"):
        build_components(cfg)


def test_a_reward_of_ones_own_or_the_apps_decides_itself(tmp_path: Path) -> None:
    path = write_rows(tmp_path, None)
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    own = load_config(TOY, [f"data.train_files=[{path}]", "data.val_files=[]", f"reward.function.path={reward}"])
    assert truth_rule(own) is None
    assert row_problem(own) is None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [{**r, "data_source": "query_rewrite/mine"} for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    demo = load_config(DEMO, [f"data.train_files=[{path}]", "app.query_rewrite.rag.url=http://127.0.0.1:9"])
    assert row_problem(demo) is None  # the app's rows may have no gold (turns that need no retrieval)
    # a data source no built-in scorer routes needs none either: its own error says so when it is scored
    plain = load_config(TOY, [f"data.train_files=[{path}]", "data.val_files=[]"])
    assert row_problem(plain) is None
