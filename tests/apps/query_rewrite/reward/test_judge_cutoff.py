"""A GPT-5-like judge whose reasoning uses up ``max_completion_tokens`` answers an empty reply with
``finish_reason: length``. The preflight asked with a 16-token limit and never read the reply, so it passed,
and every training call then failed with "the reply has no text content" (issue 49). Now the preflight asks
with the configured limit, and both it and a training call name the cut-off and the key to raise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from queryrl.apps.query_rewrite.preflight import service_checks
from queryrl.apps.query_rewrite.reward.score import RewardFailure
from queryrl.rewards.judge import JudgeClient, JudgeUnavailable, collect_judge_metrics
from queryrl.testing.judge_server import make_app, running_server
from queryrl.trainer.preflight import PreflightError
from tests.apps.query_rewrite.reward.helpers import KEY, _config, _row, _score, rubric_judge

CUT_OFF = (
    "the judge's reply was cut off (finish_reason=length) after 512 completion tokens, 512 of them reasoning; "
    "raise app.query_rewrite.judge.max_tokens above 512 (or lower reasoning_effort)"
)


def _gpt5(reasoning: Any = 512) -> Any:
    return make_app(rubric_judge, strict=True, api_key=KEY, reasoning_tokens=reasoning)


def test_the_preflight_finds_a_limit_that_reasoning_uses_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", KEY)
    app = _gpt5()
    with running_server(app) as url:
        cfg = _config(url, tmp_path, "      max_tokens: 512\n      reasoning_effort: high\n")
        (judge_check,) = service_checks(cfg)
        with pytest.raises(PreflightError) as caught:
            judge_check()
    assert CUT_OFF in str(caught.value)
    assert app.state.stats.last_body["max_completion_tokens"] == 512  # the configured limit, not 16


def test_a_training_call_names_the_cut_off_and_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", KEY)
    with running_server(_gpt5()) as url:
        cfg = _config(url, tmp_path, "      max_tokens: 512\n      reasoning_effort: high\n")
        collect_judge_metrics()  # drain counters of earlier tests
        with pytest.raises(RewardFailure) as caught:
            _score(cfg, _row())
    assert CUT_OFF in str(caught.value)
    assert "no text content" not in str(caught.value)
    metrics = collect_judge_metrics()
    assert (metrics["judge/cut_off"], metrics["judge/invalid"], metrics["judge/reasoning_tokens"]) == (1, 1, 512)
    assert metrics["judge/completion_tokens"] == 512


def test_a_limit_above_the_reasoning_judges_and_counts_the_reasoning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", KEY)
    with running_server(_gpt5()) as url:
        cfg = _config(url, tmp_path, "      max_tokens: 2000\n      reasoning_effort: high\n")
        (judge_check,) = service_checks(cfg)
        assert "succeeded" in judge_check()
        collect_judge_metrics()
        out = _score(cfg, _row())
    assert out["quality"] == pytest.approx(0.7 + 30 / 40 * 0.3)
    metrics = collect_judge_metrics()
    reply_tokens = -(-len(rubric_judge([])) // 4)
    assert metrics["judge/reasoning_tokens"] == 512
    assert metrics["judge/completion_tokens"] == 512 + reply_tokens


def test_the_library_client_without_a_config_names_its_own_setting() -> None:
    """Per reasoning effort: low fits the limit, high uses it up; no limit set: the server's default applied."""
    app = make_app(rubric_judge, strict=True, reasoning_tokens={"low": 100, "high": 4000})
    messages = [{"role": "user", "content": "compare"}]
    with running_server(app) as url:
        low = JudgeClient(url, "gpt-5", api_key_env=None, max_tokens=1000, reasoning_effort="low")
        assert low.judge_sync(messages).verdict == json.loads(rubric_judge([]))
        high = JudgeClient(url, "gpt-5", api_key_env=None, max_tokens=1000, reasoning_effort="high")
        with pytest.raises(JudgeUnavailable, match=r"raise the judge's max_tokens above 1000 \(or lower reasoning"):
            high.check_sync()
        result = high.judge_sync(messages)
    assert result.verdict is None
    assert result.raw is None
    assert result.reasoning_tokens == 1000
    assert result.error == (
        "the judge's reply was cut off (finish_reason=length) after 1000 completion tokens, 1000 of them "
        "reasoning; raise the judge's max_tokens above 1000 (or lower reasoning_effort); the reply is empty"
    )


def test_serve_judge_rehearses_the_cut_off_offline() -> None:
    """``queryrl serve-judge --strict --reasoning-tokens 512``, a real process, against the official SDK."""
    from tests.loopback import serve_judge_process

    with serve_judge_process("constant", 60.0, "--strict", "--reasoning-tokens", "512") as url:
        short = JudgeClient(url, "gpt-5", api_key_env=None, max_tokens=512, reasoning_effort="high")
        with pytest.raises(JudgeUnavailable, match=r"cut off \(finish_reason=length\) after 512 completion tokens"):
            short.check_sync()
        roomy = JudgeClient(url, "gpt-5", api_key_env=None, max_tokens=1024, reasoning_effort="high")
        assert "succeeded" in roomy.check_sync()
        assert roomy.pop_stats()["judge/reasoning_tokens"] == 512


def test_serve_judge_refuses_negative_reasoning_tokens() -> None:
    from typer.testing import CliRunner

    from queryrl.cli import app

    result = CliRunner().invoke(app, ["serve-judge", "--reasoning-tokens", "-1"])
    assert result.exit_code == 2
    assert "--reasoning-tokens must be >= 0, got -1" in result.output
    assert "Traceback" not in result.output
