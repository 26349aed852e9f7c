"""The fast decode path's shared-prefix prefill: prompts that start alike run their common start once."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import queryrl.rollout.fast_decode as fast_decode
from queryrl.rollout import SamplingParams
from queryrl.rollout.base import left_pad
from queryrl.rollout.fast_decode import shared_prefix
from tests.rollout.helpers import ARCHS, GREEDY, QUESTIONS, arch_model, assert_same_greedy, paths, with_lora

SYSTEM = "You rewrite the customer's last question into one standalone search query. 只输出改写后的查询。"


@pytest.fixture(scope="module")
def system_prompts(tiny_bundle: Any) -> list[list[int]]:
    """The rollout prompts behind one system message: a long common start (longer than the sliding
    windows), then questions of different lengths."""
    tok = tiny_bundle.tokenizer
    out = []
    for q in QUESTIONS:
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The prefix lengths the fast path ran with, one per prefill."""
    seen: list[int] = []

    def recording(ids: torch.Tensor, mask: torch.Tensor) -> int:
        seen.append(shared_prefix(ids, mask))
        return seen[-1]

    monkeypatch.setattr(fast_decode, "shared_prefix", recording)
    return seen


def _padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = left_pad(prompts, 0)
    return ids, mask.bool()


def test_the_shared_prefix_length() -> None:
    start = list(range(100, 120))  # 20 tokens
    assert shared_prefix(*_padded([[*start, 1, 2], [*start, 3], [*start, 1, 5, 6]])) == 20
    assert shared_prefix(*_padded([[*start, 1, 2], [*start, 1, 2, 9]])) == 21  # equal up to the shorter's end - 1
    assert shared_prefix(*_padded([start, [*start, 7]])) == 19  # a prompt that is all prefix keeps its last token
    assert shared_prefix(*_padded([[*start, 1]])) == 0  # one distinct prompt: nothing to share
    assert shared_prefix(*_padded([[*start[:10], 1, *start], [*start[:10], 2, *start]])) == 0  # 10 < 16
    assert shared_prefix(*_padded([[9, *start], [*start, 1]])) == 0  # the first tokens differ


@pytest.mark.parametrize("name", ["sharp", *ARCHS])
def test_greedy_equals_generate_with_a_shared_prefix(
    name: str, tiny_bundle: Any, sharp_model: nn.Module, system_prompts: list[list[int]], spy: list[int]
) -> None:
    """Two samples of five prompts with one system message, in micro-batches of 3 (distinct prompts of
    different lengths) and of 64: the same tokens and log-probs as ``generate``; the windowed layers'
    windows end inside the prefix."""
    tok = tiny_bundle.tokenizer
    model = sharp_model if name == "sharp" else arch_model(tok, name)
    for micro_batch_size in (3, 64):
        fast, slow = paths(model, tok, micro_batch_size=micro_batch_size)
        assert_same_greedy(fast.generate(system_prompts, GREEDY), slow.generate(system_prompts, GREEDY))
    assert max(spy) >= 20  # shared in the batches of several prompts
    assert min(spy) == 0  # a batch of one prompt's samples has nothing to share


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_lora_and_sampling_with_a_shared_prefix(
    name: str, tiny_bundle: Any, system_prompts: list[list[int]], spy: list[int]
) -> None:
    """A LoRA model: greedy tokens as ``generate``'s; sampled responses' log-probs equal the model's
    forward over them (the prefix's keys sit where a full prefill puts them)."""
    tok = tiny_bundle.tokenizer
    model = with_lora(arch_model(tok, name))
    fast, slow = paths(model, tok)
    assert_same_greedy(fast.generate(system_prompts, GREEDY), slow.generate(system_prompts, GREEDY))
    torch.manual_seed(0)
    out = fast.generate(system_prompts, SamplingParams(do_sample=True, max_new_tokens=8, n=3))
    attention = torch.cat([out.prompt_mask, out.response_mask], 1)
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([out.prompt_ids, out.response_ids], 1),
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
        ).logits[:, out.prompt_ids.shape[1] - 1 : -1]
    logprobs = torch.log_softmax(logits.float(), -1).gather(-1, out.response_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(out.rollout_logprobs, logprobs * out.response_mask, atol=1e-5, rtol=0)
    assert min(spy) >= 20
