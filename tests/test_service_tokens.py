"""Tokens for serve-rag / serve-judge (issue 14 item 14): who must have one, what the servers refuse, what clients send.

Servers bind 127.0.0.1 only: the "needs a token" refusal for other addresses is checked through
the function that decides and through the CLI with ``uvicorn.run`` and ``uvicorn.Server.run`` replaced by a tripwire.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from queryrl import redaction
from queryrl.apps.query_rewrite.config import settings_of
from queryrl.apps.query_rewrite.reward.rag import rag_client
from queryrl.cli import app as cli_app
from queryrl.config import load_config
from queryrl.rag import BM25Index, Document, RAGClient, make_app
from queryrl.rag.client import RAGError
from queryrl.service_auth import TokenError, bearer_matches, check_bind, resolve_token
from queryrl.testing import judge_server
from queryrl.testing.judge_server import constant_judge, running_server
from tests.loopback import CHAT_8B_REQUEST

TOKEN_ENV = "QUERYRL_TEST_SERVICE_TOKEN"


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    value = secrets.token_urlsafe(24)
    monkeypatch.setenv(TOKEN_ENV, value)
    yield value
    redaction.clear_secrets()


@pytest.fixture
def no_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that gets as far as binding fails the test instead (tests never bind 0.0.0.0)."""

    def tripwire(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"the server was about to bind: {kwargs.get('host')}")

    def server_tripwire(server: uvicorn.Server, *args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"the server was about to bind: {server.config.host}")

    monkeypatch.setattr(uvicorn, "run", tripwire)
    monkeypatch.setattr(uvicorn.Server, "run", server_tripwire)  # queryrl.service_limits.serve_app runs a Server


@pytest.fixture
def rag_service(token: str) -> Iterator[str]:
    docs = [Document("policy-return", "退货政策", "七天无理由退货。", {}), Document("ship", "配送", "全国包邮。", {})]
    with running_server(make_app(BM25Index(docs), token=token), max_lifetime_s=60) as url:
        yield url.removesuffix("/v1")


# ---- who needs a token ----


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_addresses_need_no_token(host: str) -> None:
    check_bind(host, None, "serve-rag")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "example.com", ""])
def test_any_other_address_needs_a_token(host: str) -> None:
    with pytest.raises(TokenError, match=r"serve-rag: binding .* needs a token .*--token-env VAR.*`ps`"):
        check_bind(host, None, "serve-rag")
    with pytest.raises(TokenError, match="use at least 16"):
        check_bind(host, "short-token", "serve-rag")
    check_bind(host, secrets.token_urlsafe(24), "serve-rag")


