"""The fast decode path with LoRA policies and a compute dtype: against peft's ``generate``, the
trainer's log-probs, and after optimizer steps (the merged copies must follow the adapters)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import queryrl.rollout.fast_decode_arch as fast_decode_arch
from queryrl.engine.batch import Batch
from queryrl.engine.policy import compute_logprobs
from queryrl.models.loading import set_compute_dtype
from queryrl.rollout import HFRollout, SamplingParams
from queryrl.rollout.fast_decode import FastDecoder
from tests.rollout.helpers import (
    GREEDY,
    TARGETS,
    arch_model,
    assert_same_greedy,
    build,
    paths,
    tiny_config,
    with_lora,
)

ARCHS = ["qwen2", "llama", "gemma3"]


def random_model(tokenizer: Any, name: str) -> nn.Module:
    """A small random Qwen2 (diverse greedy tokens, unlike the tiny model's), or helpers.ARCHS[name]."""
    return build(tiny_config(tokenizer)) if name == "qwen2" else arch_model(tokenizer, name)


@pytest.fixture
def lora_model(request: pytest.FixtureRequest, tiny_bundle: Any) -> nn.Module:
    """`random_model` (Qwen2 unless parametrized with another name) with LoRA adapters."""
    return with_lora(random_model(tiny_bundle.tokenizer, getattr(request, "param", "qwen2")))


def adapter_step(model: nn.Module, lr: float = 0.01) -> None:
    """One AdamW step on the adapters only, with random gradients: what the trainer does in place."""
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert adapters
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW(adapters, lr=lr)
    for param in adapters:
        param.grad = torch.randn_like(param)
    optimizer.step()


@pytest.mark.parametrize("lora_model", ARCHS, indirect=True)
def test_lora_takes_the_fast_path_with_generates_tokens(
    lora_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    fast, slow = paths(lora_model, tiny_bundle.tokenizer, micro_batch_size=3)
    a = fast.generate(prompts, GREEDY)
    assert_same_greedy(a, slow.generate(prompts, GREEDY))
    # the adapters matter: the base alone answers otherwise
    with lora_model.disable_adapter():  # type: ignore[operator]
        base = slow.generate(prompts, GREEDY)
        assert fast.decode_path == "fast"
        assert_same_greedy(fast.generate(prompts, GREEDY), base)  # disabled adapters are seen too
    assert not torch.equal(a.response_ids, base.response_ids)


@pytest.mark.parametrize("lora_model", ARCHS, indirect=True)
def test_lora_sampled_logprobs_equal_the_trainers(
    lora_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    fast, _ = paths(lora_model, tiny_bundle.tokenizer)
    torch.manual_seed(0)
    out = fast.generate(prompts, SamplingParams(n=4, temperature=0.7, top_k=30, top_p=0.9, max_new_tokens=10))
    logprobs, _ = compute_logprobs(lora_model, Batch.from_rollout(out), micro_batch_size=8, temperature=0.7)
    torch.testing.assert_close(out.rollout_logprobs, logprobs * out.response_mask, atol=1e-5, rtol=0)


@pytest.mark.parametrize("lora_model", ["qwen2", "gemma3"], indirect=True)
def test_optimizer_steps_on_the_adapters_are_seen(
    lora_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """The base copies (fused QKV and gate/up) are made once and kept through adapter steps, which cost no
    copy of the model; the adapters are read afresh, so a step is seen (no update_weights needed)."""
    fast, slow = paths(lora_model, tiny_bundle.tokenizer)
    state = {k: v.clone() for k, v in lora_model.state_dict().items()}
    before = fast.generate(prompts, GREEDY)
    decoder = fast._fast_decoder()
    assert decoder is not None
    base = decoder._weights().layers[0].qkv[0][0]
    assert decoder._weights().layers[0].qkv_lora is not None
    assert decoder._weights().layers[0].qkv[0][0] is base  # nothing changed: the copies are reused
    for name, value in lora_model.state_dict().items():  # the trained module is never modified
        assert torch.equal(value, state[name]), name
    for _ in range(2):
        lora_before = decoder._weights().layers[0].qkv_lora
        adapter_step(lora_model)
        after = fast.generate(prompts, GREEDY)
        weights = decoder._weights()
        assert weights.layers[0].qkv[0][0] is base  # an adapter step leaves the base copies alone
        assert lora_before is not None
        assert weights.layers[0].qkv_lora is not None
        assert not torch.equal(weights.layers[0].qkv_lora[1], lora_before[1])
        assert_same_greedy(after, slow.generate(prompts, GREEDY))
    assert not torch.equal(before.response_ids, after.response_ids)
    torch.manual_seed(1)
    out = fast.generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=10))
    logprobs, _ = compute_logprobs(lora_model, Batch.from_rollout(out), micro_batch_size=8, temperature=0.7)
    torch.testing.assert_close(out.rollout_logprobs, logprobs * out.response_mask, atol=1e-5, rtol=0)


def test_a_change_of_a_base_weight_rebuilds_the_base_copies(
    lora_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """A trained base (modules_to_save, a full load_state_dict) is seen too: its copies are keyed on it."""
    fast, _ = paths(lora_model, tiny_bundle.tokenizer)
    decoder = fast._fast_decoder()
    assert decoder is not None
    base = decoder._weights().layers[0].qkv[0][0]
    q_proj: Any = lora_model.get_base_model().model.layers[0].self_attn.q_proj  # type: ignore[operator]
    with torch.no_grad():
        q_proj.base_layer.weight.mul_(1.5)
    rebuilt = decoder._weights().layers[0].qkv[0][0]
    assert rebuilt is not base
    out_features = q_proj.base_layer.weight.shape[0]
    torch.testing.assert_close(rebuilt[:out_features], q_proj.base_layer.weight, rtol=0, atol=0)
    trained = copy.deepcopy(lora_model)
    assert_same_greedy(
        fast.generate(prompts, GREEDY), paths(trained, tiny_bundle.tokenizer)[1].generate(prompts, GREEDY)
    )


def test_load_state_dict_into_the_adapters_is_seen(
    lora_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """What the Ray driver's mirror and checkpoint resume do: copy weights in with load_state_dict."""
    trained = copy.deepcopy(lora_model)
    adapter_step(trained)
    fast, _ = paths(lora_model, tiny_bundle.tokenizer)
    fast.generate(prompts[:1], GREEDY)  # fill the cache
    fast.update_weights(trained)
    assert_same_greedy(
        fast.generate(prompts, GREEDY), paths(trained, tiny_bundle.tokenizer)[1].generate(prompts, GREEDY)
    )


def test_lora_layers_injected_in_place_and_qwen3(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """LoRA layers without a PeftModel around them; Qwen3 (q/k norms, untied head, biases)."""
    from peft import LoraConfig, inject_adapter_in_model

    tok = tiny_bundle.tokenizer
    model = build(tiny_config(tok, "qwen3", head_dim=16, attention_bias=True, tie_word_embeddings=False))
    torch.manual_seed(0)
    injected = inject_adapter_in_model(LoraConfig(r=4, target_modules=TARGETS, init_lora_weights=False), model)
    fast, slow = paths(injected, tok, micro_batch_size=3)
    assert_same_greedy(fast.generate(prompts, GREEDY), slow.generate(prompts, GREEDY))


def test_unfused_lora_projections(
    lora_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fast_decode_arch, "FUSE_MAX_BYTES", 0)
    fast, slow = paths(lora_model, tiny_bundle.tokenizer)
    assert all(len(layer.qkv) == 3 for layer in FastDecoder(lora_model)._weights().layers)
    assert_same_greedy(fast.generate(prompts, GREEDY), slow.generate(prompts, GREEDY))


@pytest.mark.parametrize("name", ARCHS)
def test_a_compute_dtype_decodes_like_a_model_stored_in_it(
    name: str, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """Mixed precision: float32 master weights (LoRA included), bf16 decoding = the same LoRA model stored in
    bf16 (same tokens, same log-probs; the adapters' scaling 2 is exact in both); a step on the master
    weights reaches the bf16 copies."""
    tok = tiny_bundle.tokenizer
    master = with_lora(random_model(tok, name))
    set_compute_dtype(master, torch.bfloat16)
    backend = HFRollout(master, tok)
    assert backend.decode_path == "fast"
    for step in range(2):
        stored: Any = copy.deepcopy(master).to(torch.bfloat16)
        # as from_pretrained(dtype=bfloat16) leaves it: the RoPE frequencies stay float32
        for buffer, value in master.get_base_model().model.rotary_emb.named_buffers():  # type: ignore[operator]
            setattr(stored.get_base_model().model.rotary_emb, buffer, value.clone())
        set_compute_dtype(stored, None)
        reference = HFRollout(stored, tok)
        assert reference.decode_path == "fast"
        a, b = backend.generate(prompts, GREEDY), reference.generate(prompts, GREEDY)
        assert torch.equal(a.response_ids, b.response_ids)
        assert torch.equal(a.rollout_logprobs, b.rollout_logprobs)
        assert {p.dtype for p in master.parameters()} == {torch.float32}
        if step == 0:
            adapter_step(master)


def test_the_generate_path_runs_in_the_compute_dtype(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """fast_decode=off with a compute dtype: generate under autocast, close to the fast path's bf16."""
    tok = tiny_bundle.tokenizer
    master = with_lora(build(tiny_config(tok)))
    set_compute_dtype(master, torch.bfloat16)
    fp32 = HFRollout(copy.deepcopy(master), tok, fast_decode="off")
    set_compute_dtype(fp32.model, None)
    slow = HFRollout(master, tok, fast_decode="off")
    a, b = slow.generate(prompts, GREEDY), fp32.generate(prompts, GREEDY)
    gap = float((a.rollout_logprobs[:, :1] - b.rollout_logprobs[:, :1]).abs().max())
    assert 0 < gap < 0.1, gap  # bf16 rounding: present, and small


@pytest.mark.filterwarnings("ignore:`lora_bias=True` was passed")  # peft: the base layers have no bias
@pytest.mark.parametrize(
    ("extra", "reason"),
    [({"use_dora": True}, "LoRA variant"), ({"lora_bias": True}, "lora_bias")],
)
def test_lora_variants_fall_back_to_generate(
    extra: dict[str, Any], reason: str, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    model = with_lora(tiny_bundle.model, **extra)
    backend = HFRollout(model, tiny_bundle.tokenizer)
    assert backend.decode_path == "generate"
    assert reason in str(backend.fallback_reason)
    assert backend.generate(prompts[:1], GREEDY).response_ids.shape[0] == 2


def test_merged_adapters_fall_back(lora_model: nn.Module, tiny_bundle: Any) -> None:
    lora_model.merge_adapter()  # type: ignore[operator]
    backend = HFRollout(lora_model, tiny_bundle.tokenizer)
    assert "merged" in str(backend.fallback_reason)
