"""benchmarks/sft_prefix.py: its summary of paired runs, and the SFT command it runs is the bench's with the
prefix setting and the step count added."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import sft_prefix as bench  # noqa: E402


def run(share: bool, steps: list[float], loss: list[float]) -> dict[str, Any]:
    return {"name": "x", "arm": "on" if share else "off", "step_s": steps, "loss": loss}


def test_the_summary_pairs_the_arms() -> None:
    runs = [run(False, [30.0, 34.0], [1.0, 0.5]), run(True, [20.0, 22.0], [1.0, 0.5000003])]
    runs += [run(False, [32.0, 32.0], [1.0, 0.5]), run(True, [21.0, 21.0], [1.000001, 0.5])]
    out = bench.summary(runs)
    assert out["mean_step_s_off"] == 32.0
    assert out["mean_step_s_on"] == 21.0
    assert out["speedup"] == pytest.approx(32 / 21, abs=1e-3)
    assert out["max_loss_diff"] == pytest.approx(1e-6)


def test_a_missing_data_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--model", str(tmp_path), "--data", str(tmp_path / "warmup.parquet")])
    assert exc.value.code == 2
    assert "warmup.parquet: no such file" in capsys.readouterr().err


def test_the_dtype_arms_name_their_keys_and_pass_the_compute_dtype() -> None:
    runs = [{"name": "a", "arm": "float32", "step_s": [20.0], "loss": [1.0]}]
    runs += [{"name": "b", "arm": "bfloat16", "step_s": [10.0], "loss": [1.01]}]
    out = bench.summary(runs, ("float32", "bfloat16"))
    assert out["mean_step_s_float32"] == 20.0
    assert out["mean_step_s_bfloat16"] == 10.0
    assert out["speedup"] == 2.0
    assert out["max_loss_diff"] == pytest.approx(0.01)
    assert bench.ARMS["dtype"][1] == ("bfloat16", ["model.compute_dtype=bfloat16"])
