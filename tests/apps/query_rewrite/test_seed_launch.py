"""The users' launch script (their ``scripts/run_hybrid_grpo_query_RL.sh``, "修改7") with its entry point swapped
for ``queryrl train``, run as a real CLI process against a RAG service and an OpenAI-compatible judge on
loopback, with the service keys of their YAML given as launch-script overrides.

Adapted for a CPU test, and only this: the model folder is a tiny model fine-tuned here to answer in the
JSON format; ``trainer.n_gpus_per_node=1``; one step of 2 prompts; a short response length; the judge's
base URL points to the loopback stand-in of api.openai.com; the endpoints' host is 127.0.0.1. The data
are the user's own (``data_source`` ``query_rewrite/car_sales``: the demo's conversations relabelled, so
the tiny model can answer them), which the embedded demo services must not silently score.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from queryrl.cli import app as cli
from tests.apps.query_rewrite.helpers import pronoun_rows
from tests.helpers import SEED_LAUNCH
from tests.loopback import Services, rag_and_judge

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "query_rewrite_demo.yaml"
SECRET = "sk-seed-launch-0123456789abcdef"

# the users' scripts/run_hybrid_grpo_query_RL.sh, entry point swapped (tests/config/test_config.py holds it as
# written); DATA and MODEL are filled in below
SEED_SCRIPT = SEED_LAUNCH.replace("/home/jovyan2/query_rl/data/sales_rag", "DATA").replace(
    "/home/jovyan2/query_rl/model/Qwen3-8B", "MODEL"
)


def seed_args(data: Path, model: Path) -> list[str]:
    """The script's arguments after ``queryrl train``, with the user's data folder and model folder."""
    args = shlex.split(SEED_SCRIPT.replace("\\\n", " "))
    assert args[:2] == ["queryrl", "train"]
    return [a.replace("DATA", str(data)).replace("MODEL", str(model)) for a in args[2:]]


def seed_yaml_keys(rag_base: str, model: str = "GPT-5") -> list[str]:
    """Their YAML's service keys as overrides (their endpoint shape: no /rag prefix)."""
    return [
        f"+algorithm.hybrid_grpo_gpt5.gpt5_model={model}",
        "+algorithm.hybrid_grpo_gpt5.gpt5_batch_size=8",
        "+algorithm.hybrid_grpo_gpt5.gpt5_timeout=10.0",
        f"+algorithm.hybrid_grpo_gpt5.rag_endpoint={rag_base}/chat_8b",
        f"+algorithm.hybrid_grpo_gpt5.reference_endpoint={rag_base}/chat",
    ]


def _replace(args: list[str], key: str, value: str) -> list[str]:
    return [f"{key}={value}" if a.split("=", 1)[0] == key else a for a in args]


@pytest.fixture(scope="module")
def user_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's folder: train.parquet and val.parquet of their own source."""
    import pandas as pd

    folder = tmp_path_factory.mktemp("sales_rag")
    rows = pronoun_rows()  # the rows the shared json_model (tests/apps/query_rewrite/conftest.py) learnt from
    for split, part in (("train", rows), ("val", rows[:4])):
        pd.DataFrame([{**r, "data_source": "query_rewrite/car_sales"} for r in part]).to_parquet(
            folder / f"{split}.parquet", index=False
        )
    return folder


@pytest.fixture
def services() -> Iterator[Services]:
    """The user's RAG service at the users' paths and a strict GPT-5 stand-in that checks the key."""
    with rag_and_judge(SECRET, better="8b", seed_paths=True) as found:
        yield found


def test_seed_script_as_written_names_what_to_change(tmp_path: Path, user_data: Path) -> None:
    """Two GPUs on the default (local) backend, then the demo services on the user's data: each an error."""
    runner = CliRunner()
    args = [*seed_args(user_data, tmp_path / "no-model"), f"trainer.output_dir={tmp_path / 'runs'}"]
    result = runner.invoke(cli, ["train", *args])
    assert result.exit_code == 2
    assert "trainer.backend=ray" in result.output
    result = runner.invoke(cli, ["train", *_replace(args, "trainer.n_gpus_per_node", "1")])
    assert result.exit_code == 2
    assert "is your data, but the RAG service and the judge are the embedded demo's" in result.output
    assert "not a local Hugging Face model folder" in result.output  # every problem in one go
    assert not (tmp_path / "runs").exists(), "nothing may be written before the run is valid"


@pytest.mark.slow
def test_seed_script_trains_against_the_users_rag_and_judge(
    tmp_path: Path, user_data: Path, json_model: Path, services: Services
) -> None:
    rag_base, judge_url = services.rag_url, services.judge_url
    rag_requests, judged, judge_stats = services.rag_requests, services.judged, services.judge_stats
    out = tmp_path / "runs"
    args = seed_args(user_data, json_model)
    args = _replace(args, "trainer.n_gpus_per_node", "1")
    args = _replace(args, "data.train_batch_size", "2")
    args += seed_yaml_keys(rag_base)
    args += [
        f"app.query_rewrite.judge.base_url={judge_url}",  # the loopback stand-in of api.openai.com
        "trainer.total_steps=1",
        "data.max_val_samples=2",
        "data.max_prompt_length=320",
        "data.max_response_length=96",
        f"trainer.output_dir={out}",
        "trainer.logger=[console,jsonl]",
        "trainer.plot=false",
    ]
    env = {**os.environ, "OPENAI_API_KEY": SECRET, "OMP_NUM_THREADS": "1"}
    dry = subprocess.run(
        [sys.executable, "-m", "queryrl.cli", "train", "--dry-run", *args], env=env, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"chat_8b: {rag_base}/chat_8b" in dry.stdout
    assert "model 'GPT-5'" in dry.stdout
    assert not out.exists()

    proc = subprocess.run(
        [sys.executable, "-m", "queryrl.cli", "train", *args], env=env, capture_output=True, text=True, timeout=540
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert rag_requests["chat_8b"] > 0, "the user's RAG service (8B endpoint) got no request"
    assert rag_requests["chat"] > 0, "the user's RAG service (reference endpoint) got no request"
    assert judged, "the judge got no request"
    assert judge_stats.refused == 0
    assert judge_stats.last_body["model"] == "GPT-5"
    assert judge_stats.last_authorization == f"Bearer {SECRET}"  # the key reached the judge, and only the judge
    run = out / "qwen3_8b_grpo_gpt5_hybrid"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1
    assert rows[-1]["reward/failed"] == 0
    saved = (run / "config.yaml").read_text()
    assert "reward_mode: seed_hybrid" in saved
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in proc.stdout + proc.stderr
