"""``make gpu-check``'s ``trl_step``: the 8B-shaped LoRA GRPO step in TRL's GRPOTrainer beside queryrl's, on one GPU.

Equal work: one random model with Qwen3-8B's shape in bf16 (smoke: tiny, float32 on CPU), LoRA of the 2-GPU
preset's rank (alpha twice it) on the seven projections, the preset's 8 prompts x 5 samples of 1,024 prompt and
256 response tokens, micro-batches of 4 (TRL: ``per_device_train_batch_size=4``,
``gradient_accumulation_steps=10``, one generation per optimizer step), a KL term against the base with the
adapters off (beta 0.001 in both), gradient checkpointing (non-reentrant), AdamW. Sampling at temperature 1
from random weights rarely meets EOS (p about 1/151,936 a token), so the responses run to the limit in both; the
mean lengths are recorded. TRL's settings beyond these are benchmarks/trl_vs_queryrl.py's (``loss_type=dapo``,
clip 0.2, ``scale_rewards=group``, the toy reward): they change no matmul.

TRL runs 1 step untimed and up to 2 timed (fewer when the run's time limit is near); its step is timed
whole and its generation (``_generate``) apart, the rest being its update. queryrl's update is
``memory_8b``'s timed steps (the same step on the same sizes, run just before; here again only when that
check did not run), its generation one call of the hf rollout with its defaults (the fast path) on the
model TRL trained, after an untimed 2-token call. Ratios are queryrl's time over TRL's: below 1, queryrl is faster.
"""

from __future__ import annotations

import gc
import importlib.util
import statistics
import tempfile
import time
from typing import Any

from common import TOY_CONFIG, version_of
from gpu_compare import PROJECTIONS, check_memory_8b, device, preset_sizes, random_lm, sync

SKIPPED = "trl not installed: run make gpu-wheels (TRL and datasets as wheels in .whl/) and make gpu-check again"
TIMED_STEPS = 2


def prompt_texts(tokenizer: Any, count: int, tokens: int) -> list[str]:
    """`count` distinct plain-text prompts of exactly `tokens` tokens each (a prompt's own word, then "hello"s)."""
    texts = []
    for i in range(count):
        words = tokens - 1
        for _ in range(8):  # the tokenizer may merge across words: step to the exact length
            text = " ".join([f"request{i}"] + ["hello"] * words)
            have = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            if have == tokens:
                break
            words += tokens - have
        else:
            raise RuntimeError(f"no prompt of exactly {tokens} tokens (last {have})")
        texts.append(text)
    return texts


