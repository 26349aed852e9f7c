"""A secret's value never reaches the console or a file of the run, wherever it appears (item 13).

The end-to-end test runs `queryrl train` as a real process whose reward calls a judge that echoes the
``Authorization`` header (the API key) in its 200 replies: in unparseable verdicts (logged by the judge
client, then by the reward manager as "rewards failed; first: ...") and next to valid verdicts.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from queryrl import redaction
from queryrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-echo-5f3a9c0e71d24b8a"


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    yield
    redaction.clear_secrets()


def test_config_names_the_variables_and_their_values_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_JUDGE_KEY", SECRET)
    monkeypatch.setenv("MY_RAG_TOKEN", "tok-0123456789")
    cfg = load_config(
        None,
        [
            "app.query_rewrite.judge.api_key_env=MY_JUDGE_KEY",
            "+reward.kwargs.rag_token_env=MY_RAG_TOKEN",
            "+reward.kwargs.judge_model=not-a-secret",
        ],
    )
    assert {"MY_JUDGE_KEY", "MY_RAG_TOKEN"} <= set(redaction.secret_env_names(cfg))
    assert {"MY_JUDGE_KEY", "MY_RAG_TOKEN"} <= set(redaction.register_config_secrets(cfg))
    text = f"HTTP 200: Authorization: Bearer {SECRET} and tok-0123456789, model not-a-secret"
    assert redaction.redact(text) == "HTTP 200: Authorization: Bearer <redacted> and <redacted>, model not-a-secret"
    data = {"k": [SECRET, (1, f"x{SECRET}")], SECRET: 2.0}
    assert redaction.redact_data(data) == {"k": ["<redacted>", (1, "x<redacted>")], "<redacted>": 2.0}


def test_short_values_are_not_secrets() -> None:
    assert not redaction.add_secret("abc")
    assert redaction.redact("abc abc") == "abc abc"


def test_log_records_warnings_and_streams_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    redaction.add_secret(SECRET)
    with caplog.at_level(logging.WARNING):
        logging.getLogger("queryrl.rewards.judge").warning("unparseable verdict: %r", f"Bearer {SECRET}")
    assert SECRET not in caplog.text
    assert "Bearer <redacted>" in caplog.text
    assert SECRET not in warnings.formatwarning(f"key {SECRET}", UserWarning, "f.py", 1)
    sink = io.StringIO()
    stream = redaction.RedactingStream(sink)
    assert stream.write(f"[{SECRET}]") == len(SECRET) + 2  # the caller's count, not the redacted one
    assert sink.getvalue() == "[<redacted>]"
    assert stream.getvalue() == "[<redacted>]"  # everything else goes to the wrapped stream


def test_the_judge_client_redacts_an_echoed_key_before_cutting_the_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    from queryrl.rewards.judge import JudgeClient
    from queryrl.testing.judge_server import make_app, running_server

    monkeypatch.setenv("QUERYRL_ECHO_KEY", SECRET)
    # the key straddles character 120, where the error text is cut: its first characters must not show
    app = make_app(lambda messages: "x" * 100 + f" Bearer {SECRET} no verdict here")
    with running_server(app) as url:
        client = JudgeClient(url, "judge", api_key_env="QUERYRL_ECHO_KEY", max_retries=0)
        result = client.judge_sync([{"role": "user", "content": "compare"}])
    assert result.error is not None
    assert result.error.startswith("unparseable verdict")
    assert SECRET[:8] not in result.error
    assert "<redacted>" in result.error


# --- end to end: queryrl train with a judge that echoes the key ----------------------------------


class _EchoJudge(BaseHTTPRequestHandler):
    """An OpenAI-compatible judge that puts the Authorization header in every 200 reply; three replies of
    four hold it inside a verdict, the fourth alone, so some samples score and some fail."""

    calls = 0
    echoed = 0

    def _send(self, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": f"judge ({self.headers.get('Authorization')})"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = str(self.headers.get("Authorization"))
        cls = type(self)
        echo = f"I received Authorization: {auth}."
        # three replies of four are a verdict that carries the echo in a field, the fourth the echo alone
        # (unparseable): some samples fail, and a step of 4 groups of 2 keeps at least 2 whole groups to train on
        content = json.dumps({"score": 0.5, "note": echo}) if cls.calls % 4 != 3 else echo
        cls.calls += 1
        cls.echoed += SECRET in auth
        message = {"role": "assistant", "content": content}
        self._send(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "judge",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )

    def log_message(self, *args: object) -> None:  # the server's own access log is not the trainer's console
        pass


@pytest.fixture
def echo_judge() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoJudge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


REWARD = """
from queryrl.rewards.judge import JudgeClient

_clients = {}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, judge_base_url="", judge_api_key_env=""):
    client = _clients.setdefault(judge_base_url, JudgeClient(judge_base_url, "judge", api_key_env=judge_api_key_env,
                                                              max_retries=0))
    result = client.judge_sync([{"role": "user", "content": f"Grade: {solution_str}"}])
    if result.verdict is None:
        raise RuntimeError(result.error)  # the sample fails, its error is logged
    return float(result.verdict["score"])
"""


@pytest.mark.slow
def test_a_judge_echoing_the_key_leaves_it_nowhere(tmp_path: Path, model_cache: Path, echo_judge: str) -> None:
    reward = tmp_path / "judge_reward.py"
    reward.write_text(REWARD)
    rows = tmp_path / "rows.jsonl"  # a user pasted the key into a prompt: samples/step_N.jsonl holds prompts
    rows.write_text(
        "".join(
            json.dumps({"data_source": "echo", "prompt": f"my key is {SECRET}, say hi {i}", "reward_model": {}}) + "\n"
            for i in range(4)
        )
    )
    run_dir = tmp_path / "runs"
    cmd = [sys.executable, "-m", "queryrl.cli", "train", "--config", str(REPO / "configs" / "toy_grpo.yaml")]
    cmd += [f"model.cache_dir={model_cache}", f"trainer.output_dir={run_dir}", f"data.train_files=[{rows}]"]
    cmd += ["data.val_files=[]", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2"]
    cmd += ["trainer.total_steps=2", "trainer.logger=[console,jsonl,tensorboard]", "trainer.plot=true"]
    cmd += [
        "reward.max_failed_frac=1.0",
        f"reward.function.path={reward}",
        f"+reward.kwargs.judge_base_url={echo_judge}",
    ]
    cmd += ["+reward.kwargs.judge_api_key_env=QUERYRL_ECHO_KEY", "data.max_prompt_length=64"]
    env = {**os.environ, "QUERYRL_ECHO_KEY": SECRET, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, console
    assert _EchoJudge.echoed >= 8, "the judge never saw the key: the test would prove nothing"
    assert "unparseable verdict" in console  # the failures were printed...
    assert "rewards failed; first:" in console
    assert "<redacted>" in console  # ...with the key replaced
    assert SECRET not in console
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.name.startswith("step_") and p.suffix == ".jsonl" for p in files)  # samples were written
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
