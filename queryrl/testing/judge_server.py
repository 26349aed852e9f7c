"""An OpenAI-compatible chat server backed by a local judge function: offline runs and tests of the judge path.

    queryrl serve-judge --judge constant --port 8001          # serve("127.0.0.1", 8001, "constant")
    JudgeClient("http://127.0.0.1:8001/v1", "any-name", api_key_env=None)

Endpoints: ``POST /v1/chat/completions`` (``model``, ``messages``, ``temperature``, ``max_tokens`` /
``max_completion_tokens``, ...; other fields are accepted and ignored unless ``strict``; ``stream=true``
and ``n > 1`` are refused with 400), ``GET /v1/models``, ``GET /health``. Errors use OpenAI's body
``{"error": {"message", "type", "param", "code"}}``.

The reply is ``fn(messages)`` (sync functions run in a worker thread; ``async def`` is awaited; a dict
is sent as JSON). ``usage`` is approximate: :func:`approx_tokens` = ``ceil(characters / 4)`` of the text,
summed over the messages' contents for ``prompt_tokens``. A ``max_tokens`` limit cuts the reply to
``4 * max_tokens`` characters with ``finish_reason="length"``.

A reasoning model (``reasoning_tokens``, e.g. 512, or per ``reasoning_effort`` such as ``{"low": 200,
"high": 2000}``): every reply first spends that many hidden tokens, reported in
``usage.completion_tokens_details.reasoning_tokens`` and counted in ``completion_tokens``, out of the same
token limit. When reasoning uses the limit up the reply is empty (``content: ""``) with
``finish_reason: "length"``, as GPT-5 answers then.

Strict mode (``strict=True``): the request is checked as OpenAI's API checks it, and refused with its
status, message and ``param`` / ``code`` (:mod:`.openai_rules`). With ``api_key`` (either mode) every
route but ``GET /health`` (FastAPI's ``/docs`` and ``/openapi.json`` too) wants ``Authorization: Bearer
<api_key>`` (a bare key without ``Bearer`` is refused), answered as OpenAI answers it.
``list_models=False`` serves no ``/v1/models`` (404), like some servers.

Built-in judges (:func:`load_judge_function`). ``constant`` and ``length`` answer the query-rewrite
application's full rubric (``RUBRIC_VERDICT_SCHEMA``: every side has ``quality`` 0-16, ``relevance``,
``completeness``, ``retrieval`` 0-8 and their ``sum`` 0-40), so ``judge.backend=openai`` pointed at
them accepts every verdict (and so does the reward's
:data:`~queryrl.apps.query_rewrite.reward.judging.PAIRWISE_VERDICT_SCHEMA`, which needs only the sums):

- ``constant``: always a tie, 20 of 40 each (:data:`CONSTANT_VERDICT`);
- ``echo``: the last user message's text (no schema: for tests of the transport);
- ``length``: prefers the longer of two candidates found in the last user message -- the values of
  keys ``"8b"`` and ``"32b"`` of a JSON object in it, else the text after lines starting ``8b:`` and
  ``32b:`` (case-insensitive). Sums split 40 in proportion to the lengths (characters; a non-string
  value counts as its JSON text), each sum split 40/20/20/20 % over the four dimensions; equal
  lengths, or no candidates, give the constant tie.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import random
import re
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from queryrl.plugins import load_callable
from queryrl.rewards.json_extract import json_objects
from queryrl.service_auth import check_bind, resolve_token
from queryrl.service_limits import ServiceLimits, serve_app
from queryrl.testing.openai_rules import ServerRules, api_error

JudgeFn = Callable[[list[dict[str, Any]]], str | Awaitable[str]]

FAULTS = ("ok", "500", "429", "408", "409", "400", "garbage", "truncated", "slow")
GARBAGE_REPLY = "Both rewrites look reasonable to me; I would lean slightly towards the first one."
# the rubric's weights: quality 40 %, relevance, completeness, retrieval 20 % each, of a sum out of 40
RUBRIC_SHARES = {"quality": 0.4, "relevance": 0.2, "completeness": 0.2, "retrieval": 0.2}


def rubric_side(total: float) -> dict[str, float]:
    """One side of a rubric verdict whose dimensions split `total` (0-40) by the rubric's weights."""
    side = {name: round(total * share, 2) for name, share in RUBRIC_SHARES.items()}
    side["retrieval"] = round(total - side["quality"] - side["relevance"] - side["completeness"], 2)
    return side | {"sum": total}


CONSTANT_VERDICT: dict[str, Any] = {"better": "same", "score": {"8b": rubric_side(20), "32b": rubric_side(20)}}


