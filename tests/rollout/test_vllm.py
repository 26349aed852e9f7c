"""The vLLM backend: weight export on CPU; generation and weight sync on a GPU (marked gpu)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from queryrl.rollout import SamplingParams, make_rollout
from queryrl.rollout.vllm import merged_state_dict, model_path


def _lora(tiny_bundle: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        copy.deepcopy(tiny_bundle.model),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)  # a non-zero adapter
    return model


def test_full_weights_are_the_state_dict(tiny_bundle: Any) -> None:
    state = merged_state_dict(tiny_bundle.model)
    assert state.keys() == tiny_bundle.model.state_dict().keys()


def test_lora_weights_are_the_merged_base_under_the_plain_names(tiny_bundle: Any) -> None:
    model = _lora(tiny_bundle)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = merged_state_dict(model)
    assert state.keys() == tiny_bundle.model.state_dict().keys()  # what vLLM's load_weights expects
    base = tiny_bundle.model.state_dict()
    q = next(k for k in state if k.endswith("q_proj.weight"))
    k_proj = next(k for k in state if k.endswith("k_proj.weight"))
    assert not torch.allclose(state[q], base[q])  # the adapter is merged in
    assert torch.equal(state[k_proj], base[k_proj])  # untouched modules are the base weights
    for key, value in model.state_dict().items():  # the trainer's model is left unmerged
        torch.testing.assert_close(value, before[key], atol=1e-6, rtol=0)


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
