"""The rollout contract: sampling parameters, padding helpers, concat, the backend registry."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch

import queryrl.rollout
from queryrl.algos import RegistryError
from queryrl.rollout import (
    ROLLOUT_BACKENDS,
    HFRollout,
    RolloutBackend,
    RolloutOutput,
    SamplingParams,
    eos_response_mask,
    left_pad,
    make_rollout,
)

PAD, EOS = 0, 2


def test_sampling_params_defaults_and_validation() -> None:
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.n, p.do_sample, p.max_new_tokens) == (1.0, 1.0, 0, 1, True, 256)
    assert SamplingParams(temperature=0.7).logprob_temperature == 0.7
    # greedy ignores the temperature (the validation preset uses temperature 0) and takes log-probs at T=1
    assert SamplingParams(temperature=0.0, do_sample=False).logprob_temperature == 1.0
    for bad in (
        {"temperature": 0.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"n": 0},
        {"max_new_tokens": 0},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_left_pad() -> None:
    ids, mask = left_pad([[5, 6, 7], [8]], PAD)
    assert ids.tolist() == [[5, 6, 7], [PAD, PAD, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == mask.dtype == torch.long
    # an empty prompt is all padding; token tensors are read as ints; no rows: (0, 0)
    ids, mask = left_pad([torch.tensor([3, 4]), []], PAD)
    assert ids.tolist() == [[3, 4], [PAD, PAD]]
    assert mask.tolist() == [[1, 1], [0, 0]]
    assert [tuple(t.shape) for t in left_pad([], PAD)] == [(0, 0), (0, 0)]
    assert [tuple(t.shape) for t in left_pad([[], []], PAD)] == [(2, 0), (2, 0)]


def test_eos_response_mask_counts_up_to_and_including_the_first_eos() -> None:
    response_ids = torch.tensor(
        [
            [5, EOS, PAD, PAD],  # EOS at 1: tokens 0 and 1 count
            [EOS, 7, EOS, PAD],  # EOS first: only it counts
            [5, 6, 7, 8],  # no EOS: truncated, everything counts
            [5, 6, 7, EOS],  # EOS on the last step: not truncated
            [PAD, 6, EOS, PAD],  # a generated pad id before EOS is a real token
        ]
    )
    mask, truncated = eos_response_mask(response_ids, EOS)
    assert mask.dtype == torch.float32
    assert mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert truncated.tolist() == [False, False, True, False, False]


def _output(prompts: list[list[int]], responses: list[list[int]], prompt_index: list[int]) -> RolloutOutput:
    """A hand-made output: responses right-padded, log-prob -(t+1) at counted token t."""
    prompt_ids, prompt_mask = left_pad(prompts, PAD)
    width = max(len(r) for r in responses)
    response_ids = torch.tensor([r + [PAD] * (width - len(r)) for r in responses])
    response_mask = torch.tensor([[1.0] * len(r) + [0.0] * (width - len(r)) for r in responses])
    logprobs = -torch.arange(1, width + 1, dtype=torch.float32).expand(len(responses), width) * response_mask
    return RolloutOutput(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        rollout_logprobs=logprobs,
        prompt_index=torch.tensor(prompt_index),
        truncated=torch.tensor([r[-1] != EOS for r in responses]),
    )


def test_concat_repads_and_keeps_absolute_prompt_index() -> None:
    a = _output([[11, 12], [11, 12]], [[5, EOS], [6, 7, EOS]], [0, 0])
    b = _output([[13, 14, 15, 16]], [[8]], [1])  # a later chunk: prompt 1, longer prompt, shorter response
    out = RolloutOutput.concat([a, b], PAD)
    assert len(out) == 3
    assert out.prompt_ids.tolist() == [[PAD, PAD, 11, 12], [PAD, PAD, 11, 12], [13, 14, 15, 16]]
    assert out.prompt_mask.tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]]
    assert out.response_ids.tolist() == [[5, EOS, PAD], [6, 7, EOS], [8, PAD, PAD]]
    assert out.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert out.rollout_logprobs.tolist() == [[-1, -2, 0], [-1, -2, -3], [-1, 0, 0]]
    assert out.prompt_index.tolist() == [0, 0, 1]
    assert out.truncated.tolist() == [False, False, True]
    assert out.response_lengths.tolist() == [2, 3, 1]
    assert out.response_mask.dtype == out.rollout_logprobs.dtype == torch.float32


def test_concat_of_nothing_is_empty() -> None:
    out = RolloutOutput.concat([], PAD)
    assert len(out) == 0
    assert out.response_ids.shape == (0, 0)


def test_output_rejects_mismatched_shapes() -> None:
    good = _output([[11]], [[5, EOS]], [0])
    with pytest.raises(ValueError, match="response_mask"):
        RolloutOutput(**{**good.__dict__, "response_mask": torch.ones(1, 3)})
    with pytest.raises(ValueError, match="prompt_index"):
        RolloutOutput(**{**good.__dict__, "prompt_index": torch.tensor([0, 0])})


def test_registry_builds_hf(tiny_bundle: Any) -> None:
    assert {"hf", "vllm"} <= set(ROLLOUT_BACKENDS)
    backend = make_rollout("hf", tiny_bundle.model, tiny_bundle.tokenizer, micro_batch_size=3, device=None)
    assert isinstance(backend, HFRollout)
    assert isinstance(backend, RolloutBackend)
    assert backend.micro_batch_size == 3
    assert backend.device == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_vllm_without_a_gpu_is_a_clear_error(tiny_bundle: Any) -> None:
    with pytest.raises(RuntimeError, match=r"vllm.*needs a CUDA GPU.*rollout.backend='hf'"):
        make_rollout("vllm", tiny_bundle.model, tiny_bundle.tokenizer)


def test_unknown_backend_lists_the_valid_ones(tiny_bundle: Any) -> None:
    with pytest.raises(RegistryError, match=r"unknown rollout backend 'vlm'.*hf.*vllm"):
        make_rollout("vlm", tiny_bundle.model, tiny_bundle.tokenizer)


def test_rollout_does_not_import_the_trainer() -> None:
    """Layering: rollout sits above trainer (also no lazy imports inside functions)."""
    for path in Path(queryrl.rollout.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert not name.startswith(("queryrl.trainer", "queryrl.apps")), f"{path.name} imports {name}"


def test_trained_token_ids_and_their_text_skip_masked_tokens() -> None:
    from queryrl.trainer.scoring import decode_responses, trained_token_ids

    out = _output([[11, 12], [11, 12]], [[5, EOS], [6, 7, 8, EOS]], [0, 0])
    out.response_mask[1, 1] = 0.0  # a tool's tokens inside a response (the agent loop) are not trained
    assert trained_token_ids(out) == [[5, EOS], [6, 8, EOS]]

    class Tokenizer:
        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            assert skip_special_tokens
            assert all(type(i) is int for i in ids)
            return " ".join(str(i) for i in ids if i != EOS)

    assert decode_responses(Tokenizer(), out) == ["5", "6 8"]
