"""JudgeClient through the official openai SDK against judge_server over loopback HTTP: verdicts, usage,
cache, retries and faults, the concurrency bound, the API key's secrecy, and the metrics the trainer logs."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from queryrl.apps.query_rewrite.reward.judging import PAIRWISE_VERDICT_SCHEMA
from queryrl.rewards.judge import (
    JudgeClient,
    JudgeConfigError,
    JudgeResult,
    collect_judge_metrics,
)
from queryrl.testing.judge_server import (
    CONSTANT_VERDICT,
    GARBAGE_REPLY,
    Chaos,
    ServerStats,
    approx_tokens,
    constant_judge,
    make_app,
    running_server,
)

SECRET = "sk-secret-123"
MESSAGES = [
    {"role": "system", "content": "You compare two query rewrites and answer in JSON."},
    {"role": "user", "content": "8b: 红色连衣裙的价格\n32b: 连衣裙价格"},
]


def _client(base_url: str, **kwargs: Any) -> JudgeClient:
    options: dict[str, Any] = {"api_key_env": None, "backoff_base_s": 0.01, "timeout_s": 5.0, **kwargs}
    return JudgeClient(base_url, "judge-model", **options)


def _judge(client: JudgeClient, *calls: tuple[list[dict[str, Any]], dict[str, Any] | None]) -> list[JudgeResult]:
    """Run judge() calls concurrently in a fresh event loop, closing the client's connections after."""

    async def main() -> list[JudgeResult]:
        try:
            return list(await asyncio.gather(*(client.judge(m, s) for m, s in calls)))
        finally:
            await client.aclose()

    return asyncio.run(main())


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def server_stats() -> Iterator[tuple[str, ServerStats]]:
    """A constant-judge server: (base_url, what it saw)."""
    app = make_app(constant_judge)
    with running_server(app) as url:
        yield url, app.state.stats


def test_verdict_usage_and_cache(server_stats: tuple[str, ServerStats], tmp_path: Path) -> None:
    url, seen = server_stats
    client = _client(url, cache_dir=tmp_path)
    (first,) = _judge(client, (MESSAGES, PAIRWISE_VERDICT_SCHEMA))
    assert first.verdict == CONSTANT_VERDICT
    assert first.error is None
    assert not first.cached
    assert first.raw == json.dumps(CONSTANT_VERDICT)
    # the server's approximate usage, as reported by the API's `usage`
    assert first.prompt_tokens == sum(approx_tokens(m["content"]) for m in MESSAGES)
    assert first.completion_tokens == approx_tokens(json.dumps(CONSTANT_VERDICT))
    assert first.latency_s > 0
    assert seen.requests == 1

    (second,) = _judge(client, (MESSAGES, PAIRWISE_VERDICT_SCHEMA))
    assert second.cached
    assert second.verdict == first.verdict
    assert second.prompt_tokens == first.prompt_tokens  # what the cached verdict cost when it was made
    assert seen.requests == 1  # no HTTP request

    (third,) = _judge(client, (_user("something else"), PAIRWISE_VERDICT_SCHEMA))
    assert not third.cached
    assert seen.requests == 2
    assert len(list(tmp_path.rglob("*.json"))) == 2

    stats = client.pop_stats()
    assert stats["judge/requests"] == 3
    assert stats["judge/calls"] == 2
    assert stats["judge/cache_hits"] == 1
    assert stats["judge/retries"] == 0
    assert stats["judge/failed"] == 0
    assert stats["judge/prompt_tokens"] == first.prompt_tokens + third.prompt_tokens  # the cache hit spent none
    assert stats["judge/completion_tokens"] == first.completion_tokens + third.completion_tokens
    assert stats["judge/latency_s"] > 0
    assert stats["judge/latency_s_mean"] == pytest.approx(stats["judge/latency_s"] / 2)
    assert client.pop_stats()["judge/requests"] == 0  # popped means reset


