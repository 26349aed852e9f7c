"""What one client can take from queryrl's own services (``serve-rag``, ``serve-judge``): connections, time,
memory and log lines.

:func:`serve_app` runs an ASGI app with uvicorn under :class:`ServiceLimits`:

- ``max_connections`` (``--max-connections``, default 256): open connections at most. When one more
  arrives, the connection that has waited longest for a complete request header is closed (an idle
  kept-alive one counts as waiting); with none waiting, the new one is closed. A client that opens
  thousands of connections and sends half a header therefore holds at most that many file descriptors,
  and a client that sends a whole request still gets in. Uvicorn's own ``limit_concurrency`` does not
  bound this: it answers 503 only to a complete request, and a connection that never completes one is
  held forever. The listen backlog is ``max_connections`` (asyncio accepts up to a backlog of sockets
  before any of them is seen), and the process's soft ``RLIMIT_NOFILE`` is raised, within its hard
  limit, to ``2 * max_connections + 64`` (:func:`ensure_descriptors`; refused in one line when the hard
  limit is lower).
- ``header_timeout_s`` (``--header-timeout``, default 10): a connection must send a complete request
  header within this many seconds of connecting or of its previous response, else it is closed.
  Header size stays h11's limit (16 KiB: larger is a 400).
- ``max_body_bytes`` (``--max-body-mib``, default 1 MiB): :class:`BodyLimit`, a pure ASGI middleware,
  answers 413 when ``Content-Length`` is larger, before the body is read; a body without a length
  (chunked) is counted as it streams and refused with 413 once it passes the limit. Nothing larger is
  ever held in memory or parsed on the event loop.
- ``log_interval_s`` (10): :class:`RepeatFilter` lets one identical warning or error through per interval
  (uvicorn's and asyncio's loggers) and says how many it held back, so a flood cannot fill the disk
  with the same line. Access-log lines (INFO) are not limited.

A front proxy (nginx, a cloud load balancer) in front of a service that is reachable from other machines
remains the better place for per-client rate limits; these limits keep one process alive without one.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MIB = 1024 * 1024
SPARE_DESCRIPTORS = 64  # the process's own files, the index, log files, a model
LIMITED_LOGGERS = ("uvicorn.error", "asyncio")
_log = logging.getLogger("uvicorn.error")


@dataclass(frozen=True)
class ServiceLimits:
    """The bounds :func:`serve_app` puts on clients (see the module doc for each)."""

    max_connections: int = 256
    header_timeout_s: float = 10.0
    max_body_bytes: int = MIB
    log_interval_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "header_timeout_s", "max_body_bytes", "log_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @classmethod
    def from_options(cls, max_connections: int, header_timeout_s: float, max_body_mib: float) -> ServiceLimits:
        """From the command line's ``--max-connections``, ``--header-timeout`` and ``--max-body-mib``.

        Raises:
            ValueError: a value that is not positive (one line naming the option).
        """
        options = {"--max-connections": max_connections, "--header-timeout": header_timeout_s}
        for option, value in {**options, "--max-body-mib": max_body_mib}.items():
            if not value > 0:
                raise ValueError(f"{option} must be > 0, got {value}")
        return cls(max_connections, header_timeout_s, max(1, int(max_body_mib * MIB)))


# --- request bodies ----------------------------------------------------------------------------------


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` gets 413 and is not read (see the module doc)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"detail": f"request body larger than {self.max_bytes} bytes (--max-body-mib)"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": [*headers, (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            await self._refuse(send)  # before a byte of the body is read
            return
        received, refused, started = 0, False, False

        async def counted() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    refused = True
                    if not started:
                        await self._refuse(send)
                    return {"type": "http.disconnect"}  # the app stops reading; the rest is never read
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out: the app's own answer to a cut-off body is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except Exception:
            if not refused:
                raise  # an error of the app; a body cut off at the limit is not one


# --- connections -------------------------------------------------------------------------------------


def ensure_descriptors(max_connections: int, service: str) -> int:
    """Raise the soft open-files limit to what `max_connections` needs (within the hard limit); returns it.

    Raises:
        ValueError: the hard limit is lower than what is needed (one line: the numbers and the ways out).
    """
    need = 2 * max_connections + SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ValueError(
                f"{service}: --max-connections {max_connections} needs {need} open files and this process may "
                f"open {hard} (ulimit -Hn): lower --max-connections to {max(1, (hard - SPARE_DESCRIPTORS) // 2)} "
                "or raise the limit"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        soft = need
    return soft


def guarded_protocol(limits: ServiceLimits) -> type[Any]:
    """Uvicorn's h11 protocol with a connection cap and a request-header deadline (see the module doc).

    One class per server: the connections it tracks are that server's.
    """
    import asyncio

    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting: dict[Any, None] = {}  # connections waiting for a request header, oldest first
    live: set[Any] = set()

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _armed_cycle: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            live.add(self)
            self._arm()
            if len(live) > limits.max_connections:
                _log.warning("connection limit reached (--max-connections): closed the one waiting longest")
                next(iter(waiting))._drop()  # self is waiting too, last: the oldest is someone else if any

        def _arm(self) -> None:
            """Wait for a request header from now on (at most header_timeout_s)."""
            self._disarm()
            waiting[self] = None
            self._armed_cycle = self.cycle
            self._timer = self.loop.call_later(limits.header_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            waiting.pop(self, None)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _timed_out(self) -> None:
            _log.warning("closed a connection that sent no complete request header in time (--header-timeout)")
            self._drop()

        def _drop(self) -> None:
            self._disarm()
            live.discard(self)
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not self._armed_cycle and self._timer is not None:
                self._disarm()  # a whole request header came: its request is the app's to time

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # kept alive: the next request's header has the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            live.discard(self)
            super().connection_lost(exc)

    return GuardedH11Protocol


# --- log lines ---------------------------------------------------------------------------------------


class RepeatFilter(logging.Filter):
    """One identical warning or error per `interval_s` (same logger, level, text and exception); the next one
    after the interval says how many were held back. INFO and below always pass."""

    def __init__(self, interval_s: float = 10.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._seen: dict[tuple[str, int, str, str], tuple[float, int]] = {}  # key -> (last shown, held back)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        key = (record.name, record.levelno, message, f"{type(exc).__name__}: {exc}" if exc else "")
        now = time.monotonic()
        shown, held = self._seen.get(key, (float("-inf"), 0))
        if now - shown < self.interval_s:
            self._seen[key] = (shown, held + 1)
            return False
        if len(self._seen) > 1000:  # many distinct messages: forget the oldest
            self._seen.pop(next(iter(self._seen)))
        self._seen[key] = (now, 0)
        if held:
            record.msg, record.args = f"{message} ({held} more like it in the last {now - shown:.0f} s not logged)", ()
        return True


def limit_repeated_logs(interval_s: float) -> RepeatFilter:
    """Put a :class:`RepeatFilter` on uvicorn's error logger and asyncio's (after uvicorn set up logging)."""
    repeat = RepeatFilter(interval_s)
    for name in LIMITED_LOGGERS:
        logging.getLogger(name).addFilter(repeat)
    return repeat


# --- serving ----------------------------------------------------------------------------------------------


def server_config(app: ASGIApp, limits: ServiceLimits, **options: Any) -> Any:
    """A ``uvicorn.Config`` serving `app` under `limits` (`options`: host, port, log_level, ...)."""
    import uvicorn

    return uvicorn.Config(
        BodyLimit(app, limits.max_body_bytes),
        http=guarded_protocol(limits),
        backlog=limits.max_connections,
        h11_max_incomplete_event_size=16 * 1024,
        **options,
    )


def serve_app(app: ASGIApp, host: str, port: int, limits: ServiceLimits, service: str) -> None:
    """Serve `app` on `host`:`port` under `limits` until interrupted (blocking).

    Raises:
        ValueError: too few file descriptors for ``limits.max_connections`` (:func:`ensure_descriptors`).
    """
    import uvicorn

    ensure_descriptors(limits.max_connections, service)
    config = server_config(app, limits, host=host, port=port, log_level="info")  # sets up uvicorn's logging
    limit_repeated_logs(limits.log_interval_s)
    uvicorn.Server(config).run()
