"""``app.query_rewrite.judge.*`` request settings reach the judge: config -> settings_of -> QueryRewriteReward ->
JudgeClient -> a strict (OpenAI-like) judge server playing GPT-5; the old fixed temperature=0.0 is gone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from queryrl.apps.query_rewrite.reward.score import QueryRewriteReward, RewardFailure
from queryrl.config import ConfigError, load_config, redacted
from queryrl.rewards.judge import collect_judge_metrics
from queryrl.testing.judge_server import make_app, running_server
from tests.apps.query_rewrite.reward.helpers import KEY, _config, _row, _score, rubric_judge


def test_gpt5_judges_the_reward_with_the_configured_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", KEY)
    app = make_app(rubric_judge, strict=True, api_key=KEY)
    yaml_judge = "      max_tokens: 2000\n      reasoning_effort: minimal\n      extra_body:\n        verbosity: low\n"
    with running_server(app) as url:
        cfg = _config(url, tmp_path, yaml_judge, "app.query_rewrite.judge.extra_body.service_tier=flex")
        out = _score(cfg, _row())
    assert out["quality"] == pytest.approx(0.7 + 30 / 40 * 0.3)  # the verdict was used
    body = app.state.stats.last_body
    assert "temperature" not in body
    assert body["max_completion_tokens"] == 2000
    assert body["reasoning_effort"] == "minimal"
    assert (body["verbosity"], body["service_tier"]) == ("low", "flex")
    assert app.state.stats.refused == 0


def test_a_refused_temperature_fails_the_sample_once_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", KEY)
    app = make_app(rubric_judge, strict=True, api_key=KEY)
    with running_server(app) as url:
        cfg = _config(url, tmp_path, "", "app.query_rewrite.judge.temperature=0.0")
        collect_judge_metrics()  # drain counters of earlier tests
        with pytest.raises(RewardFailure, match=r"'temperature' does not support 0\.0") as caught:
            _score(cfg, _row())
    assert "hint: leave the judge's temperature unset" in str(caught.value)
    assert app.state.stats.requests == 1  # one paid call, not 1 + 3 retries
    metrics = collect_judge_metrics()
    assert (metrics["judge/failed"], metrics["judge/client_errors"], metrics["judge/retries"]) == (1, 1, 0)


def test_judge_settings_are_validated_and_not_redacted() -> None:
    with pytest.raises(ConfigError, match=r"app.query_rewrite.judge.reasoning_effort.*'extreme'"):
        load_config(None, ["app.query_rewrite.judge.reasoning_effort=extreme"])
    with pytest.raises(ConfigError, match=r"app\.query_rewrite\.judge\.token_limit_param"):
        load_config(None, ["app.query_rewrite.judge.token_limit_param=max_output_tokens"])
    with pytest.raises(ConfigError, match=r"app.query_rewrite.judge.temperature must be in \[0, 2\]"):
        load_config(None, ["app.query_rewrite.judge.temperature=5"])
    with pytest.raises(ConfigError, match=r"app\.query_rewrite\.judge\.max_tokens must be >= 1"):
        load_config(None, ["app.query_rewrite.judge.max_tokens=0"])
    cfg = load_config(None, ["app.query_rewrite.judge.token_limit_param=max_tokens", "model.tokenizer_path=/tok"])
    saved = redacted(cfg)
    assert saved["app"]["query_rewrite"]["judge"]["token_limit_param"] == "max_tokens"  # not "***"
    assert saved["model"]["tokenizer_path"] == "/tok"
    assert cfg.app.query_rewrite.judge.temperature is None  # the default: not sent


def test_openai_reference_rewriter_works_with_gpt5() -> None:
    """The embedded reference pipeline's OpenAI rewriter used JudgeClient's old temperature 0.0 too."""
    from queryrl.rag.rewriters import OpenAICompatibleRewriter

    app = make_app(lambda messages: '{"rewritten_query": "小米14 价格"}', strict=True)
    with running_server(app) as url:
        rewriter = OpenAICompatibleRewriter(url, "gpt-5-mini", api_key_env=None)

        async def rewrite() -> str:
            try:
                return await rewriter.rewrite([{"role": "user", "content": "它多少钱？"}])
            finally:
                await rewriter.client.aclose()

        query = asyncio.run(rewrite())
    assert query == "小米14 价格"
    assert app.state.stats.refused == 0


def test_the_reward_managers_retries_do_not_pay_for_a_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16: each failure was sent 3 times (the async manager retries a failed sample twice)."""
    from queryrl.rewards import RewardInput, make_reward_manager

    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", KEY)
    app = make_app(rubric_judge, strict=True, api_key=KEY)
    row = _row()
    answer = json.dumps({"rewritten_query": "手机 电池", "user_profile": "", "history_summary": ""})
    with running_server(app) as url:
        cfg = _config(url, tmp_path, "      temperature: 0.3\n")
        reward = QueryRewriteReward.from_config(cfg)
        manager = make_reward_manager("async", reward, {}, max_retries=2, backoff_s=0.01)
        try:
            (result,) = manager.score(
                [RewardInput(row["data_source"], answer, row["reward_model"]["ground_truth"], row["extra_info"])]
            )
        finally:
            manager.close()
    assert result.failed
    assert "'temperature' does not support 0.3" in (result.error or "")
    assert "gave up after 3 attempt(s)" in (result.error or "")
    assert app.state.stats.requests == 1  # one paid call for three attempts