def test_cache_key_covers_the_whole_request(tmp_path: Path) -> None:
    base = JudgeClient("http://h/v1", "m", cache_dir=tmp_path)
    key = base.cache_key(MESSAGES, PAIRWISE_VERDICT_SCHEMA)
    assert key == JudgeClient("http://h/v1/", "m").cache_key(MESSAGES, PAIRWISE_VERDICT_SCHEMA)  # same request
    variants = [
        JudgeClient("http://other/v1", "m").cache_key(MESSAGES, PAIRWISE_VERDICT_SCHEMA),
        JudgeClient("http://h/v1", "m2").cache_key(MESSAGES, PAIRWISE_VERDICT_SCHEMA),
        JudgeClient("http://h/v1", "m", temperature=0.7).cache_key(MESSAGES, PAIRWISE_VERDICT_SCHEMA),
        JudgeClient("http://h/v1", "m", max_tokens=64).cache_key(MESSAGES, PAIRWISE_VERDICT_SCHEMA),
        JudgeClient("http://h/v1", "m", extra_body={"seed": 1}).cache_key(MESSAGES, PAIRWISE_VERDICT_SCHEMA),
        base.cache_key(MESSAGES, None),
        base.cache_key([*MESSAGES[:1], {"role": "user", "content": "8b: x\n32b: y"}], PAIRWISE_VERDICT_SCHEMA),
    ]
    assert len({key, *variants}) == 1 + len(variants)


def test_corrupt_cache_file_is_ignored_and_overwritten(server_stats: tuple[str, ServerStats], tmp_path: Path) -> None:
    url, seen = server_stats
    client = _client(url, cache_dir=tmp_path)
    path = tmp_path / (key := client.cache_key(MESSAGES))[:2] / f"{key}.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"verdict": {"better": "8b"', encoding="utf-8")  # torn write
    (result,) = _judge(client, (MESSAGES, None))
    assert result.verdict == CONSTANT_VERDICT
    assert not result.cached
    assert seen.requests == 1
    assert json.loads(path.read_text(encoding="utf-8"))["verdict"] == CONSTANT_VERDICT
    assert _judge(client, (MESSAGES, None))[0].cached


def test_server_errors_are_retried_until_success() -> None:
    app = make_app(constant_judge, chaos=["500", "500", "ok"])
    with running_server(app) as url:
        client = _client(url, max_retries=3)
        (result,) = _judge(client, (MESSAGES, PAIRWISE_VERDICT_SCHEMA))
    assert result.verdict == CONSTANT_VERDICT
    assert app.state.stats.requests == 3
    stats = client.pop_stats()
    assert (stats["judge/calls"], stats["judge/retries"], stats["judge/failed"]) == (3, 2, 0)


def test_server_errors_beyond_max_retries_fail() -> None:
    app = make_app(constant_judge, chaos=["500"] * 5)
    with running_server(app) as url:
        client = _client(url, max_retries=2)
        (result,) = _judge(client, (MESSAGES, None))
    assert result.verdict is None
    assert result.raw is None
    assert result.error is not None
    assert result.error.startswith("call failed after 3 attempt(s): HTTP 500")
    assert app.state.stats.requests == 3
    stats = client.pop_stats()
    assert (stats["judge/calls"], stats["judge/retries"], stats["judge/failed"]) == (3, 2, 1)


def test_rate_limit_honours_retry_after() -> None:
    app = make_app(constant_judge, chaos=Chaos(sequence=["429"], retry_after_s=0.4))
    with running_server(app) as url:
        client = _client(url, backoff_base_s=0.001)  # the backoff alone would wait ~1 ms
        start = time.perf_counter()
        (result,) = _judge(client, (MESSAGES, None))
        elapsed = time.perf_counter() - start
    assert result.verdict == CONSTANT_VERDICT
    assert elapsed >= 0.4
    assert client.pop_stats()["judge/retries"] == 1


def test_retry_after_is_capped() -> None:
    app = make_app(constant_judge, chaos=Chaos(sequence=["429"], retry_after_s=60))
    with running_server(app) as url:
        client = _client(url, retry_after_max_s=0.05)
        start = time.perf_counter()
        (result,) = _judge(client, (MESSAGES, None))
    assert result.verdict == CONSTANT_VERDICT
    assert time.perf_counter() - start < 5