@dataclass
class Chaos:
    """Faults to inject, for tests of the client.

    Request k (1-based) gets ``sequence[k-1]`` while the sequence lasts; after it, a fault drawn with
    ``rates`` (probabilities, the rest ``"ok"``) from a generator seeded with ``seed``. Faults:
    ``"500"``, ``"429"`` (with ``Retry-After: retry_after_s``), ``"408"``, ``"409"``, ``"400"``,
    ``"garbage"`` (prose, no JSON), ``"truncated"`` (the first half of the judge's reply), ``"slow"`` (reply
    after ``slow_s``; the wait ends early when the client hangs up), ``"ok"``.
    """

    sequence: Sequence[str] = ()
    rates: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0
    retry_after_s: float = 1.0
    slow_s: float = 10.0

    def __post_init__(self) -> None:
        unknown = (set(self.sequence) | set(self.rates)) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {', '.join(FAULTS)}")
        if sum(self.rates.values()) > 1.0 + 1e-9 or any(p < 0 for p in self.rates.values()):
            raise ValueError(f"fault rates must be >= 0 and sum to <= 1, got {dict(self.rates)}")
        self._rng = random.Random(self.seed)
        self._served = 0

    def next_fault(self) -> str:
        self._served += 1
        if self._served <= len(self.sequence):
            return self.sequence[self._served - 1]
        u = self._rng.random()
        for fault, p in self.rates.items():
            if u < p:
                return fault
            u -= p
        return "ok"


@dataclass
class ServerStats:
    """What the server saw (``app.state.stats``): for tests of the client."""

    requests: int = 0  # POST /v1/chat/completions received
    in_flight: int = 0
    max_in_flight: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    last_authorization: str | None = None  # the Authorization header of the latest request
    last_body: dict[str, Any] | None = None  # the latest well-formed request body
    refused: int = 0  # requests refused by the key or the strict rules
    model_lists: int = 0  # GET /v1/models received


def approx_tokens(text: str) -> int:
    """Approximate token count: ``ceil(len(text) / 4)``."""
    return math.ceil(len(text) / 4)


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text: the string content, or the ``text`` parts of a list content joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def make_app(
    judge_fn: JudgeFn,
    latency_ms: float = 0.0,
    chaos: Chaos | Sequence[str] | Mapping[str, float] | None = None,
    model_name: str = "queryrl-judge",
    *,
    strict: bool = False,
    api_key: str | None = None,
    served_models: Sequence[str] | None = None,
    list_models: bool = True,
    reasoning_tokens: int | Mapping[str, int] = 0,
) -> FastAPI:
    """The server app. `latency_ms` delays every successful reply; `chaos` (a :class:`Chaos`, or a
    sequence / rates mapping for one) injects faults; `model_name` is listed by ``/v1/models`` (with
    `served_models`, those are). `strict`, `api_key`, `served_models`, `list_models`, `reasoning_tokens`: see the
    module doc."""
    if chaos is not None and not isinstance(chaos, Chaos):
        chaos = Chaos(rates=chaos) if isinstance(chaos, Mapping) else Chaos(sequence=list(chaos))
    app = FastAPI(title="queryrl judge server")
    stats = app.state.stats = ServerStats()
    served = tuple(served_models) if served_models is not None else None
    rules = ServerRules(strict, api_key, served, reasoning_tokens)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    if api_key is not None:  # every other route too (FastAPI's /docs, /openapi.json): the key or 401

        @app.middleware("http")
        async def check_key(request: Request, call_next: Any) -> Any:
            path = request.url.path
            refused = (
                None
                if path == "/health" or path.startswith("/v1/")
                else rules.auth(request.headers.get("authorization"))
            )
            return refused if refused is not None else await call_next(request)

    if list_models:

        @app.get("/v1/models")
        async def models(request: Request) -> Any:
            stats.model_lists += 1
            refused = rules.auth(request.headers.get("authorization"))
            if refused is not None:
                return refused
            names = rules.served_models or (model_name,)
            entries = [{"id": n, "object": "model", "created": 0, "owned_by": "queryrl"} for n in names]
            return {"object": "list", "data": entries}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        stats.requests += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        stats.last_authorization = request.headers.get("authorization")
        try:
            refused = rules.auth(stats.last_authorization)
            if refused is not None:
                stats.refused += 1
                return refused
            return await _complete(request, judge_fn, latency_ms / 1000, chaos, stats, model_name, rules)
        finally:
            stats.in_flight -= 1

    return app