def test_a_token_comes_from_one_place_and_is_redacted(token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_token(None, TOKEN_ENV, "serve-rag") == token
    assert redaction.redact(f"header Bearer {token}") == f"header Bearer {redaction.PLACEHOLDER}"
    assert resolve_token(None, None, "serve-rag") is None
    with pytest.raises(TokenError, match="not both"):
        resolve_token("x" * 20, TOKEN_ENV, "serve-rag")
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(TokenError, match=f"environment variable {TOKEN_ENV} is not set or empty"):
        resolve_token(None, TOKEN_ENV, "serve-rag")


def test_bearer_comparison() -> None:
    assert bearer_matches("Bearer abcdefghijklmnop", "abcdefghijklmnop")
    assert not bearer_matches("Bearer abcdefghijklmnoq", "abcdefghijklmnop")
    assert not bearer_matches(None, "abcdefghijklmnop")
    assert not bearer_matches("Bearer 令牌", "abcdefghijklmnop")  # non-ASCII does not raise
    assert bearer_matches("bearer abcdefghijklmnop", "abcdefghijklmnop")  # the scheme in any case (RFC 7235)
    assert not bearer_matches("abcdefghijklmnop", "abcdefghijklmnop")  # a bare token is not a bearer token
    assert not bearer_matches("Basic abcdefghijklmnop", "abcdefghijklmnop")


# ---- the CLI refuses before loading or binding anything ----


@pytest.mark.parametrize("command", [["serve-rag", "--corpus", "missing.jsonl"], ["serve-judge"]])
def test_the_cli_refuses_a_public_address_without_a_token(command: list[str], no_bind: None) -> None:
    result = CliRunner().invoke(cli_app, [*command, "--host", "0.0.0.0"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert "binding 0.0.0.0 (not a loopback address) needs a token" in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [["serve-rag", "--corpus", "missing.jsonl"], ["serve-judge"]])
def test_the_cli_names_an_unset_token_variable(
    command: list[str], no_bind: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    result = CliRunner().invoke(cli_app, [*command, "--token-env", TOKEN_ENV])
    assert result.exit_code == 2
    assert f"environment variable {TOKEN_ENV} is not set or empty" in result.output


def test_serve_judge_with_a_token_gets_as_far_as_binding(token: str, no_bind: None) -> None:
    with pytest.raises(AssertionError, match=r"about to bind: 0\.0\.0\.0"):
        judge_server.serve("0.0.0.0", 8300, "constant", api_key_env=TOKEN_ENV)


def test_serve_rag_with_a_token_gets_as_far_as_binding(token: str, no_bind: None, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"doc_id": "d1", "title": "退货", "content": "七天无理由退货。"}\n', encoding="utf-8")
    result = CliRunner().invoke(
        cli_app, ["serve-rag", "--corpus", str(corpus), "--host", "0.0.0.0", "--token-env", TOKEN_ENV]
    )
    assert isinstance(result.exception, AssertionError)
    assert "about to bind: 0.0.0.0" in str(result.exception)


# ---- the servers want the token; /health stays open ----


def test_the_rag_service_wants_the_bearer_token(rag_service: str, token: str) -> None:
    with httpx.Client(timeout=10) as http:
        refused = http.post(f"{rag_service}/rag/chat_8b", json=CHAT_8B_REQUEST)
        wrong = http.post(
            f"{rag_service}/rag/chat_8b", json=CHAT_8B_REQUEST, headers={"Authorization": "Bearer " + "x" * 32}
        )
        docs = http.get(f"{rag_service}/docs")
        bare = http.post(f"{rag_service}/rag/chat_8b", json=CHAT_8B_REQUEST, headers={"Authorization": token})
        health = http.get(f"{rag_service}/health")
        ok = http.post(f"{rag_service}/rag/chat_8b", json=CHAT_8B_REQUEST, headers={"Authorization": f"Bearer {token}"})
    assert (refused.status_code, wrong.status_code, docs.status_code, bare.status_code) == (401, 401, 401, 401)
    assert refused.headers["www-authenticate"] == "Bearer"
    assert "token_env" in refused.json()["detail"]
    assert token not in refused.text + wrong.text
    assert health.status_code == 200  # status only: load balancers and preflight checks need no secret
    assert ok.status_code == 200
    assert ok.json()["response"][0]["doc_id"] == "policy-return"


def test_the_rag_client_sends_the_token_from_its_variable(rag_service: str, token: str) -> None:
    async def call(client: RAGClient) -> dict[str, Any]:
        try:
            return await client.chat_8b(**CHAT_8B_REQUEST)
        finally:
            await client.aclose()

    assert asyncio.run(call(RAGClient(rag_service, token_env=TOKEN_ENV)))["status"] == "success"
    with pytest.raises(RAGError, match="HTTP 401"):
        asyncio.run(call(RAGClient(rag_service, max_retries=0)))
    assert redaction.redact(token) == redaction.PLACEHOLDER


def test_an_unset_client_token_variable_is_an_error_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(TokenError, match=f"app.query_rewrite.rag.token_env: environment variable {TOKEN_ENV}"):
        RAGClient("http://127.0.0.1:9", token_env=TOKEN_ENV)


def test_the_config_key_reaches_the_query_rewrite_reward_client(rag_service: str, token: str) -> None:
    cfg = load_config(
        None,
        [
            "app.query_rewrite.enable=true",
            f"app.query_rewrite.rag.url={rag_service}",
            f"app.query_rewrite.rag.token_env={TOKEN_ENV}",
        ],
    )
    settings = settings_of(cfg)
    assert settings.rag.token_env == TOKEN_ENV
    redaction.clear_secrets()
    assert TOKEN_ENV in redaction.register_config_secrets(cfg)  # the run's logs redact its value
    assert redaction.redact(token) == redaction.PLACEHOLDER
    client = rag_client(settings.rag)
    assert asyncio.run(client.chat_8b(**CHAT_8B_REQUEST))["status"] == "success"


def test_the_judge_server_compares_keys_and_keeps_health_open(token: str) -> None:
    app = judge_server.make_app(constant_judge, api_key=token)
    with running_server(app, max_lifetime_s=60) as url, httpx.Client(timeout=10) as http:
        wrong = http.get(f"{url}/models", headers={"Authorization": "Bearer " + _wrong(token)})
        ok = http.get(f"{url}/models", headers={"Authorization": f"Bearer {token}"})
        health = http.get(url.removesuffix("/v1") + "/health")
        bare = http.get(f"{url}/models", headers={"Authorization": token})
        root = url.removesuffix("/v1")
        docs, schema = http.get(f"{root}/docs"), http.get(f"{root}/openapi.json")
        docs_ok = http.get(f"{root}/openapi.json", headers={"Authorization": f"Bearer {token}"})
    assert (wrong.status_code, ok.status_code, health.status_code) == (401, 200, 200)
    assert bare.status_code == 401
    assert "Bearer" in bare.json()["error"]["message"]
    assert (docs.status_code, schema.status_code, docs_ok.status_code) == (401, 401, 200)
    assert token not in bare.text + docs.text + schema.text


def _wrong(token: str) -> str:
    """`token` with its last character changed: certainly another key (a token ending in "x" stays wrong)."""
    return token[:-1] + ("y" if token.endswith("x") else "x")