def test_client_errors_are_not_retried() -> None:
    app = make_app(constant_judge, chaos=["400", "ok"])
    with running_server(app) as url:
        client = _client(url, max_retries=3)
        (result,) = _judge(client, (MESSAGES, None))
    assert result.verdict is None
    assert result.error is not None
    assert result.error.startswith("call failed after 1 attempt(s): HTTP 400")
    assert app.state.stats.requests == 1
    assert client.pop_stats()["judge/retries"] == 0


@pytest.mark.parametrize("fault", ["garbage", "truncated"])
def test_unparseable_reply_fails_and_is_not_cached(fault: str, tmp_path: Path) -> None:
    app = make_app(constant_judge, chaos=[fault, "ok"])
    with running_server(app) as url:
        client = _client(url, cache_dir=tmp_path)
        (result,) = _judge(client, (MESSAGES, PAIRWISE_VERDICT_SCHEMA))
        assert result.verdict is None  # failed: no neutral 0.5, no made-up tie
        assert result.error is not None
        assert result.error.startswith("unparseable verdict")
        full = json.dumps(CONSTANT_VERDICT)
        assert result.raw == (GARBAGE_REPLY if fault == "garbage" else full[: len(full) // 2])
        assert result.completion_tokens > 0  # the tokens were still spent
        assert list(tmp_path.rglob("*.json")) == []
        (again,) = _judge(client, (MESSAGES, PAIRWISE_VERDICT_SCHEMA))
    assert again.verdict == CONSTANT_VERDICT
    assert not again.cached
    assert app.state.stats.requests == 2  # the parse failure was not retried; the second call went out
    stats = client.pop_stats()
    assert (stats["judge/failed"], stats["judge/invalid"], stats["judge/retries"]) == (1, 1, 0)


def test_schema_invalid_verdict_fails() -> None:
    app = make_app(lambda messages: '{"better": "maybe", "score": {}}')  # the whole reply (test_verdict_reply.py)
    with running_server(app) as url:
        client = _client(url)
        strict, loose = _judge(client, (MESSAGES, PAIRWISE_VERDICT_SCHEMA), (_user("no schema"), None))
    assert strict.verdict is None
    assert strict.error is not None
    assert strict.error.startswith("schema-invalid verdict: $.better: 'maybe' is not one of")
    assert loose.verdict == {"better": "maybe", "score": {}}


def test_slow_replies_time_out_retry_then_fail() -> None:
    app = make_app(constant_judge, chaos=Chaos(sequence=["slow", "slow"], slow_s=3.0))
    with running_server(app) as url:
        client = _client(url, timeout_s=0.3, max_retries=1)
        start = time.perf_counter()
        (result,) = _judge(client, (MESSAGES, None))
        elapsed = time.perf_counter() - start
    assert result.verdict is None
    assert result.error == "call failed after 2 attempt(s): timed out after 0.3 s"
    assert 0.6 <= elapsed < 3.0  # two 0.3 s timeouts, not two 3 s replies
    assert app.state.stats.requests == 2
    stats = client.pop_stats()
    assert (stats["judge/calls"], stats["judge/retries"], stats["judge/failed"]) == (2, 1, 1)
    assert 0.6 <= stats["judge/latency_s"] < 1.5  # the time spent in both attempts


def test_connection_refused_is_retried_then_fails() -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = _client(f"http://127.0.0.1:{port}/v1", max_retries=2)
    (result,) = _judge(client, (MESSAGES, None))
    assert result.verdict is None
    assert result.error is not None
    assert result.error.startswith("call failed after 3 attempt(s): connection error")
    assert client.pop_stats()["judge/calls"] == 3


def test_concurrency_is_bounded() -> None:
    app = make_app(constant_judge, latency_ms=100)
    with running_server(app) as url:
        client = _client(url, max_concurrency=2)
        start = time.perf_counter()
        results = _judge(client, *((_user(f"rewrite {i}"), None) for i in range(8)))
        elapsed = time.perf_counter() - start
    assert all(r.verdict == CONSTANT_VERDICT for r in results)
    assert app.state.stats.requests == 8
    assert app.state.stats.max_in_flight == 2
    assert elapsed >= 4 * 0.1  # 8 requests, 2 at a time


def test_api_key_is_sent_and_kept_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("QUERYRL_TEST_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    app = make_app(constant_judge, chaos=["ok", "500", "500"])
    with running_server(app) as url:
        client = _client(url, api_key_env="QUERYRL_TEST_KEY", cache_dir=tmp_path, max_retries=1)
        (ok,) = _judge(client, (MESSAGES, None))
        (failed,) = _judge(client, (_user("fails"), None))
    assert app.state.stats.last_authorization == f"Bearer {SECRET}"
    assert ok.verdict == CONSTANT_VERDICT
    assert failed.verdict is None
    texts = [repr(client), str(client), repr(ok), repr(failed), caplog.text]
    texts += [p.read_text(encoding="utf-8") for p in tmp_path.rglob("*") if p.is_file()]
    assert len(texts) == 5 + 1  # one cache file
    assert "HTTP Request: POST" in caplog.text  # the SDK's debug logs were captured too
    assert all(SECRET not in text for text in texts)


def test_api_key_echoed_by_a_server_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_TEST_KEY", SECRET)
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def leaky(request: Request) -> JSONResponse:
        message = f"bad key {request.headers['authorization']}"
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=401)

    with running_server(app) as url:
        (result,) = _judge(_client(url, api_key_env="QUERYRL_TEST_KEY"), (MESSAGES, None))
    assert result.error == "call failed after 1 attempt(s): HTTP 401: bad key Bearer <redacted>"


def test_missing_api_key_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, server_stats: tuple[str, ServerStats]
) -> None:
    url, seen = server_stats
    monkeypatch.delenv("QUERYRL_TEST_KEY", raising=False)
    client = _client(url, api_key_env="QUERYRL_TEST_KEY")
    with pytest.raises(JudgeConfigError, match="environment variable QUERYRL_TEST_KEY is not set"):
        _judge(client, (MESSAGES, None))
    assert seen.requests == 0
    # no key at all: a placeholder goes out (local servers accept any key)
    assert _judge(_client(url, api_key_env=None), (MESSAGES, None))[0].verdict == CONSTANT_VERDICT
    assert seen.last_authorization == "Bearer EMPTY"


def test_usage_absent_counts_zero() -> None:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def no_usage(request: Request) -> dict[str, Any]:
        message = {"role": "assistant", "content": '{"better": "8b"}'}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "message": message, "finish_reason": "stop"}
        ]}  # fmt: skip

    with running_server(app) as url:
        client = _client(url)
        (result,) = _judge(client, (MESSAGES, None))
    assert result.verdict == {"better": "8b"}
    assert (result.prompt_tokens, result.completion_tokens) == (0, 0)
    assert client.pop_stats()["judge/prompt_tokens"] == 0


