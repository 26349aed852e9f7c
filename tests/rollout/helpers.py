"""Models and comparisons shared by the rollout tests: hacked copies of a causal LM (the shared fixture is
never modified), small configs of other architectures, the fast and ``generate`` decode paths side by side."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from queryrl.rollout import HFRollout, RolloutOutput, SamplingParams
from queryrl.rollout.int8 import Int8Linear, _rotate, weight_levels

GREEDY = SamplingParams(do_sample=False, max_new_tokens=8, n=2)
# the rollout prompts' questions: five lengths, English and Chinese
QUESTIONS = [
    "hello",
    "What is 3 + 4? Let's think step by step.",
    "请问这款手机多少钱？",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "say hello",
]


def with_lm_head_bias(model: nn.Module, token_id: int, bias: float, sharpen: float = 1.0) -> nn.Module:
    """A copy of `model` whose logits are ``sharpen * logits`` plus `bias` on `token_id`.

    The lm_head (tied to the embeddings in the tiny model) is replaced by an untied linear layer
    with a bias, so the shared fixture's weights are never touched.
    """
    hacked = copy.deepcopy(model)
    old = hacked.lm_head  # type: ignore[union-attr]
    head = nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight * sharpen)
        head.bias.zero_()
        head.bias[token_id] = bias
    hacked.lm_head = head  # type: ignore[union-attr]
    return hacked.eval()


def tiny_config(tokenizer: Any, arch: str = "qwen2", **overrides: Any) -> Any:
    """A small config of `arch` for the tiny tokenizer."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    classes = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig, "gemma3": Gemma3TextConfig}
    config_class = (classes | {"mistral": MistralConfig})[arch]
    settings: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
    }
    return config_class(**(settings | overrides))


