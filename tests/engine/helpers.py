"""Helpers shared by the trainer's log-prob tests (response-only logits, the shared prompt forward)."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from queryrl.config import load_config
from queryrl.engine.batch import Batch
from queryrl.engine.policy import logprobs_from_logits
from queryrl.models import load_policy

TEMPERATURE = 0.7


def full_logprobs(model: nn.Module, batch: Batch) -> Tensor:
    """The reference: project every position to the vocabulary, then slice the response (the old code).

    Args:
        model: A causal LM.
        batch: Prompts ``(N, P)`` and responses ``(N, T)``.

    Returns:
        Log-probs of the response tokens at `TEMPERATURE`, shape ``(N, T)``.
    """
    input_ids, attention_mask, position_ids = batch.model_inputs()
    p = batch.prompt_ids.shape[1]
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return logprobs_from_logits(out.logits[:, p - 1 : -1] / TEMPERATURE, batch.response_ids)


def load(model_cache: Any, lora_rank: int) -> Any:
    """The tiny policy (no reference), seeded; with `lora_rank` > 0, LoRA adapters with non-zero ``lora_B``.

    Args:
        model_cache: Where the tiny model is built.
        lora_rank: 0 for full fine-tuning, else the LoRA rank.

    Returns:
        The policy bundle of ``queryrl.models.load_policy``.
    """
    cfg: DictConfig = load_config(None, [f"model.cache_dir={model_cache}", f"model.lora.rank={lora_rank}"])
    torch.manual_seed(0)
    bundle = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False)
    if bundle.lora:  # non-zero adapters, so the LoRA path really differs from the base
        for name, param in bundle.model.named_parameters():
            if "lora_B" in name:
                nn.init.normal_(param, std=0.05)
    return bundle
