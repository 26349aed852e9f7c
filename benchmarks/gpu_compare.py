"""The measuring half of ``make gpu-check`` (benchmarks/gpu_check.py runs these beside its correctness checks).

- ``decode_graph``: tokens/s of transformers' ``generate``, the hf fast path and the fast path's token step in a
  CUDA graph (``rollout.decode_graph=on``) at 8, 64 and 256 rows of a random model with Qwen2-0.5B's shape in
  bf16, and in float32 where the graph's greedy tokens first part from the fast path's (they must not).
- ``matmul_rate``: the GPU's bf16 matmul rate (8192^2 products), measured in the same run.
- ``memory_8b``: one LoRA GRPO step of a random Qwen3-8B-shaped model (peak memory), then two more timed,
  its matmul FLOPs counted from the shape (:func:`step_flops`) and the step's share of the measured rate.
- ``trl_step``: the same step in TRL's GRPOTrainer on the same GPU (same model, LoRA rank and targets,
  sequences, lengths, micro-batch, KL reference, gradient checkpointing), beside queryrl's.

``--smoke`` runs each at tiny sizes on CPU (float32): the code's own test (tests/benchmarks/).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from common import QWEN2_05B, REPO, random_batch

QWEN3_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "intermediate_size": 12288, "vocab_size": 151936,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False,
            "attention_bias": False}  # fmt: skip
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SMOKE_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 512,
               "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
# the hf rollout's settings of each decode path
PATHS: dict[str, dict[str, str]] = {
    "fast": {"fast_decode": "auto", "decode_graph": "off"},
    "graph": {"fast_decode": "auto", "decode_graph": "on"},
    "generate": {"fast_decode": "off"},
}


def device() -> Any:
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_lm(arch: str, shape: dict[str, Any], dtype: Any, on: Any, sharpen: bool = False) -> Any:
    """A causal LM of `shape`, random (seeded; `sharpen`: weights x3, norms off one, for clear greedy margins),
    built on device `on`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(arch, **shape)
    torch.manual_seed(0)
    with torch.device(on):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if sharpen:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(3.0) if p.dim() > 1 else p.add_(0.3 * torch.randn_like(p))
    return model.eval()


# --- decode paths ------------------------------------------------------------------------------------


def decode_paths(
    shape: dict[str, Any], dtype: Any, rows: int, new: int, lengths: tuple[int, int], paths: tuple[str, ...]
) -> dict[str, Any]:
    """Greedy decoding of `rows` random prompts on each of `paths` (keys of :data:`PATHS`), one timed call each
    after an untimed one on the same prompts (2 new tokens; the graph path: all of them, so that its capture
    is not timed); per row, where the first two paths' tokens first differ (`new` where they agree)."""
    from types import SimpleNamespace

    import torch

    from queryrl.rollout import HFRollout, SamplingParams

    on = device()
    model = random_lm("qwen2", shape, dtype, on, sharpen=True)
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, shape["vocab_size"], (int(n),), generator=gen).tolist()
               for n in torch.randint(*lengths, (rows,), generator=gen)]  # fmt: skip
    params = SamplingParams(n=1, do_sample=False, max_new_tokens=new)
    out: dict[str, Any] = {"dtype": str(dtype), "prompts": rows, "new_tokens": new}
    results = {}
    for path in paths:
        backend = HFRollout(model, tok, micro_batch_size=rows, device=on, **PATHS[path])
        if path != "generate" and backend.decode_path != "fast":
            raise RuntimeError(f"the fast path was not taken: {backend.fallback_reason}")
        backend.generate(prompts, params if path == "graph" else dataclasses.replace(params, max_new_tokens=2))
        sync()
        start = time.perf_counter()
        results[path] = backend.generate(prompts, params)
        sync()
        seconds = time.perf_counter() - start
        tokens = int(results[path].response_mask.sum())
        out[path] = {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}
        if path == "graph":
            out[path]["graphs_captured"] = getattr(backend._fast, "captures", None)
    a, b = results[paths[0]].response_ids.cpu(), results[paths[1]].response_ids.cpu()
    width = min(a.shape[1], b.shape[1])
    differs = a[:, :width] != b[:, :width]
    first = [int(d.nonzero()[0]) if bool(d.any()) else width for d in differs]
    out[f"first_divergence_{paths[0]}_vs_{paths[1]}"] = first
    out["rows_with_equal_greedy_tokens"] = sum(f == width for f in first) if a.shape == b.shape else 0
    for other in paths[1:]:
        out[f"speedup_{paths[0]}_over_{other}"] = round(out[paths[0]]["tokens_per_s"] / out[other]["tokens_per_s"], 2)
    return out


