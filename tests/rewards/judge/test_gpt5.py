"""GPT-5 (and o-series) as the judge: JudgeClient through the official openai SDK against the judge server in
strict mode, which answers as OpenAI's API does (400 for a temperature, for ``max_tokens``; 401 for a key).

The defaults send no temperature and name the token limit ``max_completion_tokens``; a setting the model
refuses is one call, never retried, and its error names the parameter and the setting to change;
:meth:`JudgeClient.check` finds all of it before a long job starts."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import pytest

from queryrl.apps.query_rewrite.reward.judging import PAIRWISE_VERDICT_SCHEMA
from queryrl.rewards.judge import (
    JudgeClient,
    JudgeConfigError,
    JudgeResult,
    JudgeUnavailable,
)
from queryrl.testing.judge_server import CONSTANT_VERDICT, constant_judge, make_app, running_server

KEY = "sk-gpt5-judge-secret-0123456789"
MESSAGES = [{"role": "system", "content": "Compare and answer in JSON."}, {"role": "user", "content": "8b: a\n32b: b"}]


def _client(url: str, model: str = "gpt-5", **kwargs: Any) -> JudgeClient:
    options: dict[str, Any] = {"api_key_env": None, "backoff_base_s": 0.01, "timeout_s": 5.0, **kwargs}
    return JudgeClient(url, model, **options)


def _judge(client: JudgeClient) -> JudgeResult:
    async def main() -> JudgeResult:
        try:
            return await client.judge(MESSAGES, PAIRWISE_VERDICT_SCHEMA)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_defaults_work_with_gpt5_and_send_only_what_is_set() -> None:
    app = make_app(constant_judge, strict=True)
    with running_server(app) as url:
        plain = _judge(_client(url))
        sent_plain = app.state.stats.last_body
        tuned = _client(url, max_tokens=300, reasoning_effort="minimal", extra_body={"verbosity": "low"})
        result = _judge(tuned)
        sent = app.state.stats.last_body
    assert plain.verdict == CONSTANT_VERDICT
    assert set(sent_plain) == {"model", "messages"}  # no temperature, no token limit: the model's defaults
    assert result.verdict == CONSTANT_VERDICT
    assert sent["max_completion_tokens"] == 300
    assert sent["reasoning_effort"] == "minimal"
    assert sent["verbosity"] == "low"
    assert "temperature" not in sent
    assert "max_tokens" not in sent
    assert app.state.stats.refused == 0


def test_temperature_zero_is_one_call_with_the_servers_message() -> None:
    """The bug of issue 16: temperature=0.0 -> HTTP 400, retried 3 times (3 paid calls), cause hidden."""
    app = make_app(constant_judge, strict=True)
    with running_server(app) as url:
        client = _client(url, temperature=0.0, max_retries=3)
        result = _judge(client)
    assert result.verdict is None
    assert result.error is not None
    assert result.error.startswith(
        "call failed after 1 attempt(s): HTTP 400: Unsupported value: 'temperature' does not support 0.0 with "
        "this model. Only the default (1) value is supported. [param=temperature, code=unsupported_value]"
    )
    assert "hint: leave the judge's temperature unset (null)" in result.error
    assert app.state.stats.requests == 1  # not retried
    stats = client.pop_stats()
    assert (stats["judge/calls"], stats["judge/retries"], stats["judge/failed"]) == (1, 0, 1)
    assert stats["judge/client_errors"] == 1
    assert stats["judge/invalid"] == 0


def test_max_tokens_name_is_chosen_and_explained() -> None:
    app = make_app(constant_judge, strict=True)
    with running_server(app) as url:
        old_name = _judge(_client(url, max_tokens=64, token_limit_param="max_tokens"))
        old_body = app.state.stats.last_body
        new_name = _judge(_client(url, "gpt-4o", max_tokens=64))  # a non-reasoning model takes the new name too
    assert old_body["max_tokens"] == 64
    assert old_name.error is not None
    assert "Use 'max_completion_tokens' instead. [param=max_tokens, code=unsupported_parameter]" in old_name.error
    assert "hint: set the judge's token_limit_param to max_completion_tokens" in old_name.error
    assert new_name.verdict == CONSTANT_VERDICT


def test_other_unsupported_parameters_name_extra_body() -> None:
    app = make_app(constant_judge, strict=True)
    with running_server(app) as url:
        result = _judge(_client(url, "o3-mini", extra_body={"top_p": 0.9}))
    assert result.error is not None
    assert "'top_p' is not supported with this model. [param=top_p, code=unsupported_parameter]" in result.error
    assert "hint: remove 'top_p' from the judge's extra_body" in result.error


@pytest.mark.parametrize(("fault", "retried"), [("408", True), ("409", True), ("429", True), ("400", False)])
def test_which_status_codes_are_retried(fault: str, retried: bool) -> None:
    app = make_app(constant_judge, chaos=[fault])
    with running_server(app) as url:
        client = _client(url, max_retries=2)
        result = _judge(client)
    assert (result.verdict is not None) is retried
    assert app.state.stats.requests == (2 if retried else 1)
    stats = client.pop_stats()
    assert stats["judge/retries"] == (1 if retried else 0)
    assert stats["judge/client_errors"] == (0 if retried else 1)


def test_wrong_key_is_one_call_and_its_masked_echo_is_scrubbed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "sk-wrong-judge-key-987654321"
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", wrong)
    app = make_app(constant_judge, strict=True, api_key=KEY)
    with running_server(app) as url:
        result = _judge(_client(url, api_key_env="QUERYRL_TEST_JUDGE_KEY", max_retries=3))
    assert result.error is not None
    assert result.error.startswith("call failed after 1 attempt(s): HTTP 401: Incorrect API key provided: <redacted>")
    assert "[code=invalid_api_key]" in result.error
    assert app.state.stats.requests == 1
    for text in (result.error, caplog.text):
        assert wrong not in text
        assert wrong[:5] + "*" not in text  # not even OpenAI's masked piece of it


def test_missing_key_is_a_config_error_never_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUERYRL_TEST_JUDGE_KEY", raising=False)
    app = make_app(constant_judge, strict=True, api_key=KEY)
    with running_server(app) as url:
        client = _client(url, api_key_env="QUERYRL_TEST_JUDGE_KEY")
        with pytest.raises(JudgeConfigError, match="QUERYRL_TEST_JUDGE_KEY is not set"):
            _judge(client)
        with pytest.raises(JudgeConfigError, match="QUERYRL_TEST_JUDGE_KEY"):
            client.check_sync()
    assert app.state.stats.requests == 0
    assert app.state.stats.model_lists == 0
    assert client.pop_stats()["judge/config_errors"] == 2


def test_bad_settings_are_refused_when_made() -> None:
    with pytest.raises(ValueError, match="reasoning_effort must be one of"):
        JudgeClient("http://h/v1", "gpt-5", reasoning_effort="max")
    with pytest.raises(ValueError, match="token_limit_param"):
        JudgeClient("http://h/v1", "gpt-5", token_limit_param="max_output_tokens")
    with pytest.raises(ValueError, match="temperature"):
        JudgeClient("http://h/v1", "gpt-5", temperature=3.0)


def test_cache_key_covers_the_new_settings() -> None:
    keys = {
        JudgeClient("http://h/v1", "gpt-5", **kwargs).cache_key(MESSAGES)
        for kwargs in (
            {},
            {"reasoning_effort": "low"},
            {"max_tokens": 64},
            {"max_tokens": 64, "token_limit_param": "max_tokens"},
        )
    }
    assert len(keys) == 4


# --- check(): before a long job --------------------------------------------------------------------


def test_check_passes_and_spends_one_small_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", KEY)
    app = make_app(constant_judge, strict=True, api_key=KEY, served_models=["gpt-5"])
    with running_server(app) as url:
        client = _client(url, api_key_env="QUERYRL_TEST_JUDGE_KEY", max_tokens=500, reasoning_effort="low")
        said = client.check_sync()
    assert (
        said
        == f"judge 'gpt-5' at {url}: GET /models lists 1 model(s); a test request with the judge's settings succeeded"
    )
    assert app.state.stats.model_lists == 1
    assert app.state.stats.requests == 1
    # the configured limit (it was capped at 16, so a limit that reasoning uses up passed the check: issue 49)
    assert app.state.stats.last_body["max_completion_tokens"] == 500
    assert app.state.stats.last_body["reasoning_effort"] == "low"


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"temperature": 0.0}, "'temperature' does not support 0.0 with this model"),
        ({"max_tokens": 64, "token_limit_param": "max_tokens"}, "Use 'max_completion_tokens' instead"),
        ({"model": "gpt-5-typo"}, "The model `gpt-5-typo` does not exist"),
    ],
)
def test_check_finds_a_refused_setting(settings: dict[str, Any], expected: str) -> None:
    app = make_app(constant_judge, strict=True, served_models=["gpt-5"])
    options = {"model": "gpt-5", **settings}
    with running_server(app) as url:
        client = _client(url, **options)
        with pytest.raises(JudgeUnavailable, match="a test request failed: HTTP 40") as caught:
            client.check_sync()
    assert expected in str(caught.value)
    assert app.state.stats.requests == 1  # a 4xx is not retried, in the check either


def test_check_refused_key_and_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", "sk-not-the-right-one-000")
    app = make_app(constant_judge, api_key=KEY)
    with running_server(app) as url:
        with pytest.raises(JudgeUnavailable, match=r"refused the key in \$QUERYRL_TEST_JUDGE_KEY: HTTP 401") as caught:
            _client(url, api_key_env="QUERYRL_TEST_JUDGE_KEY").check_sync()
        assert "sk-not" not in str(caught.value)
        assert app.state.stats.requests == 0  # stopped at GET /models
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(JudgeUnavailable, match="does not answer: connection error"):
        _client(f"http://127.0.0.1:{port}/v1", max_retries=0).check_sync()


def test_check_without_a_models_route_uses_the_tiny_request() -> None:
    app = make_app(constant_judge, list_models=False)
    with running_server(app) as url:
        said = _client(url, "local-judge").check_sync()
    assert "GET /models not served; a test request with the judge's settings succeeded" in said
    assert app.state.stats.requests == 1


def test_a_refused_setting_is_one_warning_not_one_per_sample(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="queryrl.rewards.judge")
    app = make_app(constant_judge, strict=True)
    with running_server(app) as url:
        client = _client(url, temperature=0.2)

        async def many() -> list[JudgeResult]:
            try:
                calls = [client.judge([{"role": "user", "content": f"case {i}"}]) for i in range(5)]
                return list(await asyncio.gather(*calls))
            finally:
                await client.aclose()

        results = asyncio.run(many())
    assert all(r.verdict is None for r in results)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'temperature' does not support 0.2" in warnings[0].getMessage()
    assert client.pop_stats()["judge/failed"] == 5  # every failure is still counted


def test_a_refused_request_is_not_sent_again() -> None:
    """A reward manager retries a failed sample: the same refused request must not cost another call."""
    app = make_app(constant_judge, strict=True)
    with running_server(app) as url:
        client = _client(url, temperature=0.0)
        first, again = _judge(client), _judge(client)
        other = asyncio.run(client.judge([{"role": "user", "content": "another request"}]))
    assert app.state.stats.requests == 2  # the first request and the other one; not the repeat
    assert first.refused
    assert again.verdict is None
    assert again.error is not None
    assert again.error.startswith(first.error or "?")
    assert "(not re-sent: the server refused this same request" in again.error
    assert other.refused
    stats = client.pop_stats()
    assert (stats["judge/failed"], stats["judge/repeat_refusals"], stats["judge/calls"]) == (3, 1, 2)


def test_a_server_error_is_not_remembered() -> None:
    app = make_app(constant_judge, chaos=["500", "ok"])
    with running_server(app) as url:
        client = _client(url, max_retries=0)
        failed, ok = _judge(client), _judge(client)
    assert not failed.refused
    assert ok.verdict == CONSTANT_VERDICT  # a 5xx may pass next time: it is re-sent


def test_check_names_the_closest_listed_model_when_the_configured_one_is_not_listed() -> None:
    """The seed's YAML says "GPT-5"; the API's id is "gpt-5"."""
    app = make_app(constant_judge, strict=True, served_models=["gpt-5", "gpt-5-mini", "gpt-4o"])
    with running_server(app) as url, pytest.raises(JudgeUnavailable, match="model_not_found") as caught:
        _client(url, "GPT-5").check_sync()
    assert "GET /models does not list 'GPT-5'; did you mean 'gpt-5'" in str(caught.value)
    assert str(caught.value).endswith("(judge.model=gpt-5))")


def test_check_passes_on_an_unlisted_model_that_is_served_and_says_so() -> None:
    app = make_app(constant_judge, model_name="gpt-5")  # lists gpt-5, answers any model name
    with running_server(app) as url:
        said = _client(url, "gpt5").check_sync()
    assert "GET /models lists 1 model(s), not 'gpt5'; did you mean 'gpt-5'? (judge.model=gpt-5)" in said
    assert said.endswith("a test request with the judge's settings succeeded")
