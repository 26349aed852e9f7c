"""The vLLM backend with the real vLLM on a GPU (marked gpu); its CPU tests against a stand-in are in test_sync.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from queryrl.rollout import SamplingParams, make_rollout
from queryrl.rollout.vllm import model_path


def test_the_model_folder_is_found(tiny_bundle: Any) -> None:
    assert (model_path(tiny_bundle.model) / "config.json").is_file()


@pytest.mark.gpu
def test_vllm_generates_with_the_hf_contract_and_takes_new_weights(tiny_bundle: Any) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'queryrl[vllm]')")
    model = copy.deepcopy(tiny_bundle.model).cuda()
    backend = make_rollout("vllm", model, tiny_bundle.tokenizer, micro_batch_size=2)
    prompts = [tiny_bundle.tokenizer.encode("1 + 1 ="), tiny_bundle.tokenizer.encode("hello")]
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=8)
    out = backend.generate(prompts, greedy)
    assert out.prompt_index.tolist() == [0, 1]
    assert out.response_ids.shape[0] == 2
    sampled = backend.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=8))
    assert sampled.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert bool((sampled.rollout_logprobs <= 0).all())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    backend.update_weights(model)
    assert not torch.equal(backend.generate(prompts, greedy).response_ids, out.response_ids)