def check_decode_graph(smoke: bool) -> dict[str, Any]:
    """The token step in a CUDA graph against the dynamic fast path and ``generate``: in float32 (TF32 off) the
    graph's greedy tokens must equal the fast path's in every row; in bf16 (smoke: float32, eagerly on CPU) the
    tokens/s of each path at each row count, 32 new tokens after prompts of 64-127 tokens."""
    import torch

    shape = SMOKE_SHAPE if smoke else QWEN2_05B
    lengths, new = ((16, 32), 8) if smoke else ((64, 128), 32)
    exact = decode_paths(shape, torch.float32, 4 if smoke else 8, new, lengths, ("graph", "fast"))
    out: dict[str, Any] = {"model": "qwen2, tiny" if smoke else "qwen2, Qwen2-0.5B's shape", "float32": exact}
    speed_dtype = torch.float32 if smoke else torch.bfloat16
    for rows in (2, 4) if smoke else (8, 64, 256):
        out[f"rows_{rows}"] = decode_paths(shape, speed_dtype, rows, new, lengths, ("graph", "fast", "generate"))
    out["ok"] = exact["rows_with_equal_greedy_tokens"] == exact["prompts"]
    return out


# --- the GPU's matmul rate ---------------------------------------------------------------------------

_RATE: dict[bool, dict[str, Any]] = {}


def matmul_rate(smoke: bool) -> dict[str, Any]:
    """The mean rate of 10 square products (n = 8192, bf16; smoke: 512, float32 on CPU) after 3 untimed ones,
    synchronized; measured once per run (memory_8b's share of it reads the same)."""
    if smoke not in _RATE:
        import torch

        on = device()
        n, dtype, reps = (512, torch.float32, 3) if smoke else (8192, torch.bfloat16, 10)
        a, b = torch.randn(n, n, device=on, dtype=dtype), torch.randn(n, n, device=on, dtype=dtype)
        for _ in range(3):
            a @ b
        sync()
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync()
        seconds = time.perf_counter() - start
        _RATE[smoke] = {"size": n, "dtype": str(dtype), "products": reps, "seconds": round(seconds, 4),
                        "tflops": round(2 * n**3 * reps / seconds / 1e12, 3)}  # fmt: skip
    return _RATE[smoke]


def check_matmul_rate(smoke: bool) -> dict[str, Any]:
    return {**matmul_rate(smoke), "ok": True}


# --- one LoRA GRPO step at 8B: memory, time, FLOPs ------------------------------------------------------


def step_flops(shape: dict[str, Any], rank: int, n: int, p: int, t: int) -> dict[str, float]:
    """Matmul FLOPs of :func:`check_memory_8b`'s step (LoRA of `rank` on the seven projections), from the shape.

    Per token, the layers' projections hold ``W = layers (E Hq D + 2 E Hkv D + Hq D E + 3 E I)`` weights (q, k
    and v, o, gate, up and down), the adapters ``R = layers rank (sum over the seven of in + out)``; attention
    (q k^T and a v) takes ``A = layers 4 Hq D c`` for ``c = (N + 1) / 2`` keys on average over a causal
    sequence of ``N = p + t`` tokens; the lm_head ``V E`` per row it scores (queryrl feeds it the last t + 1
    positions). With ``M = n N`` tokens, ``H = n (t + 1)`` head rows, 2 FLOPs a multiply-add:

    ====================================================  =====================================
    the reference forward (adapters off, no grad)          ``2W M + A M + 2VE H``
    the update's forward (adapters on)                     ``(2W + 2R) M + A M + 2VE H``
    recompute under gradient checkpointing (the layers)    ``(2W + 2R) M + A M``
    input-gradient backward (the base is frozen)           ``2W M + 2A M + 2VE H``
    LoRA's backward (its input gradients, A's and B's)     ``4R M``
    total                                                  ``(8W + 8R + 5A) M + 6VE H``
    ====================================================  =====================================

    Norms, activations, softmax and the optimizer are not counted.
    """
    e, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    inter = shape["intermediate_size"]
    d = shape.get("head_dim") or e // shape["num_attention_heads"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    w = layers * (e * q + 2 * e * kv + q * e + 3 * e * inter)
    r = layers * rank * ((e + q) * 2 + (e + kv) * 2 + (e + inter) * 2 + (inter + e))
    big_n = p + t
    a = layers * 4 * q * (big_n + 1) / 2
    m, h = n * big_n, n * (t + 1)
    parts = {
        "reference_forward": 2 * w * m + a * m + 2 * vocab * e * h,
        "update_forward": (2 * w + 2 * r) * m + a * m + 2 * vocab * e * h,
        "checkpoint_recompute": (2 * w + 2 * r) * m + a * m,
        "input_gradient_backward": 2 * w * m + 2 * a * m + 2 * vocab * e * h,
        "lora_backward": 4 * r * m,
    }
    return {**parts, "total": sum(parts.values())}


