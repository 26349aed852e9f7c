"""Engine fixtures: the tiny policy with full weights and with LoRA adapters."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.helpers import load


@pytest.fixture(params=[0, 4], ids=["full", "lora"])
def policy(request: pytest.FixtureRequest, model_cache: Any) -> Any:
    """A fresh tiny policy (trainable in place), once with full weights and once with LoRA rank 4."""
    return load(model_cache, request.param)
