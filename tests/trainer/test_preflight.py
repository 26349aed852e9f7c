"""`queryrl train`'s preflight: the judge, the RAG service and the reward function are called once
before any model is loaded; each failure is one message and exit 2."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.preflight import reward_spec, service_checks
from queryrl.cli import app
from queryrl.config import load_config
from queryrl.testing.judge_server import load_judge_function, running_server
from queryrl.testing.judge_server import make_app as make_judge_app
from queryrl.trainer.preflight import PreflightError, run_preflight
from tests.loopback import rag_and_judge

REPO = Path(__file__).resolve().parents[2]
TOY = str(REPO / "configs" / "toy_grpo.yaml")
DEMO = str(REPO / "configs" / "query_rewrite_demo.yaml")
runner = CliRunner()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def train(config: str, tmp_path: Path, *overrides: str) -> Result:
    """`queryrl train` with a fresh model cache: a tiny model built there means the model was loaded."""
    args = ["train", "--config", config, f"model.cache_dir={tmp_path / 'cache'}"]
    args += [f"trainer.output_dir={tmp_path / 'runs'}", "trainer.logger=[jsonl]", "data.val_files=[]"]
    return runner.invoke(app, [*args, *overrides])


def assert_stopped_before_the_model(result: Result, tmp_path: Path, *parts: str) -> None:
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error: ")]
    for part in parts:
        assert part in line, line
    assert not list((tmp_path / "cache").glob("tiny-qwen2-*")), "the model was built before the check failed"
    assert not (tmp_path / "runs").exists()


def reward_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(
        f"import time\n\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n{body}"
    )
    return path


def test_a_reward_that_raises_stops_the_run_before_the_model_loads(tmp_path: Path) -> None:
    path = reward_file(tmp_path, "    raise KeyError('score_table')\n")
    result = train(TOY, tmp_path, f"reward.function.path={path}")
    assert_stopped_before_the_model(
        result,
        tmp_path,
        f"of {path} failed on the reply 'hello' (the row's reward_model.ground_truth), on the first row of "
        "builtin://toy_target_string/train",
        "KeyError",
    )


def test_a_reward_that_hangs_stops_within_reward_timeout_s(tmp_path: Path) -> None:
    path = reward_file(tmp_path, "    time.sleep(30)\n    return 1.0\n")
    start = time.monotonic()
    result = train(TOY, tmp_path, f"reward.function.path={path}", "reward.timeout_s=1")
    assert time.monotonic() - start < 20
    assert_stopped_before_the_model(result, tmp_path, "did not return within reward.timeout_s=1 s")


def test_a_reward_that_returns_no_number_stops_the_run(tmp_path: Path) -> None:
    path = reward_file(tmp_path, "    return {'accuracy': 1.0}\n")
    result = train(TOY, tmp_path, f"reward.function.path={path}")
    assert_stopped_before_the_model(result, tmp_path, "returned a dict without 'score'")


def test_a_judge_that_does_not_answer_stops_the_run_before_the_model_loads(tmp_path: Path) -> None:
    result = train(
        DEMO,
        tmp_path,
        "app.query_rewrite.judge.backend=openai",
        f"app.query_rewrite.judge.base_url=http://127.0.0.1:{closed_port()}/v1",
        "app.query_rewrite.judge.api_key_env=null",
        "app.query_rewrite.judge.max_retries=0",
        "app.query_rewrite.judge.timeout_s=2",
    )
    assert_stopped_before_the_model(result, tmp_path, "judge", "127.0.0.1")


def test_a_rag_service_that_does_not_answer_stops_the_run_before_the_model_loads(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    result = train(DEMO, tmp_path, f"app.query_rewrite.rag.url={url}", "app.query_rewrite.rag.timeout_s=2")
    assert_stopped_before_the_model(result, tmp_path, f"RAG service at {url} does not answer")


def test_an_unset_judge_key_variable_fails_the_judge_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUERYRL_TEST_UNSET_KEY", raising=False)
    with running_server(make_judge_app(load_judge_function("constant"))) as url:
        cfg = load_config(
            DEMO,
            [
                "app.query_rewrite.judge.backend=openai",
                f"app.query_rewrite.judge.base_url={url}",
                "app.query_rewrite.judge.api_key_env=QUERYRL_TEST_UNSET_KEY",
            ],
        )
        (judge,) = service_checks(cfg)
        with pytest.raises(PreflightError, match="QUERYRL_TEST_UNSET_KEY is not set"):
            judge()


@pytest.mark.slow
def test_every_check_passes_against_live_services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", "sk-preflight-0123456789")
    with rag_and_judge("sk-preflight-0123456789") as services:
        cfg = load_config(
            DEMO,
            [
                f"model.cache_dir={tmp_path / 'cache'}",
                "app.query_rewrite.judge.backend=openai",
                f"app.query_rewrite.judge.base_url={services.judge_url}",
                "app.query_rewrite.judge.model=gpt-5",
                "app.query_rewrite.judge.api_key_env=QUERYRL_TEST_JUDGE_KEY",
                f"app.query_rewrite.rag.url={services.rag_url}",
            ],
        )
        lines: list[str] = []
        run_preflight(cfg, lines.append, service_checks(cfg), reward_spec(cfg))
        # one tiny request with the run's settings, then the reward's judgement of the reference rewrite
        assert services.judge_stats.requests == 2
    assert len(lines) == 5
    assert "judge" in lines[0]
    assert f"RAG service at {services.rag_url}" in lines[1]
    first = "with the first row of builtin://sales_demo/train answered"  # one request each, checked as in training
    assert f"POST {services.rag_url}/rag/chat_8b {first}" in lines[2]
    assert f"POST {services.rag_url}/rag/chat {first}" in lines[3]
    assert services.rag_requests["chat_8b"] == 2  # the endpoint's check, then the reward's retrieval
    assert 'queryrl.apps.query_rewrite.reward scored the reference rewrite \'{"rewritten_query": ' in lines[4]
    assert lines[4].split(", on the first row of builtin://sales_demo/train: ")[1] != "-2"  # not the format floor
    assert not list((tmp_path / "cache").glob("tiny-qwen2-*"))
