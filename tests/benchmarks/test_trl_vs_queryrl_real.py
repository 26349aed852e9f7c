"""benchmarks/trl_vs_queryrl_real.py: queryrl's step and phase times read from the trainer's own metrics
(``trainer.cpu_timing``), not from a patched trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import trl_vs_queryrl_real as bench  # benchmarks/ is on the tests' path (pyproject.toml)

from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg, metrics_of


def test_a_step_is_the_step_less_validation_and_checkpointing() -> None:
    row = {"step": 3}
    for prefix, scale in (("timing_cpu_s/", 1.0), ("timing_s/", 2.0)):
        row |= {
            f"{prefix}{k}": v * scale
            for k, v in {"step": 10.0, "gen": 4.0, "testing": 1.5, "save_checkpoint": 2.5}.items()
        }
    (step,) = bench.queryrl_steps([row])
    assert step["cpu_s"] == pytest.approx(6.0)
    assert step["wall_s"] == pytest.approx(12.0)
    assert step["phases_cpu_s"] == {"gen": 4.0}
    assert step["phases_wall_s"] == {"gen": 8.0}


def test_a_run_without_cpu_timing_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"step 2 has no timing_cpu_s/step"):
        bench.queryrl_steps([{"step": 2, "timing_s/step": 1.0}])


def test_the_trainers_metrics_give_every_step_and_phase(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_cfg(tmp_path, model_cache, "trainer.cpu_timing=true", "trainer.save_last=true")
    with Trainer(cfg) as trainer:
        trainer.fit()
    rows = metrics_of(tmp_path / "toy_grpo")
    steps = bench.queryrl_steps(rows)
    assert len(steps) == 2
    for step, row in zip(steps, rows, strict=True):
        assert 0.0 < step["cpu_s"] <= row["timing_cpu_s/step"]
        assert {"gen", "reward", "update_actor"} <= set(step["phases_cpu_s"])
        assert sum(step["phases_cpu_s"].values()) <= step["cpu_s"] + 1e-6
    assert "timing_cpu_s/save_checkpoint" in rows[-1]  # the last step saved: left out of the step
    assert steps[-1]["cpu_s"] < rows[-1]["timing_cpu_s/step"]
