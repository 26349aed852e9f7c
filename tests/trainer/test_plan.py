"""The dry-run plan: parameter counts and memory estimates checked by hand, and the plan's problems."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from queryrl.apps.query_rewrite.demo.data import sales_demo_rows
from queryrl.apps.query_rewrite.plugin import demo_fallback_problem
from queryrl.config import load_config
from queryrl.trainer.plan import (
    ModelShape,
    build_plan,
    count_lora_parameters,
    count_parameters,
    estimate_memory,
)

# Qwen3-8B's config.json (the keys that fix the size)
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": False,
    "attention_bias": False,
}
# By hand: embeddings 151936 * 4096 = 622,329,856 (and the same again for the untied LM head).
# One layer: q 4096*4096 = 16,777,216, k and v 4096*1024 = 4,194,304 each, o 16,777,216,
# gate/up/down 4096*12288 = 50,331,648 each -> 192,937,984; two RMSNorms 2*4096 and Qwen3's q/k
# norms 2*128 -> 192,946,432; x36 = 6,946,071,552; + final norm 4096 + embeddings + head.
QWEN3_8B_PARAMS = 622_329_856 + 6_946_071_552 + 4_096 + 622_329_856  # 8,190,735,360
# LoRA rank 64 on all seven projections: 64 * (8192 + 5120 + 5120 + 8192 + 3 * 16384) = 4,849,664 per layer
QWEN3_8B_LORA64 = 36 * 4_849_664  # 174,587,904
ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_qwen3_8b_parameter_count_by_hand() -> None:
    shape = ModelShape.from_hf_config(QWEN3_8B)
    assert count_parameters(shape) == QWEN3_8B_PARAMS == 8_190_735_360
    assert count_lora_parameters(shape, 64, ALL_PROJ) == QWEN3_8B_LORA64


def test_qwen3_8b_memory_estimates_by_hand() -> None:
    p = QWEN3_8B_PARAMS
    # bf16 full fine-tuning over 2 FSDP ranks, reference kept, vLLM colocated:
    # weights, grads, reference 2p/2 = 8,190,735,360 each; AdamW 2*2p/2 = 16,381,470,720; vLLM 2p unsharded
    est = estimate_memory(p, "bfloat16", shards=2, need_ref=True, vllm=True)
    assert est.parts == {
        "weights": 8_190_735_360,
        "gradients": 8_190_735_360,
        "AdamW moments": 16_381_470_720,
        "reference": 8_190_735_360,
        "vLLM weights": 16_381_470_720,
    }
    assert est.total == 57_335_147_520  # 53.4 GiB
    # fp32 full fine-tuning on one GPU: 16 bytes per parameter = 131,051,765,760 (122 GiB)
    assert estimate_memory(p, "float32").total == 131_051_765_760
    # the 2-GPU preset: bf16 base sharded (8,190,735,360) + fp32 adapters, grads, AdamW 16 B x 174,587,904 / 2
    lora = estimate_memory(p, "bfloat16", shards=2, lora_params=QWEN3_8B_LORA64, need_ref=True, vllm=True)
    assert lora.parts == {
        "weights (frozen base)": 8_190_735_360,
        "LoRA adapters + grads + AdamW (fp32)": 1_396_703_232,
        "vLLM weights": 16_381_470_720,
    }


def test_parameter_count_matches_real_qwen2_and_qwen3_models() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    small: dict[str, Any] = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3}
    pairs: tuple[tuple[Any, Any, dict[str, Any]], ...] = (
        (Qwen2Config, Qwen2ForCausalLM, {"num_key_value_heads": 2, "tie_word_embeddings": True}),
        (Qwen3Config, Qwen3ForCausalLM, {"num_key_value_heads": 2, "head_dim": 24, "tie_word_embeddings": False}),
    )
    for config_cls, model_cls, extra in pairs:
        config = config_cls(**small, num_attention_heads=4, **extra)
        model = model_cls(config)
        shape = ModelShape.from_hf_config(config.to_dict())
        assert count_parameters(shape) == sum(p.numel() for p in model.parameters()), config_cls.__name__


def test_lora_over_a_bf16_base_trains_fp32_adapters(model_cache: Path) -> None:
    """What the 2-GPU preset relies on: bf16 compute in the frozen base, fp32 trained weights."""
    from queryrl.models import load_policy

    cfg = load_config(None, [f"model.cache_dir={model_cache}", "model.dtype=bfloat16", "model.lora.rank=4"])
    bundle = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False)
    trained = {p.dtype for p in bundle.model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in bundle.model.parameters() if not p.requires_grad}
    assert (trained, frozen) == ({torch.float32}, {torch.bfloat16})


def _model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_8B))
    return folder


def _rows(path: Path, data_source: str, n: int = 3) -> Path:
    rows = sales_demo_rows("val")[:n]
    path.write_text("".join(json.dumps({**r, "data_source": data_source}, ensure_ascii=False) + "\n" for r in rows))
    return path


def test_plan_of_the_2gpu_preset_reads_config_json_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-plan-test-secret")
    data = _rows(tmp_path / "train.jsonl", "query_rewrite/car_sales", n=5)
    cfg = load_config(
        Path(__file__).resolve().parents[2] / "configs" / "qwen3_8b_2gpu.yaml",
        [
            f"model.path={_model_folder(tmp_path)}",
            f"data.train_files=[{data}]",
            "app.query_rewrite.rag.url=http://127.0.0.1:8000",
            f"trainer.output_dir={tmp_path / 'runs'}",
        ],
    )
    monkeypatch.setattr(torch.version, "cuda", "12.9")  # the GPU stack as `pip install 'queryrl[gpu]'` leaves it
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"vllm": "0.32.0", "ray": "2.60.0"}[name])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    plan = build_plan(cfg)
    text = plan.render()
    assert plan.problems == []
    assert f"gpu stack    torch {torch.__version__} (CUDA 12.9 build)\n" in text
    assert "vllm 0.32.0 (supported: >=0.32,<0.33)" in text
    engine = "gpu_memory_utilization=0.4, max_num_seqs=64, max_model_len=1280, enforce_eager=False, "
    assert f"vllm engine: {engine}enable_prefix_caching=True\n" in text  # the preset's rollout.vllm
    assert "ray: 1 node(s) x 2 worker(s)" in text
    assert "8.191 B parameters" in text
    assert "LoRA rank 64: 174.6 M trainable" in text
    assert "~24.19 GiB per actor worker" in text  # (8,190,735,360 + 1,396,703,232 + 16,381,470,720) / 2**30
    assert "excludes activations, vLLM's KV cache" in text
    assert f"{data}: exists, 5 rows" in text
    assert "http://127.0.0.1:8000/rag/chat_8b" in text
    assert "chat:    http://127.0.0.1:8000/rag/chat\n" in text
    assert "key from $OPENAI_API_KEY: set" in text
    assert "max_tokens unset (the server's), reasoning_effort unset; no prices set: its tokens are shown" in text
    assert "sk-plan-test-secret" not in text
    assert not (tmp_path / "runs").exists()


def test_plan_of_the_2gpu_preset_on_a_cpu_stack_lists_each_gap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What this machine has: a CPU torch, no vLLM (Ray is a dev dependency); and a user who set the multiprocess
    engine, and one with a vLLM outside the supported range."""
    preset = Path(__file__).resolve().parents[2] / "configs" / "qwen3_8b_2gpu.yaml"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-plan-test")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    overrides = [
        f"model.path={_model_folder(tmp_path)}",
        f"data.train_files=[{_rows(tmp_path / 'train.jsonl', 'query_rewrite/car_sales')}]",
        "app.query_rewrite.rag.url=http://127.0.0.1:8000",
    ]
    monkeypatch.setattr(torch.version, "cuda", None)
    real_version = importlib.metadata.version

    def no_vllm(name: str) -> str:
        if name == "vllm":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", no_vllm)
    problems = build_plan(load_config(preset, overrides)).problems
    assert problems[0].startswith(f"torch {torch.__version__} is a CPU build and this run asks for GPUs")
    assert "rollout.backend=vllm needs vLLM: pip install 'queryrl[gpu]' (or 'queryrl[vllm]')" in problems
    assert any(p.startswith("VLLM_ENABLE_V1_MULTIPROCESSING=1 runs vLLM's engine in another process") for p in problems)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.31.2" if name == "vllm" else real_version(name))
    problems = build_plan(load_config(preset, overrides)).problems
    assert "vLLM 0.31.2 is installed; queryrl's vllm backend supports vLLM <0.33,>=0.32" in problems[1]
    toy = Path(__file__).resolve().parents[2] / "configs" / "toy_grpo.yaml"
    assert "gpu stack" not in build_plan(load_config(toy, [])).render()  # a CPU run is not asked about GPUs


