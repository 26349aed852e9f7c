"""The vllm backend's engine options (issue 49 item 5): ``actor_rollout_ref.rollout.gpu_memory_utilization=0.6``
was refused with "set it through the vllm backend's own options" while rollout/vllm.py hard-coded 0.4. Now
``rollout.vllm`` is a typed node (verl's keys are aliases), validated, passed to ``vllm.LLM`` and shown by
``--dry-run`` (tests/trainer/test_plan.py)."""

from __future__ import annotations

from typing import Any

import pytest

from queryrl.config import ConfigError, load_config
from queryrl.rollout import make_rollout
from queryrl.rollout.vllm import config_engine, engine_kwargs

VERL = [
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.max_num_seqs=128",
    "actor_rollout_ref.rollout.max_model_len=2048",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.rollout.enable_prefix_caching=true",
    "rollout.backend=vllm",
]


def test_verls_keys_reach_the_engines_keyword_arguments() -> None:
    cfg = load_config(None, [*VERL, "rollout.vllm.extra.kv_cache_dtype=fp8"])
    assert engine_kwargs(config_engine(cfg.rollout)) == {
        "gpu_memory_utilization": 0.6,
        "max_num_seqs": 128,
        "max_model_len": 2048,
        "enforce_eager": True,
        "enable_prefix_caching": True,
        "kv_cache_dtype": "fp8",
    }


def test_the_defaults_send_only_the_memory_share() -> None:
    cfg = load_config(None, ["rollout.backend=vllm"])
    assert engine_kwargs(config_engine(cfg.rollout)) == {"gpu_memory_utilization": 0.4}  # the rest: vLLM's own
    # the hf backend's options: its fast path's CUDA graph (rollout.decode_graph), int8 base layers (rollout.quantize)
    assert config_engine(load_config(None, []).rollout) == {"decode_graph": "off", "quantize": "none"}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor_rollout_ref.rollout.gpu_memory_utilization=0", r"gpu_memory_utilization must be in \(0, 1\]"),
        (
            "rollout.vllm.gpu_memory_utilization=1.2",
            r"gpu_memory_utilization must be in \(0, 1\] \(a share of the GPU\), got 1.2",
        ),
        ("rollout.vllm.max_num_seqs=0", r"rollout\.vllm\.max_num_seqs must be >= 1 or null"),
        ("rollout.vllm.max_model_len=-5", r"rollout\.vllm\.max_model_len must be >= 1 or null"),
        ("rollout.vllm.extra.dtype=float16", r"rollout\.vllm\.extra\.dtype: queryrl sets it itself"),
        ("rollout.vllm.extra.tensor_parallel_size=2", r"extra\.tensor_parallel_size: queryrl sets it itself"),
        ("rollout.vllm.extra.max_num_seqs=8", r"rollout\.vllm\.extra\.max_num_seqs: set rollout\.vllm\.max_num_seqs"),
    ],
)
def test_out_of_range_options_are_one_clear_line(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_the_engine_gets_the_options(fake_vllm: Any, tiny_bundle: Any) -> None:
    cfg = load_config(None, [*VERL, "rollout.vllm.extra.seed=7"])
    make_rollout("vllm", tiny_bundle.model, tiny_bundle.tokenizer, engine=config_engine(cfg.rollout))
    (llm,) = fake_vllm.LLM.instances
    assert llm.kwargs["gpu_memory_utilization"] == 0.6
    assert (llm.kwargs["max_num_seqs"], llm.kwargs["max_model_len"]) == (128, 2048)
    assert (llm.kwargs["enforce_eager"], llm.kwargs["enable_prefix_caching"], llm.kwargs["seed"]) == (True, True, 7)
    assert llm.kwargs["enable_sleep_mode"] is True  # queryrl's own settings stay
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"


def test_without_options_the_engine_keeps_its_old_share(fake_vllm: Any, tiny_bundle: Any) -> None:
    make_rollout("vllm", tiny_bundle.model, tiny_bundle.tokenizer)
    (llm,) = fake_vllm.LLM.instances
    assert llm.kwargs["gpu_memory_utilization"] == 0.4
    assert "max_num_seqs" not in llm.kwargs
