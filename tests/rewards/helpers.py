"""Helpers shared by the sandbox tests: whether a process started by sandboxed code is still running."""

from __future__ import annotations

import os
import time


def running_with(token: str) -> bool:
    """Whether any process on this machine has `token` in its command line."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    return True
        except OSError:
            continue
    return False


def gone(token: str, within_s: float = 2.0) -> bool:
    """Whether no process has `token` in its command line, within `within_s` (SIGKILL lands asynchronously)."""
    deadline = time.monotonic() + within_s
    while running_with(token):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