async def _complete(
    request: Request,
    judge_fn: JudgeFn,
    latency_s: float,
    chaos: Chaos | None,
    stats: ServerStats,
    model_name: str,
    rules: ServerRules,
) -> JSONResponse:
    try:
        body = await request.json()
    except ValueError:
        return api_error(400, "the request body is not JSON")
    problem = _check_body(body)
    if problem:
        return api_error(400, problem)
    stats.last_body = body
    refused = rules.check(body)
    if refused is not None:
        stats.refused += 1
        return refused
    fault = chaos.next_fault() if chaos is not None else "ok"
    stats.faults[fault] += 1
    if fault == "500":
        return api_error(500, "injected fault: internal server error", "server_error")
    if fault == "429":
        assert chaos is not None
        headers = {"Retry-After": f"{chaos.retry_after_s:g}"}
        return api_error(429, "injected fault: rate limited", "rate_limit_error", headers)
    if fault == "400":
        return api_error(400, "injected fault: bad request")
    if fault in ("408", "409"):
        return api_error(int(fault), f"injected fault: HTTP {fault}", "server_error")
    if fault == "slow" and chaos is not None and await _sleep_unless_gone(request, chaos.slow_s):
        return api_error(504, "the client hung up")
    if latency_s > 0:
        await _sleep_unless_gone(request, latency_s)
    messages: list[dict[str, Any]] = body["messages"]
    try:
        content = await _call_judge(judge_fn, messages)
    except Exception as e:
        return api_error(500, f"judge function failed: {type(e).__name__}: {e}", "server_error")
    if fault == "garbage":
        content = GARBAGE_REPLY
    elif fault == "truncated":
        content = content[: max(1, len(content) // 2)]
    return _completion(body, messages, content, model_name, rules.reasoning_tokens)


def _completion(
    body: dict[str, Any],
    messages: list[dict[str, Any]],
    content: str,
    model_name: str,
    reasoning: int | Mapping[str, int] = 0,
) -> JSONResponse:
    """The chat.completion reply carrying `content` after `reasoning` hidden tokens (the module doc), cut at
    the request's token limit (finish_reason ``length``), with approximate token usage."""
    finish_reason = "stop"
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    spent = reasoning.get(str(body.get("reasoning_effort")), 0) if isinstance(reasoning, Mapping) else reasoning
    if isinstance(limit, int):
        spent = min(spent, limit)
        if approx_tokens(content) > limit - spent:
            content, finish_reason = content[: 4 * (limit - spent)], "length"
    prompt_tokens = sum(approx_tokens(message_text(m)) for m in messages)
    completion_tokens = spent + approx_tokens(content)
    details = {"completion_tokens_details": {"reasoning_tokens": spent}} if reasoning else {}
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}
    return JSONResponse(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or model_name,
            "choices": [{**choice, "logprobs": None}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                **details,
            },
        }
    )


