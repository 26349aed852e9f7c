"""The fast decode path against transformers: tokens, logits, log-probs, weight updates, sampling, fallbacks."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import queryrl.rollout.fast_decode as fast_decode
import queryrl.rollout.fast_decode_arch as fast_decode_arch
from queryrl.engine.batch import Batch
from queryrl.engine.policy import compute_logprobs
from queryrl.rollout import HFRollout, SamplingParams, make_rollout
from queryrl.rollout.base import left_pad
from queryrl.rollout.fast_decode import FastDecoder, draw, unsupported_reason, warp
from tests.rollout.helpers import (
    ARCHS,
    GREEDY,
    arch_model,
    assert_same_greedy,
    build,
    paths,
    tiny_config,
    to_bfloat16,
    with_lm_head_bias,
)


@pytest.fixture(scope="module")
def qwen3_model(tiny_bundle: Any) -> nn.Module:
    """Qwen3 with what the tiny Qwen2 lacks: q/k norms, head_dim != hidden / heads, an untied
    lm_head, attention biases (o_proj's too), one KV head for four query heads."""
    config = tiny_config(
        tiny_bundle.tokenizer,
        "qwen3",
        head_dim=16,
        num_key_value_heads=1,
        attention_bias=True,
        tie_word_embeddings=False,
    )
    return build(config)


@pytest.fixture(scope="module")
def greedy_eos_model(tiny_bundle: Any) -> nn.Module:
    """EOS boosted just enough that greedy responses end after 1 to 8 tokens (4, 1, 6, 8, 6)."""
    return with_lm_head_bias(tiny_bundle.model, tiny_bundle.tokenizer.eos_token_id, 1.15)


# the scaled RoPE types not in helpers.ARCHS (llama3 is), on the Llama model; yarn also scales cos and sin
ROPES = {
    "llama_linear_rope": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
    "llama_yarn_rope": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4, "original_max_position_embeddings": 16},
}


@pytest.fixture(scope="module")
def arch_models(tiny_bundle: Any) -> dict[str, nn.Module]:
    """Llama, Gemma 3 and sliding-window Qwen2 models (helpers.ARCHS), each also with EOS boosted
    (``<name>_eos``: sampled responses of mixed lengths), and Llama with the ROPES."""
    tok = tiny_bundle.tokenizer
    models = {name: arch_model(tok, name) for name in ARCHS}
    models |= {f"{name}_eos": with_lm_head_bias(m, tok.eos_token_id, 3.0) for name, m in models.items()}
    return models | {name: arch_model(tok, "llama", rope_parameters=rope) for name, rope in ROPES.items()}


@pytest.fixture
def models(
    sharp_model: nn.Module,
    eos_model: nn.Module,
    greedy_eos_model: nn.Module,
    qwen3_model: nn.Module,
    arch_models: dict[str, nn.Module],
) -> dict[str, nn.Module]:
    return {"sharp": sharp_model, "eos": eos_model, "greedy_eos": greedy_eos_model, "qwen3": qwen3_model} | arch_models


def test_the_tiny_model_is_supported(tiny_bundle: Any) -> None:
    assert unsupported_reason(tiny_bundle.model) is None
    backend = make_rollout("hf", tiny_bundle.model, tiny_bundle.tokenizer)
    assert backend.decode_path == "fast"  # type: ignore[attr-defined]
    assert backend.fallback_reason is None  # type: ignore[attr-defined]
    off = make_rollout("hf", tiny_bundle.model, tiny_bundle.tokenizer, fast_decode="off")
    assert off.decode_path == "generate"  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["sharp", "greedy_eos", "qwen3", *ARCHS, *ROPES])