def test_plan_shards_cpu_workers_only_with_fsdp_on_cpu() -> None:
    ray_cpu = ["trainer.backend=ray", "trainer.n_gpus_per_node=2", "ray.use_gpu=false"]
    toy = Path(__file__).resolve().parents[2] / "configs" / "toy_grpo.yaml"
    replicas = build_plan(load_config(toy, ray_cpu)).render()
    sharded = build_plan(load_config(toy, [*ray_cpu, "ray.fsdp_on_cpu=true"])).render()
    assert "on CPU workers: False" in replicas
    assert "FSDP ranks" not in replicas
    assert "on CPU workers: True" in sharded
    assert "sharded over 2 FSDP ranks" in sharded


def test_plan_problems_name_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cfg = load_config(
        None,
        [
            "trainer.backend=ray",
            "model.path=/nowhere/Qwen3-8B",
            "data.train_files=[/nowhere/train.parquet]",
            "app.query_rewrite.enable=true",
            "app.query_rewrite.judge.backend=openai",
            "app.query_rewrite.judge.base_url=http://127.0.0.1:1/v1",
        ],
    )
    problems = "\n".join(build_plan(cfg).problems)
    assert "model.path='/nowhere/Qwen3-8B' is not a local Hugging Face model folder" in problems
    assert "/nowhere/train.parquet does not exist" in problems
    assert "OPENAI_API_KEY is not set" in problems