def test_collect_judge_metrics_sums_clients_and_resets(server_stats: tuple[str, ServerStats]) -> None:
    url, _ = server_stats
    collect_judge_metrics()  # drain clients left alive by earlier tests
    one, two = _client(url), _client(url)
    _judge(one, (_user("a"), None))
    _judge(two, (_user("b"), None), (_user("c"), None))
    metrics = collect_judge_metrics()
    assert metrics["judge/requests"] == 3
    assert metrics["judge/calls"] == 3
    assert metrics["judge/prompt_tokens"] == 3  # ceil(1 / 4) each
    assert metrics["judge/latency_s_mean"] == pytest.approx(metrics["judge/latency_s"] / 3)
    again = collect_judge_metrics()
    assert again["judge/requests"] == 0
    assert one.pop_stats()["judge/calls"] == 0  # collected means popped


def test_judge_sync(server_stats: tuple[str, ServerStats]) -> None:
    url, _ = server_stats
    client = _client(url)
    assert client.judge_sync(MESSAGES, PAIRWISE_VERDICT_SCHEMA).verdict == CONSTANT_VERDICT
    assert client.judge_sync(MESSAGES).verdict == CONSTANT_VERDICT  # a second loop gets its own connections

    async def inside_a_loop() -> None:
        client.judge_sync(MESSAGES)

    with pytest.raises(RuntimeError, match="running event loop"):
        asyncio.run(inside_a_loop())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        JudgeClient("http://h/v1", "m", max_concurrency=0)
