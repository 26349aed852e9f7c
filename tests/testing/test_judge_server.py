"""The OpenAI-compatible judge server over real HTTP: response shape, errors, faults, built-in judges, loading."""

from __future__ import annotations

import json
import socket
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from queryrl.testing.judge_server import (
    BUILTIN_JUDGES,
    CONSTANT_VERDICT,
    GARBAGE_REPLY,
    Chaos,
    constant_judge,
    echo_judge,
    length_judge,
    load_judge_function,
    make_app,
    message_text,
    rubric_side,
    running_server,
)

MESSAGES = [{"role": "system", "content": "judge"}, {"role": "user", "content": "hello there, judge"}]


def _post(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=5.0)


def test_chat_completion_shape() -> None:
    app = make_app(echo_judge, model_name="served-name")
    with running_server(app) as url:
        reply = _post(url, {"model": "asked-name", "messages": MESSAGES, "temperature": 0.0, "seed": 3})
        models = httpx.get(f"{url}/models", timeout=5.0).json()
        health = httpx.get(url.removesuffix("/v1") + "/health", timeout=5.0).json()
    assert reply.status_code == 200
    body = reply.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert abs(body["created"] - time.time()) < 60
    assert body["model"] == "asked-name"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello there, judge"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    # ceil(chars / 4): "judge" -> 2, "hello there, judge" (18 chars) -> 5
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    assert models == {
        "object": "list",
        "data": [{"id": "served-name", "object": "model", "created": 0, "owned_by": "queryrl"}],
    }
    assert health == {"status": "ok"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m"}, "'messages' must be a non-empty list"),
        ({"messages": [{"content": "no role"}]}, "each message must be an object with a 'role'"),
        ({"messages": MESSAGES, "stream": True}, "streaming is not supported"),
        ({"messages": MESSAGES, "n": 2}, "only n=1"),
    ],
)
def test_bad_requests_get_openai_errors(body: dict[str, Any], message: str) -> None:
    app = make_app(constant_judge)
    with running_server(app) as url:
        reply = _post(url, body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert message in error["message"]


def test_max_tokens_cuts_the_reply() -> None:
    app = make_app(constant_judge)
    with running_server(app) as url:
        reply = _post(url, {"messages": MESSAGES, "max_tokens": 3}).json()
        wide = _post(url, {"messages": MESSAGES, "max_completion_tokens": 100}).json()
    assert reply["choices"][0]["message"]["content"] == json.dumps(CONSTANT_VERDICT)[:12]
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 3
    assert wide["choices"][0]["finish_reason"] == "stop"


def test_faults_in_sequence_then_ok() -> None:
    chaos = Chaos(sequence=["500", "429", "400", "garbage", "truncated", "ok"], retry_after_s=2.5)
    app = make_app(constant_judge, chaos=chaos)
    with running_server(app) as url:
        replies = [_post(url, {"messages": MESSAGES}) for _ in range(7)]
    assert [r.status_code for r in replies] == [500, 429, 400, 200, 200, 200, 200]
    assert replies[1].headers["retry-after"] == "2.5"
    contents = [r.json()["choices"][0]["message"]["content"] for r in replies[3:]]
    full = json.dumps(CONSTANT_VERDICT)
    assert contents == [GARBAGE_REPLY, full[: len(full) // 2], full, full]
    assert app.state.stats.faults == {"500": 1, "429": 1, "400": 1, "garbage": 1, "truncated": 1, "ok": 2}


def test_fault_rates_are_seeded() -> None:
    def draw(seed: int) -> list[str]:
        chaos = Chaos(rates={"500": 0.3, "garbage": 0.2}, seed=seed)
        return [chaos.next_fault() for _ in range(400)]

    assert draw(1) == draw(1)
    faults = draw(1)
    assert 0.2 < faults.count("500") / 400 < 0.4
    assert 0.1 < faults.count("garbage") / 400 < 0.3
    assert set(faults) == {"ok", "500", "garbage"}
    with pytest.raises(ValueError, match="unknown fault"):
        Chaos(sequence=["503"])
    with pytest.raises(ValueError, match="sum to <= 1"):
        Chaos(rates={"500": 0.7, "429": 0.6})


def test_slow_reply_and_latency() -> None:
    app = make_app(constant_judge, latency_ms=200, chaos=Chaos(sequence=["slow"], slow_s=0.3))
    with running_server(app) as url:
        start = time.perf_counter()
        slow = _post(url, {"messages": MESSAGES})
        middle = time.perf_counter()
        normal = _post(url, {"messages": MESSAGES})
        end = time.perf_counter()
    assert slow.status_code == normal.status_code == 200
    assert middle - start >= 0.5  # slow_s + latency
    assert 0.2 <= end - middle < 1.5  # latency only


def test_slow_reply_gives_up_when_the_client_leaves() -> None:
    app = make_app(constant_judge, chaos=Chaos(sequence=["slow"], slow_s=30.0))
    start = time.perf_counter()
    with running_server(app) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/chat/completions", json={"messages": MESSAGES}, timeout=0.2)
        deadline = time.monotonic() + 2
        while app.state.stats.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app.state.stats.in_flight == 0
    assert time.perf_counter() - start < 3


def test_async_and_dict_returning_judges() -> None:
    async def async_judge(messages: list[dict[str, Any]]) -> str:
        return "async:" + messages[-1]["content"]

    def dict_judge(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"n": len(messages)}

    def broken_judge(messages: list[dict[str, Any]]) -> str:
        raise KeyError("boom")

    replies = []
    for fn in (async_judge, dict_judge, broken_judge):
        with running_server(make_app(fn)) as url:  # type: ignore[arg-type]
            replies.append(_post(url, {"messages": MESSAGES}))
    assert replies[0].json()["choices"][0]["message"]["content"] == "async:hello there, judge"
    assert json.loads(replies[1].json()["choices"][0]["message"]["content"]) == {"n": 2}
    assert replies[2].status_code == 500
    assert "judge function failed: KeyError" in replies[2].json()["error"]["message"]


def test_builtin_judges() -> None:
    assert json.loads(constant_judge(MESSAGES)) == CONSTANT_VERDICT
    assert echo_judge(MESSAGES) == "hello there, judge"
    assert echo_judge([{"role": "system", "content": "x"}]) == ""
    assert message_text({"content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"text": "b"}]}) == "ab"

    def user(text: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": text}]

    # labelled lines: 8b has 30 characters, 32b 10 -> 8b wins, 40 split 30:10
    verdict = json.loads(length_judge(user("Compare.\n8b: " + "x" * 30 + "\n32B： " + "y" * 10 + "\n")))
    assert verdict == {"better": "8b", "score": {"8b": rubric_side(30), "32b": rubric_side(10)}}
    assert verdict["score"]["8b"] == {"quality": 12, "relevance": 6, "completeness": 6, "retrieval": 6, "sum": 30}
    # a JSON object with both keys
    verdict = json.loads(length_judge(user('results: {"8b": "abc", "32b": "abcdefghi"}')))
    assert verdict == {"better": "32b", "score": {"8b": rubric_side(10), "32b": rubric_side(30)}}
    # a tie, and no candidates at all
    assert json.loads(length_judge(user("8b: same\n32b: same"))) == CONSTANT_VERDICT
    assert json.loads(length_judge(user("nothing to compare"))) == CONSTANT_VERDICT
    assert set(BUILTIN_JUDGES) == {"constant", "echo", "length"}


def test_load_judge_function(tmp_path: Path) -> None:
    assert load_judge_function("length") is length_judge
    file = tmp_path / "my_judge.py"
    file.write_text(
        textwrap.dedent("""
        def judge(messages):
            return "from file"
        NOT_CALLABLE = 3
    """)
    )
    assert load_judge_function(f"{file}:judge")([]) == "from file"
    assert load_judge_function("queryrl.testing.judge_server:echo_judge") is echo_judge
    for spec, message in [
        ("nope", "unknown judge 'nope'"),
        (f"{tmp_path}/missing.py:judge", "not found"),
        (f"{file}:absent", "has no 'absent'; callables it defines: judge$"),
        (f"{file}:NOT_CALLABLE", "'NOT_CALLABLE' in file .*my_judge.py' is a int, not a function"),
        ("no_such_module_xyz:fn", "cannot import module"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_judge_function(spec)


def test_running_server_stops() -> None:
    app = make_app(constant_judge)
    with running_server(app) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert _post(url, {"messages": MESSAGES}).status_code == 200
    with socket.socket() as sock:
        sock.settimeout(1.0)
        with pytest.raises(ConnectionRefusedError):
            sock.connect(("127.0.0.1", port))
    with running_server(app, max_lifetime_s=0.2) as url:  # stops by itself
        time.sleep(0.6)
        with pytest.raises(httpx.ConnectError):
            _post(url, {"messages": MESSAGES})


# --- strict mode: the answers of OpenAI's API, for GPT-5 / o-series and keys ------------------------


def _strict(url: str, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, Any]]:
    reply = _post(url, {"messages": MESSAGES, **body}, **headers)
    return reply.status_code, reply.json()


def _unsupported(param: str, message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def test_strict_mode_refuses_what_gpt5_refuses() -> None:
    app = make_app(constant_judge, strict=True)
    with running_server(app) as url:
        temperature = _strict(url, {"model": "gpt-5", "temperature": 0.0})
        zero = _strict(url, {"model": "gpt-5-mini", "temperature": 0})
        max_tokens = _strict(url, {"model": "gpt-5", "max_tokens": 64})
        top_p = _strict(url, {"model": "o3-mini", "top_p": 0.9})
        o1_effort = _strict(url, {"model": "o1", "reasoning_effort": "minimal"})
        unknown = _strict(url, {"model": "gpt-5", "max_output_tokens": 64})
        effort_4o = _strict(url, {"model": "gpt-4o", "reasoning_effort": "low"})
        ok_gpt5 = _strict(
            url, {"model": "gpt-5", "temperature": 1, "max_completion_tokens": 64, "reasoning_effort": "minimal"}
        )
        ok_4o = _strict(url, {"model": "gpt-4o", "temperature": 0.0, "max_tokens": 64, "top_p": 0.5})
    # the exact bodies OpenAI answers (from public bug reports quoting the API)
    message = "Unsupported value: 'temperature' does not support 0.0 with this model. "
    message += "Only the default (1) value is supported."
    assert temperature == (400, _unsupported("temperature", message, "unsupported_value"))
    assert zero[1]["error"]["message"].startswith("Unsupported value: 'temperature' does not support 0 with")
    assert max_tokens == (400, _unsupported(
        "max_tokens",
        "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
        "unsupported_parameter",
    ))  # fmt: skip
    assert top_p == (400, _unsupported(
        "top_p", "Unsupported parameter: 'top_p' is not supported with this model.", "unsupported_parameter"
    ))  # fmt: skip
    assert o1_effort[0] == 400
    assert o1_effort[1]["error"]["message"] == (
        "Unsupported value: 'reasoning_effort' does not support 'minimal' with this model. "
        "Supported values are: 'low', 'medium', and 'high'."
    )
    assert unknown[0] == 400
    assert unknown[1]["error"]["message"] == "Unrecognized request argument supplied: max_output_tokens"
    assert effort_4o[0] == 400
    assert effort_4o[1]["error"]["param"] == "reasoning_effort"
    assert ok_gpt5[0] == 200
    assert ok_4o[0] == 200  # a non-reasoning model takes them all
    assert app.state.stats.refused == 7
    assert app.state.stats.faults["ok"] == 2  # refused requests never reached the judge


def test_lenient_mode_accepts_what_strict_refuses() -> None:
    app = make_app(constant_judge)
    with running_server(app) as url:
        status, _ = _strict(url, {"model": "gpt-5", "temperature": 0.0, "max_tokens": 64, "top_p": 0.5})
    assert status == 200


def test_api_key_is_checked_like_openai() -> None:
    key = "sk-right-key-0123456789"
    app = make_app(constant_judge, api_key=key, served_models=["gpt-5"])
    with running_server(app) as url:
        missing = _strict(url, {"model": "gpt-5"})
        wrong = _strict(url, {"model": "gpt-5"}, authorization="Bearer sk-wrong-key-9876543210")
        right = _strict(url, {"model": "gpt-5"}, authorization=f"Bearer {key}")
        unknown_model = _strict(url, {"model": "gpt-6"}, authorization=f"Bearer {key}")
        models_no_key = httpx.get(f"{url}/models", timeout=5.0)
        models = httpx.get(f"{url}/models", headers={"authorization": f"Bearer {key}"}, timeout=5.0)
    assert missing[0] == 401
    assert missing[1]["error"]["message"].startswith("You didn't provide an API key.")
    assert wrong[0] == 401
    assert wrong[1]["error"]["code"] == "invalid_api_key"
    # masked as OpenAI masks it: the first 5 and last 4 characters
    assert wrong[1]["error"]["message"].startswith("Incorrect API key provided: sk-wr**************3210. ")
    assert right[0] == 200
    assert unknown_model == (404, {"error": {
        "message": "The model `gpt-6` does not exist or you do not have access to it.",
        "type": "invalid_request_error", "param": None, "code": "model_not_found",
    }})  # fmt: skip
    assert models_no_key.status_code == 401
    assert [m["id"] for m in models.json()["data"]] == ["gpt-5"]


def test_models_route_can_be_absent() -> None:
    with running_server(make_app(constant_judge, list_models=False)) as url:
        assert httpx.get(f"{url}/models", timeout=5.0).status_code == 404
        assert _strict(url, {"model": "m"})[0] == 200


def test_408_and_409_faults() -> None:
    app = make_app(constant_judge, chaos=["408", "409"])
    with running_server(app) as url:
        statuses = [_post(url, {"messages": MESSAGES}).status_code for _ in range(3)]
    assert statuses == [408, 409, 200]