def test_user_data_with_the_demo_rag_and_judge_is_a_problem(tmp_path: Path) -> None:
    own = _rows(tmp_path / "cars.jsonl", "query_rewrite/car_sales")
    demo_file = _rows(tmp_path / "demo.jsonl", "query_rewrite/sales_demo")
    base = ["app.query_rewrite.enable=true"]

    def problem(*extra: str) -> str | None:
        return demo_fallback_problem(load_config(None, [*base, *extra]))

    message = problem(f"data.train_files=[{own}]")
    assert message is not None
    for setting in ("app.query_rewrite.rag.url=", "rag.corpus=FILE", "judge.backend=openai", "gpt5_model"):
        assert setting in message
    assert problem("data.train_files=[/not/here.parquet]") is not None  # not readable here: the user's
    assert problem("data.train_files=[builtin://sales_demo/train]") is None
    assert problem(f"data.train_files=[{demo_file}]") is None  # the demo's rows written to a file
    assert problem(f"data.train_files=[{own}]", "app.query_rewrite.rag.url=http://127.0.0.1:1") is None
    assert problem(f"data.train_files=[{own}]", f"app.query_rewrite.rag.corpus={own}") is None
    assert demo_fallback_problem(load_config(None, [f"data.train_files=[{own}]"])) is None  # app off


def test_the_plan_of_a_policy_reference_builds_no_model(tmp_path: Path) -> None:
    cfg = load_config(
        Path(__file__).resolve().parents[2] / "configs" / "query_rewrite_demo.yaml",
        [f"model.cache_dir={tmp_path / 'cache'}", "app.query_rewrite.rag.reference_rewriter=policy"],
    )
    text = build_plan(cfg).render()
    assert "query_rewrite app, reward_mode" in text
    assert "manager async" in text
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("tiny-qwen2-*"))