def check_memory_8b(smoke: bool) -> dict[str, Any]:
    """The peak GPU memory of one LoRA GRPO step (rank 64 on the seven projections, reference log-probs with the
    adapters off, then the update over ``data.train_batch_size x rollout.n`` sequences in micro-batches) of a
    random model with Qwen3-8B's shape in bf16 with gradient checkpointing, at the 2-GPU preset's sizes, next to
    what ``--dry-run`` estimates for one GPU (which leaves out activations); then two more steps timed, and the
    step's matmul FLOPs (:func:`step_flops`) as a share of the rate :func:`matmul_rate` measured."""
    import math

    import torch
    from peft import LoraConfig, get_peft_model

    from queryrl.algos import LossNormalizer
    from queryrl.config import load_config
    from queryrl.engine.policy import compute_logprobs
    from queryrl.engine.update import actor_micro_step
    from queryrl.trainer.plan import ModelShape, count_lora_parameters, count_parameters, estimate_memory

    on = device()
    s = preset_sizes(smoke)
    shape, rank, n, p_len, t_len, micro = s["shape"], s["rank"], s["n"], s["p"], s["t"], s["micro"]
    base = random_lm("qwen3", shape, torch.bfloat16, on)
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    base.config.use_cache = False
    base.enable_input_require_grads()
    model = get_peft_model(
        base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=PROJECTIONS, task_type="CAUSAL_LM")
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = random_batch(n, p_len, t_len, shape["vocab_size"], s["group"], seed=0).to(on)
    cfg = load_config(None, ["actor.use_kl_loss=true", "actor.kl_loss_coef=0.001"])
    norm = LossNormalizer.from_mask(batch.response_mask)
    if on.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        weights_bytes = torch.cuda.memory_allocated()
    seconds, metrics = [], {}
    for _ in range(3):  # the first: peak memory (and the one-time costs); the other two: the step's time
        start = time.perf_counter()
        with model.disable_adapter():  # the reference: the base with the adapters off
            batch.ref_logprobs, _ = compute_logprobs(model, batch, micro, 1.0)
        batch.old_logprobs = batch.ref_logprobs.clone()
        model.train()
        for i in range(0, n, micro):
            metrics = actor_micro_step(cfg, model, batch.select(list(range(i, min(i + micro, n)))), norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        seconds.append(time.perf_counter() - start)
        if on.type == "cuda" and len(seconds) == 1:
            peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
    m = ModelShape.from_hf_config({**shape, "model_type": "qwen3"})
    params, adapters = count_parameters(m), count_lora_parameters(m, rank, PROJECTIONS)
    est = estimate_memory(params, "bfloat16", shards=1, lora_params=adapters, need_ref=True)
    flops = step_flops(shape, rank, n, p_len, t_len)
    warm = statistics.median(seconds[1:])
    rate = matmul_rate(smoke)
    out: dict[str, Any] = {
        "model": "qwen3, tiny" if smoke else "Qwen3-8B's shape, random, bf16",
        "parameters": params,
        "lora": {"rank": rank, "parameters": adapters, "targets": PROJECTIONS},
        "sequences": n,
        "prompt_tokens": p_len,
        "response_tokens": t_len,
        "micro_batch": micro,
        "gradient_checkpointing": True,
        "seconds": round(seconds[0], 2),
        "warm_steps_s": [round(x, 2) for x in seconds[1:]],
        "pg_loss": metrics.get("actor/pg_loss"),
        "matmul_flops": {k: float(f"{v:.4g}") for k, v in flops.items()},  # see step_flops
        "matmul_tflops_achieved": round(flops["total"] / warm / 1e12, 3),
        "share_of_measured_matmul_rate": round(flops["total"] / warm / 1e12 / rate["tflops"], 4),
        "measured_matmul_rate": rate,
        "dry_run_estimate_gib": round(est.total / 2**30, 2),
        "dry_run_leaves_out": "activations, the CUDA context, allocator fragmentation",
    }
    if on.type == "cuda":
        out["weights_and_adapters_gib"] = round(weights_bytes / 2**30, 2)
        out["peak_allocated_gib"] = round(peak[0] / 2**30, 2)
        out["peak_reserved_gib"] = round(peak[1] / 2**30, 2)
    out["ok"] = math.isfinite(float(metrics.get("actor/pg_loss", float("nan"))))
    return out


def preset_sizes(smoke: bool) -> dict[str, Any]:
    """The 2-GPU preset's step sizes (configs/qwen3_8b_2gpu.yaml, read as plain YAML: its app keys need the
    query-rewrite plugin) and the model shape; smoke: the tiny shape, 16 + 8 tokens, rank 4."""
    import yaml

    preset = yaml.safe_load((REPO / "configs" / "qwen3_8b_2gpu.yaml").read_text())
    group = int(preset["rollout"]["n"])
    data = preset["data"]
    return {
        "shape": dict(SMOKE_SHAPE, head_dim=16) if smoke else QWEN3_8B,
        "rank": 4 if smoke else int(preset["model"]["lora"]["rank"]),
        "group": group,
        "prompts": int(data["train_batch_size"]),
        "n": int(data["train_batch_size"]) * group,
        "p": 16 if smoke else int(data["max_prompt_length"]),
        "t": 8 if smoke else int(data["max_response_length"]),
        "micro": int(preset["actor"]["ppo_micro_batch_size"]),
    }
