"""What one client can take from ``serve-rag`` / ``serve-judge`` (issue 52, item 4), attacked as the issue did it.

A real ``queryrl serve-rag`` process on 127.0.0.1 with small limits (64 connections, 1 s for a request header,
64 KiB bodies) and a file-descriptor limit of 256, so the attacks stay small: 300 half-open connections
that each sent part of a header (before: 20,000 exhausted the descriptors, ``/health`` timed out and the log
filled with "Too many open files"), bodies over the limit (before: a 200 MB body was read and parsed), and a
token in a URL (before: its access-log line became a 40-line "--- Logging error ---").
"""

from __future__ import annotations

import logging
import os
import resource
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from queryrl import redaction
from queryrl.cli import app as cli_app
from queryrl.redaction import PLACEHOLDER, redact_record
from queryrl.service_limits import RepeatFilter, ServiceLimits, ensure_descriptors
from tests.loopback import CHAT_8B_REQUEST, serve_judge_process, wait_until_up

TOKEN_ENV = "QUERYRL_TEST_LIMITS_TOKEN"
MAX_CONNECTIONS, HEADER_TIMEOUT_S, MAX_BODY = 64, 1.0, 64 * 1024
FILES_LIMIT = 256  # the server's RLIMIT_NOFILE: 300 connections are more than it may open


@dataclass
class Service:
    url: str
    port: int
    token: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_lines(self) -> list[str]:
        return self.log.read_text(encoding="utf-8", errors="replace").splitlines()

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


def _files_limit() -> None:  # in the server's process, before exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILES_LIMIT, FILES_LIMIT))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("serve-rag")
    corpus = folder / "corpus.jsonl"
    corpus.write_text('{"doc_id": "d1", "title": "退货政策", "content": "七天无理由退货。"}\n', encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_urlsafe(24)
    limits = ["--max-connections", str(MAX_CONNECTIONS), "--header-timeout", str(HEADER_TIMEOUT_S)]
    limits += ["--max-body-mib", str(MAX_BODY / 2**20)]
    cmd = [sys.executable, "-m", "queryrl.cli", "serve-rag", "--corpus", str(corpus), "--port", str(port)]
    env = {**os.environ, TOKEN_ENV: token, "PYTHONUNBUFFERED": "1"}
    log = folder / "serve-rag.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, "--token-env", TOKEN_ENV, *limits], stdout=out, stderr=subprocess.STDOUT, env=env,
            preexec_fn=_files_limit,
        )  # fmt: skip
    try:
        wait_until_up(f"http://127.0.0.1:{port}/health", proc, 60, "serve-rag", log)
        yield Service(f"http://127.0.0.1:{port}", port, token, proc, log)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def half_open(port: int, count: int) -> list[socket.socket]:
    """`count` connections that each send the start of a request header and nothing more (those that connect
    within 2 s)."""
    opened = []
    for _ in range(count):
        s = socket.socket()
        s.settimeout(2.0)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        except OSError:
            s.close()
            continue
        opened.append(s)
    return opened


