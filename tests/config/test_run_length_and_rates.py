"""Settings that trained nothing or crashed mid-run are refused when the config loads (issue 49, item 2):
a negative ``trainer.total_steps`` (it printed "done" after no step), zero epochs, and a learning rate that is
NaN, infinite or not positive, of every role (``actor.lr=inf`` passed and crashed at step 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
TOY = str(REPO / "configs" / "toy_grpo.yaml")


@pytest.mark.parametrize("role", ["actor", "critic", "sft"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1e-5"])
def test_a_learning_rate_that_is_not_a_positive_finite_number_is_refused(role: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{role}\.lr must be "):
        load_config(None, [f"{role}.lr={value}"])


@pytest.mark.parametrize("key", ["actor.weight_decay", "actor.kl_loss_coef", "algo.kl_ctrl.kl_coef"])
def test_an_infinite_loss_weight_is_refused(key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, [f"{key}=inf"])
    assert str(caught.value) == f"{key} must be a finite number, got inf"


def test_no_clipping_stays_expressible_as_an_infinite_clip() -> None:
    cfg = load_config(None, ["actor.grad_clip=inf", "actor.clip_ratio_high=inf"])
    assert cfg.actor.grad_clip == float("inf")


def test_a_run_of_no_step_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.total_steps must be >= 0 \(0 = trainer\.total_epochs"):
        load_config(None, ["trainer.total_steps=-1"])
    with pytest.raises(ConfigError, match=r"^trainer\.total_epochs must be >= 1 when trainer\.total_steps=0"):
        load_config(None, ["trainer.total_steps=0", "trainer.total_epochs=0"])
    with pytest.raises(ConfigError, match=r"^sft\.epochs must be >= 1 when sft\.max_steps=0"):
        load_config(None, ["sft.max_steps=0", "sft.epochs=0"])
    # 0 steps means "the epochs": a real meaning, kept; epochs do not matter once the steps are given
    assert load_config(None, ["trainer.total_steps=0", "trainer.total_epochs=2"]).trainer.total_epochs == 2
    assert load_config(None, ["trainer.total_steps=5", "trainer.total_epochs=0"]).trainer.total_steps == 5


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("trainer.total_steps=-1", "error: trainer.total_steps must be >= 0"),
        ("actor.lr=inf", "error: actor.lr must be a finite number, got inf"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_the_command_line_stops_before_anything_loads(tmp_path: Path, override: str, said: str, dry_run: bool) -> None:
    args = ["train", "--config", TOY, f"trainer.output_dir={tmp_path / 'runs'}", override]
    result = CliRunner().invoke(app, [*args, *(["--dry-run"] if dry_run else [])])
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if line.startswith("error: ")] == [
        next(line for line in result.output.splitlines() if line.startswith(said))
    ]
    assert "done" not in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()
