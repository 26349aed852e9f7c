"""Rollout fixtures: prompts of different lengths, and hacked copies of the tiny model."""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

from tests.rollout.helpers import QUESTIONS, with_lm_head_bias


@pytest.fixture(scope="session")
def prompts(tiny_bundle: Any) -> list[list[int]]:
    """Chat-templated prompts of different lengths (token ids, unpadded)."""
    tok = tiny_bundle.tokenizer
    out = []
    for q in QUESTIONS:
        text = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    assert len({len(p) for p in out}) == len(out), "want prompts of different lengths"
    return out


@pytest.fixture(scope="session")
def sharp_model(tiny_bundle: Any) -> nn.Module:
    """The tiny model with 8x sharper logits: clear greedy margins, visibly non-uniform samples."""
    return with_lm_head_bias(tiny_bundle.model, tiny_bundle.tokenizer.eos_token_id, 0.0, sharpen=8.0)


@pytest.fixture(scope="session")
def eos_model(tiny_bundle: Any) -> nn.Module:
    """The tiny model with EOS boosted to roughly a 1-in-5 chance per step: responses of mixed lengths."""
    return with_lm_head_bias(tiny_bundle.model, tiny_bundle.tokenizer.eos_token_id, 5.0)
