"""Rollout: prompts (token ids) -> sampled responses with their log-probs.

Backends by name (``rollout.backend``): ``hf`` (transformers ``generate``, CPU or GPU; for Qwen2, Qwen3,
Llama and Gemma 3 models :mod:`queryrl.rollout.fast_decode`'s own decode loop, ``rollout.fast_decode``);
``vllm`` (:mod:`queryrl.rollout.vllm`: a CUDA GPU and the vllm extra; imported only when chosen).
"""

from queryrl.rollout.base import (
    ROLLOUT_BACKENDS,
    RolloutBackend,
    RolloutFactory,
    RolloutOutput,
    SamplingParams,
    eos_response_mask,
    left_pad,
    make_rollout,
)
from queryrl.rollout.fast_decode import FastDecoder
from queryrl.rollout.hf import HFRollout

__all__ = [
    "ROLLOUT_BACKENDS",
    "FastDecoder",
    "HFRollout",
    "RolloutBackend",
    "RolloutFactory",
    "RolloutOutput",
    "SamplingParams",
    "eos_response_mask",
    "left_pad",
    "make_rollout",
]
