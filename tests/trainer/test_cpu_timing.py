"""``trainer.cpu_timing``: each phase's CPU time of the trainer's process beside its wall time."""

from __future__ import annotations

import time
from pathlib import Path

from queryrl.trainer.loop import Trainer
from queryrl.trainer.metrics import PhaseTimer
from tests.helpers import make_cfg, metrics_of


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_time_is_logged_beside_wall_time_and_a_sleep_costs_none() -> None:
    timer = PhaseTimer(cpu=True)
    with timer("busy"):
        _spin(0.05)
    with timer("idle"):
        time.sleep(0.1)
    m = timer.metrics()
    assert m["timing_cpu_s/busy"] >= 0.05
    assert m["timing_s/idle"] >= 0.1
    assert m["timing_cpu_s/idle"] < 0.05  # asleep: wall time passes, the process's CPU time does not
    plain = PhaseTimer()  # off by default: wall time only
    with plain("busy"):
        pass
    assert [k for k in plain.metrics() if k.startswith("timing_cpu_s/")] == []


def test_the_trainer_logs_each_phase_in_cpu_time_when_asked(tmp_path: Path, model_cache: Path) -> None:
    with Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=1", "trainer.cpu_timing=true")) as trainer:
        trainer.fit()
    (row,) = metrics_of(tmp_path / "toy_grpo")
    for phase in ("step", "gen", "reward", "update_actor"):
        assert row[f"timing_cpu_s/{phase}"] > 0.0, phase
    assert row["timing_cpu_s/gen"] <= row["timing_cpu_s/step"]
