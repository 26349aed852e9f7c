"""vLLM's platform object: this stand-in is a CPU build."""

from __future__ import annotations

from types import SimpleNamespace

current_platform = SimpleNamespace(device_type="cpu")
