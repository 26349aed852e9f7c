"""Models and comparisons shared by the rollout tests: hacked copies of a causal LM (the shared fixture is
never modified), small configs of other architectures, the fast and ``generate`` decode paths side by side."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from queryrl.rollout import HFRollout, RolloutOutput, SamplingParams

GREEDY = SamplingParams(do_sample=False, max_new_tokens=8, n=2)


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
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    config_class = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}[arch]
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