# the other architectures' configs the fast path runs, each with what it adds to the tiny Qwen2; every
# one a GQA model of prompts longer than its sliding windows (the prompts have 13 to 50 tokens)
ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    # SmolLM2's family: untied lm_head, every attention and MLP bias
    "llama": ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False}),
    # tied, one KV head, head_dim != hidden / heads, llama3-scaled RoPE
    "llama_tied": (
        "llama",
        {
            "tie_word_embeddings": True,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    # Gemma 3 270M's layout in small: tied, sliding window 4 on the local layers (local RoPE base
    # 1e4, global 1e6), query_pre_attn_scalar != head_dim
    "gemma3": (
        "gemma3",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 8,
            "sliding_window": 4,
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
    ),
    # untied, one KV head, linear-scaled global RoPE (Gemma 3 4B's), final logit softcapping
    "gemma3_untied": (
        "gemma3",
        {
            "tie_word_embeddings": False,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "query_pre_attn_scalar": 8,
            "sliding_window": 3,
            "final_logit_softcapping": 3.0,
            "layer_types": ["full_attention", "sliding_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
        },
    ),
    # Qwen2 with use_sliding_window: the second layer slides (max_window_layers=1)
    "qwen2_sliding": ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
}


def arch_model(tokenizer: Any, name: str, **overrides: Any) -> nn.Module:
    """The random model of ``ARCHS[name]`` (plus `overrides`) for the tiny tokenizer."""
    arch, settings = ARCHS[name]
    model = build(tiny_config(tokenizer, arch, **(settings | overrides)))
    with torch.no_grad():  # Llama's o_proj and MLP biases as large as build's would make every token the same
        for param_name, param in model.named_parameters():
            if param_name.endswith("proj.bias"):
                param.mul_(0.03)
    return model


# the architectures the shared-prefix paths are checked on: the tiny Qwen2, each of ARCHS, and Gemma 3 with a
# sliding window longer than the rows (so its prefix is shared where the ARCHS one's window forbids it)
PREFIX_ARCHS = ["qwen2", "gemma3_wide", *sorted(ARCHS)]
SHORT_WINDOW_ARCHS = (
    "gemma3",
    "gemma3_untied",
    "qwen2_sliding",
)  # sliding windows of 3-4 tokens, shorter than the rows


def lora_arch(bundle: Any, name: str) -> nn.Module:
    """A LoRA copy (in train mode) of the tiny policy (``qwen2``), of ``ARCHS[name]``, or of Gemma 3 with a
    64-token window (``gemma3_wide``), for the tiny tokenizer of `bundle`."""
    if name == "gemma3_wide":
        base = arch_model(bundle.tokenizer, "gemma3", sliding_window=64)
    else:
        base = bundle.model if name == "qwen2" else arch_model(bundle.tokenizer, name)
    return with_lora(base).train()  # with_lora deep-copies the model


def to_bfloat16(model: nn.Module) -> nn.Module:
    """`model` stored in bfloat16 as ``from_pretrained(dtype=bfloat16)`` leaves it: the RoPE frequency
    buffers stay float32."""
    rotary: Any = model.model.rotary_emb  # type: ignore[union-attr]
    buffers = {name: buf.clone() for name, buf in rotary.named_buffers()}
    model = model.to(torch.bfloat16)
    for name, buf in buffers.items():
        setattr(rotary, name, buf)
    return model


def build(config: Any) -> nn.Module:
    """The causal LM of `config`, seeded, with non-trivial norm weights and biases (not the ones and
    zeros of a fresh model, which would hide a missing norm weight or bias)."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model: nn.Module = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 1:
                    param.add_(0.3 * torch.randn_like(param))
                else:
                    param.mul_(3.0)
    return model.eval()


def paths(model: nn.Module, tokenizer: Any, micro_batch_size: int = 64) -> tuple[HFRollout, HFRollout]:
    """(fast, generate) backends over the same module."""
    fast = HFRollout(model, tokenizer, micro_batch_size=micro_batch_size)
    slow = HFRollout(model, tokenizer, micro_batch_size=micro_batch_size, fast_decode="off")
    assert (fast.decode_path, slow.decode_path) == ("fast", "generate"), fast.fallback_reason
    return fast, slow


def assert_same_greedy(a: RolloutOutput, b: RolloutOutput) -> None:
    """The same tokens and masks in `a` and `b`, and log-probs within 1e-5."""
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "prompt_index", "truncated"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    torch.testing.assert_close(a.rollout_logprobs, b.rollout_logprobs, atol=1e-5, rtol=0)


B_SCALE = 0.02
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def with_lora(model: nn.Module, seed: int = 0, scale: float = B_SCALE, **extra: Any) -> nn.Module:
    """`model` (a copy) in a peft LoRA model, r=4 on every projection, B drawn with std `scale`
    (peft's B = 0 would make the adapters invisible; larger B make the tiny model babble)."""
    from peft import LoraConfig, get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, **extra)
        peft_model: nn.Module = get_peft_model(copy.deepcopy(model), config)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, scale)
    return peft_model.eval()


def within_rounding_bound(q: Int8Linear, x: Tensor, w: Tensor, bias: Tensor) -> bool:
    """Rotated (``h = x R``, ``v = W R``: ``h v^T = x W^T``), per output j of each row: ``|y_j - y'_j| <= sum_i |h_i|
    dv_j + |v_ji| dh + dh dv_j``, with dv_j half of row j's weight step (its max over the levels) and dh half of the
    row's activation step (its max over 127)."""
    h, v = _rotate(x, q.block), _rotate(w, q.block)
    dv = v.abs().amax(1) / weight_levels() / 2  # (out,)
    dh = h.abs().amax(1, keepdim=True) / 127 / 2  # (N, 1)
    bound = h.abs().sum(1, keepdim=True) * dv + dh * v.abs().sum(1) + dh * dv * w.shape[1]
    err = (q(x) - F.linear(x, w, bias)).abs()
    return bool((err <= bound * 1.0001 + 1e-4).all())
