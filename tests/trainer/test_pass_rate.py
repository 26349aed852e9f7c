"""``queryrl pass-rate``: the starting policy's samples per training prompt, and the prompts that carry a signal."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.config import ConfigError
from queryrl.trainer.loop import Trainer
from queryrl.trainer.pass_rate import PASS_RATE_KEY, RowRate, kept_rows, rate_rows, report_of
from tests.helpers import make_cfg, metrics_of, small_run

# odd rows: one reward for every sample (a flat group); even rows: the response's length (samples differ)
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if extra_info["index"] % 2:
        return 0.5
    return float(len(solution_str))
"""


def _reward(tmp_path: Path) -> Path:
    path = tmp_path / "reward.py"
    path.write_text(REWARD)
    return path


def test_rates_tell_flat_prompts_from_informative_ones(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_cfg(tmp_path, model_cache, f"reward.function.path={_reward(tmp_path)}")
    items, rates, seconds = rate_rows(cfg, samples=4, rows=12)
    assert len(items) == len(rates) == 12
    assert seconds > 0
    assert len({it.row["extra_info"]["index"] for it in items}) == 12  # 12 distinct prompts
    for item, rate in zip(items, rates, strict=True):
        assert rate.samples == rate.scored == 4
        if item.row["extra_info"]["index"] % 2:
            assert not rate.informative
            assert rate.reward_mean == 0.5
            assert rate.reward_std == 0.0
    even = [r for it, r in zip(items, rates, strict=True) if it.row["extra_info"]["index"] % 2 == 0]
    assert any(r.informative for r in even)  # a random tiny model's samples differ in length
    report = report_of(cfg, rates, kept_rows(rates, 0.0, 0), 0.0, seconds)
    assert report.rows == 12
    assert report.informative + report.flat + report.unscored == 12
    assert report.kept == report.informative


def test_keep_flat_share_is_seeded_and_bounded() -> None:
    flat = RowRate(samples=4, scored=4, reward_mean=1.0, reward_std=0.0, distinct_responses=1)
    signal = RowRate(samples=4, scored=4, reward_mean=0.5, reward_std=0.5, distinct_responses=3)
    rates = [flat] * 200 + [signal] * 10
    assert kept_rows(rates, 0.0, 1) == [False] * 200 + [True] * 10
    assert all(kept_rows(rates, 1.0, 1))
    half = kept_rows(rates, 0.5, 3)
    assert half == kept_rows(rates, 0.5, 3)
    assert 70 < sum(half[:200]) < 130
    with pytest.raises(ConfigError, match="keep-flat"):
        kept_rows(rates, 1.5, 0)
    one_sample = RowRate(samples=4, scored=1, reward_mean=1.0, reward_std=0.0, distinct_responses=2)
    assert not one_sample.informative  # a group of one scored sample teaches nothing either


def test_command_writes_the_informative_rows_a_run_then_trains_on(tmp_path: Path, model_cache: Path) -> None:
    reward = _reward(tmp_path)
    out = tmp_path / "kept" / "train.parquet"
    args = ["pass-rate", "--config", "configs/toy_grpo.yaml", "--out", str(out), "--rows", "16", "--samples", "4"]
    result = CliRunner().invoke(app, [*args, *small_run(tmp_path, model_cache), f"reward.function.path={reward}"])
    assert result.exit_code == 0, result.output
    assert "-> " in result.output
    assert "prompts x 4 samples" in result.output
    rows = pq.read_table(out).to_pylist()
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["rows"] == 16
    assert report["kept"] == len(rows) >= 1
    assert report["machine"]["capability"]
    for row in rows:  # only prompts whose samples scored differently, each with its measurement
        assert row["extra_info"]["index"] % 2 == 0
        assert row["extra_info"][PASS_RATE_KEY]["reward_std"] > 0
        assert row["prompt"]
        assert row["data_source"]
    assert not list(out.parent.glob("*.tmp*"))  # written under a temporary name, then renamed
    cfg = make_cfg(
        tmp_path / "run", model_cache, f"reward.function.path={reward}", f"data.train_files=[{out}]",
        "trainer.total_steps=1", "data.shuffle=false",
    )  # fmt: skip
    with Trainer(cfg) as trainer:
        trainer.fit()
    assert metrics_of(tmp_path / "run" / "toy_grpo")[-1]["step"] == 1


def test_command_refuses_when_no_prompt_carries_a_signal(tmp_path: Path, model_cache: Path) -> None:
    reward = tmp_path / "flat.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, **kw):\n    return 1.0\n")
    out = tmp_path / "train.parquet"
    args = ["pass-rate", "--config", "configs/toy_grpo.yaml", "--out", str(out), "--rows", "4"]
    result = CliRunner().invoke(app, [*args, *small_run(tmp_path, model_cache), f"reward.function.path={reward}"])
    assert result.exit_code != 0
    assert "no row is left to write" in result.output
    assert not out.exists()
    assert not out.with_suffix(".json").exists()
