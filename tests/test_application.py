"""A third-party application, registered as a plugin, reaches the schema, validation, the plan and training."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig

from queryrl.application import APPS, Application, AppReward, enabled_app, load_apps, register_app
from queryrl.config import ConfigError, load_config
from queryrl.trainer.loop import Trainer
from queryrl.trainer.plan import build_plan
from tests.helpers import REPO, make_cfg


@dataclass
class ConstantConfig:
    enable: bool = False
    score: float = 0.25


class ConstantApp(Application):
    """Scores every response `app.constant_score.score`; counts its calls in pop_metrics."""

    name = "constant_score"
    config = ConstantConfig

    def __init__(self) -> None:
        self.calls = 0

    def validate(self, cfg: DictConfig) -> None:
        if not 0 <= cfg.app.constant_score.score <= 1:
            raise ConfigError(f"app.constant_score.score must be in [0, 1], got {cfg.app.constant_score.score}")

    def reward(self, cfg: DictConfig) -> AppReward:
        app = self

        class Reward:
            def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
                app.calls += 1
                return float(cfg.app.constant_score.score)

            def pop_metrics(self) -> dict[str, float]:
                return {"constant_score/calls": float(app.calls)}

        return AppReward(Reward(), {}, manager="async", label="constant_score app")


@pytest.fixture
def constant_app() -> Iterator[ConstantApp]:
    load_apps()
    app = register_app(ConstantApp())
    assert isinstance(app, ConstantApp)
    yield app
    APPS.unregister("constant_score")


def test_the_app_adds_its_node_and_its_checks(constant_app: ConstantApp) -> None:
    cfg = load_config(REPO / "configs" / "toy_grpo.yaml", ["app.constant_score.enable=true"])
    assert cfg.app.constant_score.score == 0.25
    assert enabled_app(cfg) is constant_app
    assert "query_rewrite" in cfg.app  # the installed application is still there, off
    with pytest.raises(ConfigError, match=r"app\.constant_score\.score must be in"):
        load_config(None, ["app.constant_score.score=2"])
    with pytest.raises(ConfigError, match="could not be converted"):
        load_config(None, ["app.constant_score.score=high"])
    with pytest.raises(ConfigError, match="one application at a time"):
        load_config(None, ["app.constant_score.enable=true", "app.query_rewrite.enable=true"])


def test_without_the_plugin_its_keys_are_unknown() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'app\.constant_score\.enable'"):
        load_config(None, ["app.constant_score.enable=true"])


def test_the_trainer_scores_with_the_enabled_app(constant_app: ConstantApp, tmp_path: Path, model_cache: Path) -> None:
    cfg = make_cfg(tmp_path, model_cache, "app.constant_score.enable=true", "trainer.total_steps=1")
    assert "constant_score app, manager async" in build_plan(cfg).render()  # reward.manager=auto: the app's
    with Trainer(cfg) as trainer:
        metrics = trainer.fit()
    assert metrics["critic/score/mean"] == pytest.approx(0.25)
    assert metrics["constant_score/calls"] == 16.0  # 4 prompts x 4 samples, reported through pop_metrics