def trl_run(model: Any, tokenizer: Any, texts: list[str], s: dict[str, Any], budget_s: float) -> tuple[Any, dict]:
    """TRL's GRPOTrainer on `model`: 1 + up to :data:`TIMED_STEPS` steps, stopping after a step when the next
    would not end within `budget_s`. Returns the trainer and its timings."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOTrainer
    from trl_vs_queryrl import reward_for_trl, trl_config
    from trl_vs_queryrl_real import Clock, wrap

    cuda = torch.cuda.is_available()
    start, clock = time.perf_counter(), Clock()

    class Steps(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            sync()
            clock.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            sync()
            clock.end()
            if time.perf_counter() - start + clock.steps[-1]["wall_s"] > budget_s:
                control.should_training_stop = True

    dataset = Dataset.from_list([{"prompt": text, "ground_truth": "hello"} for text in texts])
    settings = {"seed": 0, "batch": s["prompts"], "n": s["group"], "response_length": s["t"], "lr": 1e-5}
    with tempfile.TemporaryDirectory(prefix="queryrl-gpu-check-trl-") as tmp:
        args = trl_config(
            settings | {"steps": 1 + TIMED_STEPS},
            tmp,
            use_cpu=not cuda,
            bf16=cuda,
            per_device_train_batch_size=s["micro"],
            gradient_accumulation_steps=s["n"] // s["micro"],
            gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False},
            beta=0.001,
            model_init_kwargs=None,
        )
        lora = LoraConfig(r=s["rank"], lora_alpha=2 * s["rank"], lora_dropout=0.0, target_modules=PROJECTIONS)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_for_trl,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
        )
        trainer.add_callback(Steps())
        wrap(trainer, "_generate", clock, "generation")
        trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    steps = [{"step_s": round(x["wall_s"], 2), "generation_s": round(x["phases_wall_s"].get("generation", 0.0), 2)}
             for x in clock.steps]  # fmt: skip
    kl = any("kl" in h for h in trainer.state.log_history)  # TRL logs it where it computed the reference
    return trainer, {"steps": steps, "mean_response_length": lengths, "kl_logged": kl}


def queryrl_generation(model: Any, tokenizer: Any, texts: list[str], s: dict[str, Any]) -> dict[str, Any]:
    """One timed call of the hf rollout (its defaults: the fast path, no CUDA graph) for the same prompts."""
    from queryrl.rollout import HFRollout, SamplingParams

    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    backend = HFRollout(model, tokenizer, micro_batch_size=s["n"], device=device())
    params = SamplingParams(n=s["group"], temperature=1.0, max_new_tokens=s["t"])
    backend.generate(prompts, SamplingParams(n=s["group"], temperature=1.0, max_new_tokens=2))
    sync()
    start = time.perf_counter()
    out = backend.generate(prompts, params)
    sync()
    return {
        "seconds": round(time.perf_counter() - start, 2),
        "decode_path": backend.decode_path,
        "fallback_reason": backend.fallback_reason,
        "mean_response_length": round(float(out.response_mask.sum(-1).float().mean()), 1),
    }


def check_trl_step(smoke: bool, memory_8b: dict[str, Any] | None, budget_s: float) -> dict[str, Any]:
    """TRL's step and queryrl's on the same work (see the module docstring); ``ok`` when both ran a timed step."""
    if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
        return {"ok": False, "skipped": SKIPPED}
    import torch
    from transformers import AutoTokenizer

    from queryrl.config import load_config
    from queryrl.models.tiny import build_tiny_model

    begin = time.perf_counter()
    s = preset_sizes(smoke)
    cfg = load_config(TOY_CONFIG, [])
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(cfg.model.tiny, cfg.model.cache_dir))
    texts = prompt_texts(tokenizer, s["prompts"], s["p"])
    if memory_8b is None or not memory_8b.get("ok"):  # queryrl's update: the same step, run here
        memory_8b = check_memory_8b(smoke)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model = random_lm("qwen3", s["shape"], dtype, device())
    # a minute of the budget kept for queryrl's generation after TRL's steps
    trainer, trl = trl_run(model, tokenizer, texts, s, budget_s - 60.0 - (time.perf_counter() - begin))
    generation = queryrl_generation(trainer.accelerator.unwrap_model(trainer.model), tokenizer, texts, s)
    del trainer, model
    gc.collect()
    timed = trl["steps"][1:]
    out: dict[str, Any] = {
        "model": "qwen3, tiny" if smoke else "Qwen3-8B's shape, random, bf16",
        "sizes": {k: v for k, v in s.items() if k != "shape"},
        "trl": trl,
        "queryrl": {"update_steps_s": memory_8b.get("warm_steps_s"), "generation": generation},
        "versions": {p: version_of(p) for p in ("trl", "datasets", "transformers", "peft", "accelerate", "torch")},
        "ok": bool(timed) and bool(memory_8b.get("warm_steps_s")),
    }
    if not out["ok"]:
        out["error"] = "no timed TRL step within the time limit" if not timed else "no timed queryrl step"
        return out
    trl_step = statistics.median(x["step_s"] for x in timed)
    trl_generation = statistics.median(x["generation_s"] for x in timed)
    q_update = statistics.median(memory_8b["warm_steps_s"])
    q_step = q_update + generation["seconds"]
    out["step_s"] = {"trl": round(trl_step, 2), "queryrl": round(q_step, 2)}
    out["update_s"] = {"trl": round(trl_step - trl_generation, 2), "queryrl": round(q_update, 2)}
    out["generation_s"] = {"trl": round(trl_generation, 2), "queryrl": generation["seconds"]}
    out["queryrl_over_trl"] = {
        k: round(out[f"{k}_s"]["queryrl"] / out[f"{k}_s"]["trl"], 3) if out[f"{k}_s"]["trl"] > 0 else None
        for k in ("step", "update", "generation")
    }
    return out