def test_greedy_equals_generate(
    name: str, models: dict[str, nn.Module], tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """Prompts of five lengths, two samples each, micro-batches of 3 that split a prompt's samples."""
    fast, slow = paths(models[name], tiny_bundle.tokenizer, micro_batch_size=3)
    a, b = fast.generate(prompts, GREEDY), slow.generate(prompts, GREEDY)
    assert_same_greedy(a, b)
    if name == "greedy_eos":  # the case of interest: rows end at different steps
        assert a.response_lengths.unique().numel() > 2
        assert a.truncated.any()
        assert not a.truncated.all()


@pytest.mark.parametrize("name", ["sharp", "qwen3", "llama", "gemma3"])
def test_unfused_projections_give_the_same_tokens(
    name: str, models: dict[str, nn.Module], tiny_bundle: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose fused QKV and gate/up copies would be too big keeps one matmul per projection."""
    monkeypatch.setattr(fast_decode_arch, "FUSE_MAX_BYTES", 0)
    fast, slow = paths(models[name], tiny_bundle.tokenizer)
    assert all(len(layer.qkv) == 3 for layer in FastDecoder(models[name])._weights().layers)
    assert_same_greedy(fast.generate(prompts, GREEDY), slow.generate(prompts, GREEDY))


@pytest.mark.parametrize("name", ["sharp", "qwen3", "llama", "gemma3"])
def test_wide_matrices_in_the_flipped_orientation_give_the_same_tokens(
    name: str, models: dict[str, nn.Module], tiny_bundle: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``(W h^T)^T`` path for wide matrices (on the 0.5B model's gate/up and head), forced onto the tiny
    models' gate/up and lm_head: the same greedy tokens as ``generate``."""
    monkeypatch.setattr(fast_decode, "WIDE_MIN_ELEMENTS", 0)
    calls: list[tuple[int, ...]] = []
    mm = torch.mm

    def spy(a: Tensor, b: Tensor) -> Tensor:
        calls.append(tuple(a.shape))
        return mm(a, b)

    monkeypatch.setattr(fast_decode.torch, "mm", spy)
    fast, slow = paths(models[name], tiny_bundle.tokenizer, micro_batch_size=3)
    assert_same_greedy(fast.generate(prompts, GREEDY), slow.generate(prompts, GREEDY))
    config = models[name].config
    assert (config.vocab_size, config.hidden_size) in calls  # the head took the flipped path


def test_the_flipped_product_equals_f_linear() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(4 * 1024, 512, generator=generator)  # 2M entries, 8 times as tall as wide
    bias = torch.randn(4 * 1024, generator=generator)
    for rows in (2, 8, 64):
        h = torch.randn(rows, 512, generator=generator)
        out = fast_decode._linear(h, weight, bias)
        assert out.is_contiguous()
        torch.testing.assert_close(out, F.linear(h, weight, bias), atol=1e-4, rtol=1e-5)
    small = torch.randn(384, 64, generator=generator)  # the tiny model's gate/up: F.linear itself
    h = torch.randn(8, 64, generator=generator)
    assert torch.equal(fast_decode._linear(h, small), F.linear(h, small))


@pytest.mark.parametrize("name", ["eos", "qwen3", *(f"{name}_eos" for name in ARCHS), *ROPES])
def test_every_steps_logits_match_the_models_forward(
    name: str, models: dict[str, nn.Module], tiny_bundle: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """All V logits of every step, finished rows included, against one full forward pass."""
    model, tok = models[name], tiny_bundle.tokenizer
    seen: list[Tensor] = []
    sample_step = fast_decode.sample_step

    def spy(logits: Tensor, params: SamplingParams) -> tuple[Tensor, Tensor, Tensor]:
        seen.append(logits.clone())
        return sample_step(logits, params)

    monkeypatch.setattr(fast_decode, "sample_step", spy)
    ids, mask = left_pad([p for p in prompts for _ in range(3)], tok.pad_token_id)  # (B, P)
    torch.manual_seed(0)
    params = SamplingParams(temperature=0.7, top_k=50, max_new_tokens=10)
    response, _ = FastDecoder(model).generate(ids, mask, params, tok.eos_token_id, tok.pad_token_id)  # (B, T)
    b, p, t = *ids.shape, response.shape[1]
    assert len(seen) == t
    # generated tokens are all attended, pad tokens after EOS too, as in generate
    attention_mask = torch.cat([mask, torch.ones(b, t, dtype=torch.long)], dim=1)  # (B, P + T)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([ids, response], 1), attention_mask=attention_mask, position_ids=position_ids
        ).logits  # (B, P + T, V)
    torch.testing.assert_close(torch.stack(seen, 1), logits[:, p - 1 : -1].float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["eos", "llama_eos", "llama_tied_eos", "gemma3_eos", "gemma3_untied_eos"])
def test_sampled_logprobs_equal_the_trainers(
    name: str, models: dict[str, nn.Module], tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """rollout_logprobs (temperature, top-k and top-p on) = compute_logprobs of the same sequences."""
    model = models[name]
    fast, _ = paths(model, tiny_bundle.tokenizer)
    torch.manual_seed(0)
    out = fast.generate(prompts, SamplingParams(n=4, temperature=0.7, top_k=30, top_p=0.9, max_new_tokens=10))
    if name != "eos":  # (the tiny model's boosted EOS comes first at temperature 0.7)
        assert out.response_mask.sum(1).unique().numel() > 2, out.response_mask.sum(1)  # EOS at different steps
    batch = Batch.from_rollout(out)
    logprobs, _ = compute_logprobs(model, batch, micro_batch_size=8, temperature=0.7)
    torch.testing.assert_close(out.rollout_logprobs, logprobs * out.response_mask, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["gemma3", "qwen2_sliding"])
def test_the_sliding_window_matters(name: str, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """The same weights with a window longer than every sequence answer otherwise, and also as generate does."""
    tok = tiny_bundle.tokenizer
    windowed, full = arch_model(tok, name), arch_model(tok, name, sliding_window=4096)
    a, b = paths(windowed, tok)[0].generate(prompts, GREEDY), paths(full, tok)[0].generate(prompts, GREEDY)
    assert not torch.equal(a.response_ids, b.response_ids)
    assert_same_greedy(b, paths(full, tok)[1].generate(prompts, GREEDY))


def _reference_logits(model: nn.Module, out: Any) -> Tensor:
    """(N, T, V) float32 logits of one full forward over prompt + response, at the response tokens."""
    attention_mask = torch.cat([out.prompt_mask, torch.ones_like(out.response_ids)], dim=1)  # (N, P + T)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([out.prompt_ids, out.response_ids], 1),
            attention_mask=attention_mask,
            position_ids=position_ids,
        ).logits
    return logits[:, out.prompt_ids.shape[1] - 1 : -1].float()


@pytest.mark.parametrize("name", ["llama", "llama_tied", "gemma3", "gemma3_untied", "qwen2_sliding"])
def test_bfloat16_matches_generate_up_to_rounding_ties(name: str, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """A model stored in bfloat16: each row's greedy tokens equal generate's until a step whose top two
    logits (one full forward over generate's tokens) are within TIE: one bf16 rounding of two nearly
    equal logits may go either way there. A quarter of the tokens at least is compared, and the
    log-probs there agree within TIE; every step's logits are within 2 TIE of the full forward's."""
    tie = 0.03  # about 4 bf16 ulps at the logits' scale (1 to 2)
    tok = tiny_bundle.tokenizer
    model = to_bfloat16(arch_model(tok, name))
    fast, slow = paths(model, tok, micro_batch_size=3)
    a, b = fast.generate(prompts, GREEDY), slow.generate(prompts, GREEDY)
    top2 = _reference_logits(model, b).topk(2, dim=-1).values  # (N, T, 2)
    near = (top2[..., 0] - top2[..., 1]) < tie  # (N, T)
    shared = (~near).long().cumprod(dim=1).bool()  # the steps before each row's first near-tie
    assert shared.float().mean() >= 0.25, shared.float().mean()
    assert torch.equal(a.response_ids[shared], b.response_ids[shared])
    torch.testing.assert_close(a.rollout_logprobs[shared], b.rollout_logprobs[shared], atol=tie, rtol=0)
    # the fast path's own sequences against the model's forward, ties or not
    logits = _reference_logits(model, a)
    logprobs = torch.log_softmax(logits, -1).gather(-1, a.response_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(a.rollout_logprobs, logprobs, atol=2 * tie, rtol=0)


def test_generated_tensors_train_like_any_other(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """FastDecoder generates in inference mode; what it returns is a normal tensor, so the update can gather the
    response tokens' log-probs with it and backpropagate (autograd cannot save an inference tensor)."""
    model = copy.deepcopy(tiny_bundle.model)
    tok = tiny_bundle.tokenizer
    ids, mask = left_pad(prompts, tok.pad_token_id)
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    response_ids, logprobs = FastDecoder(model).generate(ids, mask, params, tok.eos_token_id, tok.pad_token_id)
    assert not response_ids.is_inference()
    assert not logprobs.is_inference()
    t = response_ids.shape[1]
    logits = model(input_ids=torch.cat([ids, response_ids], 1)).logits[:, -t - 1 : -1]
    logits.log_softmax(-1).gather(-1, response_ids[..., None]).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_in_place_optimizer_steps_are_seen(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """Colocated: the trainer steps the very module the backend generates with."""
    tok = tiny_bundle.tokenizer
    model = copy.deepcopy(tiny_bundle.model)
    fast, slow = paths(model, tok)
    before = fast.generate(prompts, GREEDY)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    torch.manual_seed(0)
    for param in model.parameters():
        param.grad = 0.05 * torch.randn_like(param)
    optimizer.step()
    fast.update_weights(model)  # what the trainer calls: a no-op when colocated
    after = fast.generate(prompts, GREEDY)
    assert not torch.equal(before.response_ids, after.response_ids)
    assert_same_greedy(after, slow.generate(prompts, GREEDY))


def test_update_weights_from_another_module(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    tok = tiny_bundle.tokenizer
    trained = copy.deepcopy(tiny_bundle.model)
    with torch.no_grad():
        for param in trained.parameters():
            param.add_(0.05 * torch.randn_like(param))
    fast, _ = paths(copy.deepcopy(tiny_bundle.model), tok)
    fast.update_weights(trained)
    assert_same_greedy(fast.generate(prompts, GREEDY), paths(trained, tok)[1].generate(prompts, GREEDY))


def _prompt_tuning(model: nn.Module) -> nn.Module:
    """peft but not LoRA: virtual tokens added to every input (LoRA itself: test_fast_decode_lora.py)."""
    from peft import PromptTuningConfig, get_peft_model

    peft_model: nn.Module = get_peft_model(model, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    return peft_model


def _hooked(model: nn.Module) -> nn.Module:
    model.model.layers[0].mlp.register_forward_hook(lambda module, args, out: out * 0)  # type: ignore[union-attr,index]
    return model


def _lora_in_place(model: nn.Module) -> nn.Module:
    from peft import LoraConfig, inject_adapter_in_model

    injected: nn.Module = inject_adapter_in_model(LoraConfig(r=2, target_modules=["embed_tokens"]), model)
    return injected


FALLBACKS = {
    "peft prompt tuning": (lambda tok: _prompt_tuning(build(tiny_config(tok))), "type PROMPT_TUNING (only LoRA)"),
    "lora on the embeddings": (lambda tok: _lora_in_place(build(tiny_config(tok))), "wrapped or quantized embed"),
    "gemma3 lora on the embeddings": (
        lambda tok: _lora_in_place(arch_model(tok, "gemma3")),
        "wrapped or quantized embed",
    ),
    "mistral": (lambda tok: build(tiny_config(tok, "mistral")), "architecture MistralForCausalLM"),
    "dynamic rope": (
        lambda tok: build(tiny_config(tok, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})),
        "rope_type 'dynamic'",
    ),
    "gemma3 dynamic rope": (
        lambda tok: arch_model(
            tok,
            "gemma3",
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6},
            },
        ),
        "rope_type 'dynamic' (full_attention)",
    ),
    "gelu mlp": (lambda tok: build(tiny_config(tok, "llama", hidden_act="gelu")), "hidden_act 'gelu'"),
    "attention softcapping": (
        lambda tok: arch_model(tok, "gemma3", attn_logit_softcapping=50.0),
        "attn_logit_softcapping",
    ),
    "bidirectional attention": (
        lambda tok: arch_model(tok, "gemma3", use_bidirectional_attention=True),
        "use_bidirectional_attention",
    ),
    "forward hook": (lambda tok: _hooked(build(tiny_config(tok))), "forward hooks"),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # transformers on sliding windows with sdpa
@pytest.mark.parametrize("case", list(FALLBACKS))
def test_unsupported_models_fall_back_to_generate(case: str, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    tok = tiny_bundle.tokenizer
    make, reason = FALLBACKS[case]
    model = make(tok)
    backend = HFRollout(model, tok)
    assert backend.decode_path == "generate"
    assert reason in str(backend.fallback_reason)
    with pytest.raises(ValueError, match="does not support"):
        FastDecoder(model)
    out = backend.generate(prompts[:2], GREEDY)
    assert out.response_ids.shape[0] == 4


def test_gradient_checkpointing_keeps_the_fast_path(model_cache: Path, prompts: list[list[int]]) -> None:
    """Its only forward hook (the embeddings' output requires grad) changes no value."""
    from queryrl.config import load_config
    from queryrl.models import load_policy

    cfg = load_config(None, [f"model.cache_dir={model_cache}", "model.gradient_checkpointing=true"])
    bundle = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False)
    assert bundle.model.model.embed_tokens._forward_hooks  # type: ignore[union-attr]
    fast, slow = paths(bundle.model, bundle.tokenizer)
    assert_same_greedy(fast.generate(prompts, GREEDY), slow.generate(prompts, GREEDY))


def test_a_model_changed_after_construction_falls_back(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """The support check runs before every micro-batch, not once: a hook added later is honoured."""
    tok = tiny_bundle.tokenizer
    model = copy.deepcopy(tiny_bundle.model)
    backend = HFRollout(model, tok)
    backend.generate(prompts[:1], GREEDY)
    assert backend.decode_path == "fast"
    calls: list[int] = []
    model.model.register_forward_pre_hook(lambda module, args: calls.append(1))  # type: ignore[union-attr]
    backend.generate(prompts[:1], GREEDY)
    assert backend.decode_path == "generate"
    assert calls


def test_fast_decode_off_and_bad_values(tiny_bundle: Any) -> None:
    from queryrl.config import ConfigError, load_config

    off = HFRollout(tiny_bundle.model, tiny_bundle.tokenizer, fast_decode="off")
    assert (off.decode_path, off.fallback_reason) == ("generate", "fast_decode=off")
    with pytest.raises(ValueError, match="fast_decode"):
        HFRollout(tiny_bundle.model, tiny_bundle.tokenizer, fast_decode="on")
    with pytest.raises(ConfigError, match=r"rollout\.fast_decode"):
        load_config(None, ["rollout.fast_decode=on"])
    assert load_config(None, []).rollout.fast_decode == "auto"


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 5, 1.0), (0.7, 0, 0.8), (1.3, 40, 0.5), (1.0, 600, 0.95)]
)
def test_warp_equals_the_transformers_warpers(temperature: float, top_k: int, top_p: float) -> None:
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = (torch.randn(16, 512) * 3).round(decimals=1)  # rounded: ties at the top-k and top-p cuts
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else [])
    warpers += [TopKLogitsWarper(top_k)] if top_k else []
    warpers += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []
    expected = warpers(torch.zeros(16, 1, dtype=torch.long), logits.clone())
    scores = logits / temperature if temperature != 1.0 else logits
    assert torch.equal(warp(scores, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)), expected)


def test_draw_follows_the_probabilities() -> None:
    """Frequencies within 5 standard errors of the probabilities; a token of probability 0 never comes."""
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    torch.manual_seed(0)
    n = 200_000
    tokens, total = draw(probs.expand(n, -1))
    torch.testing.assert_close(total, torch.ones(n, 1, dtype=torch.float64))
    counts = torch.bincount(tokens, minlength=7).double()
    assert counts[probs == 0].sum() == 0
    stderr = (probs * (1 - probs) / n).sqrt().double()
    assert ((counts / n - probs.double()).abs() <= 5 * stderr + 1e-12).all(), counts / n
    # all the mass at one end, and rows that do not sum exactly to 1
    edges = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.3, 0.0]]).repeat(1000, 1)
    assert draw(edges)[0].view(1000, 3).eq(torch.tensor([0, 2, 1])).all()


def test_greedy_and_top_k_1_pick_the_argmax(sharp_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    fast, _ = paths(sharp_model, tiny_bundle.tokenizer)
    greedy = fast.generate(prompts, SamplingParams(do_sample=False, max_new_tokens=6))
    torch.manual_seed(0)
    top1 = fast.generate(prompts, SamplingParams(top_k=1, max_new_tokens=6))
    assert torch.equal(greedy.response_ids, top1.response_ids)