def closed_by_server(s: socket.socket, within_s: float) -> bool:
    s.settimeout(within_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_half_open_connections_neither_starve_health_nor_fill_the_log(service: Service) -> None:
    lines_before = len(service.log_lines())
    flood = half_open(service.port, 300)
    try:
        assert len(flood) >= 250  # the attack happened (before the cap, the 257th descriptor failed)
        start = time.monotonic()
        health = httpx.get(f"{service.url}/health", timeout=5)
        assert health.status_code == 200
        assert time.monotonic() - start < 3
        assert service.open_files() <= 2 * MAX_CONNECTIONS + 64
        # those still open are closed once their header is late: descriptors come back without the client
        deadline = time.monotonic() + HEADER_TIMEOUT_S + 3
        assert all(closed_by_server(s, max(deadline - time.monotonic(), 0.01)) for s in flood)
    finally:
        for s in flood:
            s.close()
    assert httpx.get(f"{service.url}/health", timeout=5).status_code == 200
    new = service.log_lines()[lines_before:]
    assert not [line for line in new if "Too many open files" in line]
    assert len(new) < 20, "\n".join(new[:40])  # one line per kind of event per 10 s, and the two access lines
    assert any("more like it" in line or "--max-connections" in line for line in new)


def raw_post(port: int, headers: dict[str, str], body: bytes = b"", timeout_s: float = 3.0) -> bytes:
    """Send a POST's headers and `body` (perhaps only part of what the headers announce); the reply's first
    bytes, or b"" when none came within `timeout_s`."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(f"POST /rag/chat_8b HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode() + body)
        try:
            return s.recv(4096)
        except TimeoutError:
            return b""


def test_a_body_over_the_limit_gets_413_before_it_is_read(service: Service) -> None:
    auth = {"Authorization": f"Bearer {service.token}", "Content-Type": "application/json"}
    # the length alone: 300 MB announced, not a byte sent; before, the server waited to read it all
    reply = raw_post(service.port, {**auth, "Content-Length": str(300 * 2**20)})
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    assert b"connection: close" in reply.lower()
    # no length (chunked): counted as it streams, refused once past the limit; the rest is never sent
    chunk = b"x" * 8192
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_BODY // len(chunk) + 2))
    reply = raw_post(service.port, {**auth, "Transfer-Encoding": "chunked"}, body)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:200]
    # under the limit: answered as before
    ok = httpx.post(f"{service.url}/rag/chat_8b", json=CHAT_8B_REQUEST, headers=auth, timeout=5)
    assert ok.status_code == 200
    assert ok.json()["response"][0]["doc_id"] == "d1"


def test_a_token_in_the_url_is_one_redacted_access_line(service: Service) -> None:
    assert httpx.get(f"{service.url}/health?token={service.token}", timeout=5).status_code == 200
    time.sleep(0.3)  # the access line is written after the reply
    lines = service.log_lines()
    text = "\n".join(lines)
    assert service.token not in text
    assert "Logging error" not in text
    (access,) = [line for line in lines if "GET /health?token=" in line]
    assert f"GET /health?token={PLACEHOLDER} HTTP/1.1" in access
    assert access.rstrip().endswith("200 OK") or " 200" in access


def test_serve_judge_takes_the_same_limits() -> None:
    with serve_judge_process("constant", 60.0, "--max-body-mib", "0.01") as base_url:
        port = int(base_url.rsplit(":", 1)[1].split("/")[0])
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {2**20}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(head.encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 413 ")


# ---- the parts, without a server ----


def test_the_repeated_line_is_let_through_once_per_interval_with_a_count() -> None:
    repeat = RepeatFilter(interval_s=0.2)
    record = logging.LogRecord(
        "asyncio", logging.ERROR, __file__, 1, "socket.accept() out of system resource", (), None
    )
    shown = [repeat.filter(logging.makeLogRecord(record.__dict__)) for _ in range(500)]
    assert shown.count(True) == 1
    time.sleep(0.25)
    later = logging.makeLogRecord(record.__dict__)
    assert repeat.filter(later)
    assert later.getMessage() == "socket.accept() out of system resource (499 more like it in the last 0 s not logged)"
    info = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "same", (), None)
    assert all(repeat.filter(info) for _ in range(5))  # access lines are never held back


def test_redaction_keeps_a_record_s_arguments_a_tuple() -> None:
    """uvicorn's access formatter unpacks five arguments; the hook used to set them to None."""
    secret = secrets.token_urlsafe(24)
    redaction.add_secret(secret)
    try:
        args = ("127.0.0.1:5000", "GET", f"/health?token={secret}", "1.1", 200)
        record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', args, None)
        redact_record(record)
        assert isinstance(record.args, tuple)
        assert len(record.args) == 5
        assert record.args[4] == 200  # not a secret: kept as it was (an int)
        assert record.getMessage() == f'127.0.0.1:5000 - "GET /health?token={PLACEHOLDER} HTTP/1.1" 200'
        made = logging.getLogRecordFactory()("x", logging.INFO, __file__, 1, "key %s", (secret,), None)
        assert made.getMessage() == f"key {PLACEHOLDER}"
        assert made.args == (PLACEHOLDER,)
    finally:
        redaction.clear_secrets()


@pytest.mark.parametrize(
    ("option", "value", "shown"),
    [("--max-connections", "0", "0"), ("--header-timeout", "-1", "-1.0"), ("--max-body-mib", "0", "0.0")],
)
def test_a_limit_that_is_not_positive_is_one_line(option: str, value: str, shown: str, tmp_path: Path) -> None:
    for command in (["serve-rag", "--corpus", str(tmp_path / "missing.jsonl")], ["serve-judge"]):
        result = CliRunner().invoke(cli_app, [*command, option, value])
        assert result.exit_code == 2
        assert result.output.strip() == f"error: {option} must be > 0, got {shown}"


def test_too_few_file_descriptors_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (100, 300))
    monkeypatch.setattr(resource, "setrlimit", lambda kind, limits: calls.append(limits))
    assert ensure_descriptors(64, "serve-rag") == 192  # 2 x 64 + 64, within the hard limit: raised
    assert calls == [(192, 300)]
    with pytest.raises(ValueError, match=r"serve-rag: --max-connections 256 needs 576 open files .* lower "):
        ensure_descriptors(256, "serve-rag")
    assert ServiceLimits.from_options(8, 1.0, 0.5).max_body_bytes == 2**19
