"""Fixtures shared by the reward tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def tcp_server() -> Iterator[socket.socket]:
    """A listening TCP socket on 127.0.0.1 (a free port) that sandboxed code must not reach."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    yield server
    server.close()