def _check_body(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "each message must be an object with a 'role'"
    if body.get("stream"):
        return "streaming is not supported by this server"
    if body.get("n", 1) != 1:
        return "only n=1 is supported by this server"
    return None


async def _call_judge(judge_fn: JudgeFn, messages: list[dict[str, Any]]) -> str:
    if inspect.iscoroutinefunction(judge_fn):
        out: Any = await judge_fn(messages)
    else:
        out = await run_in_threadpool(judge_fn, messages)
        if inspect.isawaitable(out):
            out = await out
    if isinstance(out, dict):
        return json.dumps(out, ensure_ascii=False)
    if not isinstance(out, str):
        raise TypeError(f"a judge function must return str (or a dict), got {type(out).__name__}")
    return out


async def _sleep_unless_gone(request: Request, seconds: float) -> bool:
    """Sleep `seconds`, polling for a disconnect; True if the client went away."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(0.05, left))
        if await request.is_disconnected():
            return True
    return False


# --- built-in judges -----------------------------------------------------------------------------


def constant_judge(messages: list[dict[str, Any]]) -> str:
    """Always a tie, 20 each."""
    return json.dumps(CONSTANT_VERDICT)


def echo_judge(messages: list[dict[str, Any]]) -> str:
    """The last user message's text ("" when there is none)."""
    users = [m for m in messages if m.get("role") == "user"]
    return message_text(users[-1]) if users else ""


_CANDIDATE_LINE = re.compile(r"^[ \t]*(8b|32b)[ \t]*[:：]", re.IGNORECASE | re.MULTILINE)


def length_judge(messages: list[dict[str, Any]]) -> str:
    """The longer candidate wins; sums split 40 by length (see the module doc)."""
    lengths = _candidate_lengths(echo_judge(messages))
    if lengths is None or lengths[0] == lengths[1]:
        return json.dumps(CONSTANT_VERDICT)
    a, b = lengths
    sum_8b = round(40 * a / (a + b))
    sides = {"8b": rubric_side(sum_8b), "32b": rubric_side(40 - sum_8b)}
    verdict = {"better": "8b" if a > b else "32b", "score": sides}
    return json.dumps(verdict)


def _candidate_lengths(text: str) -> tuple[int, int] | None:
    """(len of the 8b candidate, len of the 32b candidate), or None when the text has no pair."""
    for obj in json_objects(text):
        if "8b" in obj and "32b" in obj:
            a, b = (v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in (obj["8b"], obj["32b"]))
            return len(a), len(b)
    sections: dict[str, str] = {}
    marks = list(_CANDIDATE_LINE.finditer(text))
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        sections.setdefault(m.group(1).lower(), text[m.end() : end].strip())
    if "8b" in sections and "32b" in sections:
        return len(sections["8b"]), len(sections["32b"])
    return None


BUILTIN_JUDGES: dict[str, JudgeFn] = {"constant": constant_judge, "echo": echo_judge, "length": length_judge}


def load_judge_function(spec: str) -> JudgeFn:
    """A judge function from a built-in name, ``path/to/file.py:function`` or ``package.module:function``.

    Raises:
        PluginError: (a ``ValueError``) unknown name, missing file or module, missing or non-callable attribute.
    """
    return cast(JudgeFn, load_callable(spec, what="judge", builtins=BUILTIN_JUDGES))


# --- running it ------------------------------------------------------------------------------------


def serve(
    host: str,
    port: int,
    judge: str,
    latency_ms: float = 0.0,
    strict: bool = False,
    api_key_env: str | None = None,
    token: str | None = None,
    reasoning_tokens: int = 0,
    limits: ServiceLimits | None = None,
) -> None:
    """Serve `judge` until interrupted (blocking), under `limits` (:mod:`queryrl.service_limits`; default:
    its defaults: 256 connections, 10 s for a request header, 1 MiB bodies).

    Args:
        host: interface to bind, e.g. ``127.0.0.1`` (this machine only) or ``0.0.0.0`` (every interface:
            then a key is required, :func:`queryrl.service_auth.check_bind`).
        port: TCP port; clients use ``base_url=http://<host>:<port>/v1``.
        judge: a built-in judge name (``constant``, ``echo``, ``length``), ``path/to/file.py:function`` or
            ``package.module:function``; the function takes the chat messages and returns the reply text.
        latency_ms: extra delay added to every reply, milliseconds (to mimic a remote API).
        strict: refuse what OpenAI's API refuses (see the module doc), to rehearse a GPT-5 judge offline.
        api_key_env: an environment variable holding the key clients must send (None: any key).
        token: the key itself (instead of `api_key_env`; visible in ``ps`` when given on a command line).
        reasoning_tokens: hidden tokens each reply spends first, out of the request's limit (the module doc).

    Raises:
        ValueError: the variable is unset, both are given, or a non-loopback `host` has no key
            (:class:`~queryrl.service_auth.TokenError`), or `reasoning_tokens` < 0, before anything is bound.
    """
    if reasoning_tokens < 0:
        raise ValueError(f"serve-judge: --reasoning-tokens must be >= 0, got {reasoning_tokens}")
    api_key = resolve_token(token, api_key_env, "serve-judge")
    check_bind(host, api_key, "serve-judge")
    fn = load_judge_function(judge)
    app = make_app(fn, latency_ms=latency_ms, strict=strict, api_key=api_key, reasoning_tokens=reasoning_tokens)
    serve_app(app, host, port, limits or ServiceLimits(), "serve-judge")


@contextmanager
def running_server(app: FastAPI, startup_timeout_s: float = 10.0, max_lifetime_s: float = 300.0) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 (a free port) in a background thread; yields the base URL (``.../v1``).

    The server stops when the block exits, or after `max_lifetime_s` whatever happens.
    """
    # IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets whose proto says TCP; with proto 0 every reply on a
    # kept-alive connection waited ~40 ms (Nagle against the client's delayed ACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"judge-server-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"judge server on 127.0.0.1:{port} did not start within {startup_timeout_s} s")
        time.sleep(0.01)
    timer = threading.Timer(max_lifetime_s, lambda: setattr(server, "should_exit", True))
    timer.daemon = True
    timer.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        timer.cancel()
        server.should_exit = True
        thread.join(timeout=5.0)
        sock.close()
