"""wandb and mlflow run for real: wandb offline, mlflow on a local file store, each read back with its own
reader (`wandb leet inspect --json`, mlflow's client).

Both packages are in the ``dev`` extra (``make test`` installs it); without it these tests skip and say so.
Each run's config holds a secret registered from the environment (as the CLI does) in a field named
``api_key``, inside a URL and in a metric name; no file the tracker leaves may contain it in clear.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queryrl.redaction import PLACEHOLDER, clear_secrets, register_config_secrets
from queryrl.tracking import Tracker

SECRET = "sk-test-0123456789abcdef"
_NO_PACKAGE = "needs the dev extra (pip install -e '.[dev]', as make test does)"


@pytest.fixture
def secret_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A run config whose judge key comes from the environment and is registered, as ``queryrl train`` does."""
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", SECRET)
    config = {
        "judge": {"api_key_env": "QUERYRL_TEST_JUDGE_KEY", "api_key": SECRET, "base_url": f"http://judge/?k={SECRET}"},
        "actor": {"lr": 1e-5, "clip_ratio_high": 0.28},
        "trainer": {"logger": ["wandb", "mlflow"]},
    }
    assert register_config_secrets(config) == ["QUERYRL_TEST_JUDGE_KEY"]
    yield config
    clear_secrets()


def _log_three_steps(tracker: Tracker) -> None:
    for step in (1, 2, 3):
        tracker.log({"critic/score/mean": 0.25 * step, "actor/pg_loss": -0.5, f"leak/{SECRET}": 1.0}, step=step)


def _fail_after_one_step(tracker: Tracker) -> None:
    with tracker:
        tracker.log({"x": 1.0}, step=1)
        raise RuntimeError("step 2 failed")


def _files_with(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def _wandb_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``.wandb`` file as wandb itself reads them (``wandb leet inspect --json``: one JSON
    object per record, with its ``type``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def _exit_code(path: Path, timeout_s: float = 20.0) -> int:
    """The run's exit code from its ``.wandb`` file; wandb's service process may write that record just
    after ``finish()`` returns (seen under load), so the file is read again until it is there."""
    deadline = time.monotonic() + timeout_s
    while True:
        exits = [r["exit"] for r in _wandb_records(path) if r["type"] == "exit"]
        if exits or time.monotonic() > deadline:
            (record,) = exits
            return int(record["exit_code"])
        time.sleep(0.2)


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason=f"wandb {_NO_PACKAGE}")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network, no login
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))


@pytest.mark.usefixtures("wandb_offline")
def test_wandb_offline_run_holds_the_metrics_and_no_secret(tmp_path: Path, secret_config: dict[str, Any]) -> None:
    run_dir = tmp_path / "run"
    with Tracker(run_dir, ["wandb"], "proj", "exp", secret_config, total_steps=3) as tracker:
        print(f"printed during the run: {SECRET}")  # wandb copies the console into the run
        _log_three_steps(tracker)
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    records = _wandb_records(run_file)
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [h["_step"] for h in history] == [1, 2, 3]
    assert [h["critic/score/mean"] for h in history] == [0.25, 0.5, 0.75]
    assert all(h["actor/pg_loss"] == -0.5 and h[f"leak/{PLACEHOLDER}"] == 1.0 for h in history)
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    config = run["config"]["update"]
    assert config["actor"] == {"lr": 1e-5, "clip_ratio_high": 0.28}
    assert config["judge"]["api_key"] == PLACEHOLDER
    assert config["judge"]["base_url"] == f"http://judge/?k={PLACEHOLDER}"
    assert _exit_code(run_file) == 0
    assert _files_with(tmp_path, SECRET) == []
    assert _files_with(run_dir, "printed during the run: <redacted>")  # the console copy is there, redacted


@pytest.mark.usefixtures("wandb_offline")
def test_wandb_run_that_raised_exits_non_zero(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="step 2 failed"):
        _fail_after_one_step(Tracker(tmp_path, ["wandb"], "proj", "exp", {}, total_steps=3))
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    assert _exit_code(run_file) == 1


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("mlflow", reason=f"mlflow {_NO_PACKAGE}")
    store = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 refuses a file store unless told
    return store


def _only_run(store: Path, experiment: str) -> Any:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


def test_mlflow_file_store_metrics_and_params_read_back(
    tmp_path: Path, mlflow_store: Path, secret_config: dict
) -> None:
    with Tracker(tmp_path / "run", ["mlflow"], "proj", "exp", secret_config, total_steps=3) as tracker:
        _log_three_steps(tracker)
        tracker.log({"val/score@4": 0.5, "nan": float("nan"), "text": "x"}, step=3)  # type: ignore[dict-item]
    client, run = _only_run(mlflow_store, "proj")
    assert run.info.run_name == "exp"
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val/score_4")] == [(3, 0.5)]
    assert set(run.data.metrics) == {"critic/score/mean", "actor/pg_loss", "leak/_redacted_", "val/score_4"}
    params = run.data.params
    assert params["actor.lr"] == "1e-05"
    assert params["trainer.logger"] == "['wandb', 'mlflow']"
    assert params["judge.api_key"] == PLACEHOLDER
    assert params["judge.base_url"] == f"http://judge/?k={PLACEHOLDER}"
    assert _files_with(tmp_path, SECRET) == []


def test_mlflow_run_that_raised_is_marked_failed(tmp_path: Path, mlflow_store: Path) -> None:
    with pytest.raises(RuntimeError, match="step 2 failed"):
        _fail_after_one_step(Tracker(tmp_path / "run", ["mlflow"], "p2", "exp", {}, total_steps=3))
    _client, run = _only_run(mlflow_store, "p2")
    assert run.info.status == "FAILED"
    import mlflow

    assert mlflow.active_run() is None  # ended: the next run in this process can start
