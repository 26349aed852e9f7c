"""`make gpu-check`: the checks a lent GPU machine runs first, in one command, with nothing downloaded.

    python benchmarks/gpu_check.py            # on a CUDA machine: benchmarks/results/gpu_check.json
    python benchmarks/gpu_check.py --smoke    # the same code on CPU (gloo), tiny sizes (tests/benchmarks/)

The lent machines have their own Python with torch, transformers and peft, reach no package
registry, and have neither Ray nor vLLM (too large to carry). So this script uses queryrl from
this checkout (``sys.path``; torch is the machine's own) and drives the FSDP2 path through
torch.distributed directly: the real :class:`~queryrl.distributed.worker.PolicyWorker`, joined into
a one-rank NCCL group, where a Ray actor would be. Five checks, each recorded even when another fails:

1. ``decode``: the hf rollout's fast decode path against transformers' ``generate`` on a random
   model with Qwen2-0.5B's shape (greedy, the same prompts): in float32 every row's greedy tokens must
   be equal; in bf16, tokens/s of each and where each row's tokens first differ.
2. ``sync``: the weight-sync checks of tests/distributed/fsdp_ranks.py on the GPU: LoRA in bf16 mixed
   precision and LoRA over a bf16 base, handing the weights to the vLLM stand-in (tests/rollout/
   fake_vllm, which loads them as vLLM's default loader does), and LoRA with the hf fast decode
   engine; at start-up, after an FSDP optimizer step and after a checkpoint load: the engine's
   weights against the merged model, the trainer's shards untouched, the greedy tokens.
3. ``grpo``: a few GRPO steps of the toy preset (the tiny model learning to say "hello"; KL loss on)
   with LoRA and bf16 mixed precision, the policy sharded by FSDP2 over NCCL in the worker, which
   also generates: pg_loss and kl_loss finite at every step, rollout/trainer log-prob agreement,
   and the worker's merged weights equal to those of the checkpointed adapters.
4. ``local``: the toy presets on the single-process trainer with ``trainer.device`` the GPU: GRPO
   with a KL loss and PPO with a critic, evaluated and checkpointed every other step, then resumed.
5. ``memory_8b``: the peak GPU memory of one LoRA GRPO step (rank 64 on the seven projections,
   reference log-probs with the adapters off, then the update over ``data.train_batch_size x
   rollout.n`` sequences in micro-batches) of a random model with Qwen3-8B's shape in bf16 with
   gradient checkpointing, at the 2-GPU preset's sizes, next to what ``--dry-run`` estimates for one
   GPU (which leaves out activations).

Exit status 1 when any check failed; every check's numbers are in the JSON either way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, TOY_CONFIG, machine, write_json

FAKE_VLLM = REPO / "tests" / "rollout" / "fake_vllm"
QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864, "vocab_size": 151936,
             "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True}  # fmt: skip
QWEN3_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "intermediate_size": 12288, "vocab_size": 151936,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False,
            "attention_bias": False}  # fmt: skip
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SMOKE_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 512,
               "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _device() -> Any:
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _random_lm(arch: str, shape: dict[str, Any], dtype: Any, device: Any, sharpen: bool = False) -> Any:
    """A causal LM of `shape`, random (seeded; `sharpen`: weights x3, norms off one, for clear greedy margins),
    built on `device`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(arch, **shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if sharpen:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(3.0) if p.dim() > 1 else p.add_(0.3 * torch.randn_like(p))
    return model.eval()


# --- 1. fast decode against generate ----------------------------------------------------------------


def _decode_paths(shape: dict[str, Any], dtype: Any, rows: int, new: int, lengths: tuple[int, int]) -> dict[str, Any]:
    """Greedy decoding of `rows` random prompts with the fast path and with ``generate``: the timings and, per
    row, the first position where the two differ (`new` where they agree throughout)."""
    from types import SimpleNamespace

    import torch

    from queryrl.rollout import HFRollout, SamplingParams

    device = _device()
    model = _random_lm("qwen2", shape, dtype, device, sharpen=True)
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, shape["vocab_size"], (int(n),), generator=gen).tolist()
               for n in torch.randint(*lengths, (rows,), generator=gen)]  # fmt: skip
    params = SamplingParams(n=1, do_sample=False, max_new_tokens=new)
    out: dict[str, Any] = {"dtype": str(dtype), "prompts": rows, "new_tokens": new}
    results = {}
    for path in ("fast", "generate"):
        backend = HFRollout(
            model, tok, micro_batch_size=rows, device=device, fast_decode="auto" if path == "fast" else "off"
        )
        if path == "fast" and backend.decode_path != "fast":
            raise RuntimeError(f"the fast path was not taken: {backend.fallback_reason}")
        backend.generate(prompts[:2], params)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        results[path] = backend.generate(prompts, params)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        tokens = int(results[path].response_mask.sum())
        out[path] = {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}
    fast, slow = results["fast"].response_ids.cpu(), results["generate"].response_ids.cpu()
    width = min(fast.shape[1], slow.shape[1])
    differs = fast[:, :width] != slow[:, :width]
    first = [int(d.nonzero()[0]) if bool(d.any()) else width for d in differs]
    out["first_divergence"] = first
    out["rows_with_equal_greedy_tokens"] = sum(f == width for f in first) if fast.shape == slow.shape else 0
    out["speedup"] = round(out["fast"]["tokens_per_s"] / out["generate"]["tokens_per_s"], 2)
    return out


def check_decode(smoke: bool) -> dict[str, Any]:
    """In float32 the two paths must agree token for token (TF32 off); in bf16 (the speed run) they
    round differently (another kernel order), so a row may part after a near-tie: the first divergence
    of each row is recorded, not required to be absent."""
    import torch

    shape = SMOKE_SHAPE if smoke else QWEN2_05B
    exact = _decode_paths(shape, torch.float32, 4 if smoke else 8, 8 if smoke else 32, (16, 32) if smoke else (64, 256))
    out: dict[str, Any] = {"model": "qwen2, Qwen2-0.5B's shape" if not smoke else "qwen2, tiny", "float32": exact}
    if not smoke:
        out["bfloat16"] = _decode_paths(shape, torch.bfloat16, 32, 128, (64, 256))
    out["ok"] = exact["rows_with_equal_greedy_tokens"] == exact["prompts"]
    return out


# --- 2. the weight sync under FSDP2 ------------------------------------------------------------------

SYNC_VARIANTS = {
    "lora_mixed_bf16 -> vllm stand-in": ("vllm", ["model.dtype=float32", "model.compute_dtype=bfloat16"]),
    "lora_over_bf16_base -> vllm stand-in": ("vllm", ["model.dtype=bfloat16"]),
    "lora_fp32 -> hf fast decode": ("hf", ["model.dtype=float32", "rollout.fast_decode=auto"]),
}
LORA = ["model.lora.rank=8", "model.lora.alpha=16", "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,up_proj]"]


def _toy_cfg(out: Path, cache: Path, *overrides: str) -> Any:
    from queryrl.config import load_config

    return load_config(
        TOY_CONFIG,
        [f"trainer.output_dir={out}", f"model.cache_dir={cache}", "trainer.logger=[jsonl]", "trainer.plot=false",
         "trainer.eval_every=0", "data.val_files=[]", "trainer.resume=disable", "trainer.save_samples=0",
         "ray.fsdp=true", "ray.fsdp_on_cpu=true", *overrides],
    )  # fmt: skip


def check_sync(work: Path, smoke: bool) -> dict[str, Any]:
    import torch.multiprocessing as mp
    from omegaconf import OmegaConf

    from tests.distributed.fsdp_ranks import rank_main

    variants = list(SYNC_VARIANTS.items())[: 1 if smoke else None]  # smoke: the rest run in make test
    runs = []
    for i, (_, (backend, extra)) in enumerate(variants):
        cfg = _toy_cfg(work / "sync", work / "cache", *LORA, f"rollout.backend={backend}", *extra)
        runs.append((_free_port(), OmegaConf.to_container(cfg, resolve=True), str(work / f"sync-{i}.json")))
    mp.spawn(rank_main, args=(1, runs, str(FAKE_VLLM)), nprocs=1, join=True)
    out: dict[str, Any] = {"ok": True}
    for (name, (backend, _)), (_, _, result) in zip(variants, runs, strict=True):
        checks = json.loads(Path(result).read_text())["checks"]
        tolerance = 2**-7 if backend == "vllm" else 0.0  # one bf16 rounding of the merged weight
        ok = all(not c["changed_by_sync"] and c.get("engine_diff", 0.0) <= tolerance for c in checks)
        out[name] = {"checks": checks, "ok": ok}
        out["ok"] = out["ok"] and ok
    return out


# --- 3. GRPO steps with the policy sharded in a one-rank group --------------------------------------


class OneRankFSDP:
    """The trainer's Workers protocol over one :class:`~.worker.PolicyWorker` in this process (what a Ray actor holds),
    its policy sharded by FSDP2 over a one-rank group (NCCL on a GPU); the worker generates too."""

    def __init__(self, cfg: Any, c: Any) -> None:
        from omegaconf import OmegaConf

        from queryrl.distributed.worker import PolicyWorker, trainable_state

        self.worker = PolicyWorker(OmegaConf.to_container(cfg, resolve=True), 0, 1, roles=("actor", "ref"))
        self.worker.set_state("actor", {"weights": trainable_state(c.policy.model)})  # the driver's start
        self.info = self.worker.init_process_group("127.0.0.1", _free_port())
        c.rollout = self  # the worker generates, as with ray.rollout=workers

    def generate(self, prompts: list[list[int]], params: Any) -> Any:
        import torch

        return self.worker.generate(prompts, params, int(torch.randint(0, 2**31 - 1, ()).item()))

    def generate_chunks(self, prompts: list[list[int]], params: Any) -> Any:
        yield self.generate(prompts, params)

    def update_weights(self, source: Any) -> None:
        self.worker.sync_rollout()

    def submit(self, what: str, batch: Any) -> Callable[[], Any]:
        device = batch.response_mask.device
        return lambda: self.worker.compute(what, batch.to("cpu")).to(device)

    def optimizer_step(self, role: str, mini: Any, norm: Any, lr: float) -> tuple[dict[str, float], dict[str, float]]:
        return self.worker.optimizer_step(role, mini.to("cpu"), norm, lr)

    def sync_policy(self, model: Any) -> None:
        """Nothing here: the loop then calls :meth:`update_weights`, as RayRollout's (the worker generates)."""

    def pull_state(self, c: Any) -> None:
        from queryrl.distributed.worker import load_trainable_state

        state = self.worker.get_state("actor", with_optimizer=True)
        load_trainable_state(c.policy.model, state["weights"])
        c.optimizer.load_state_dict(state["optimizer"])

    def push_state(self, c: Any) -> None:
        from queryrl.distributed.worker import trainable_state

        self.worker.set_state(
            "actor", {"weights": trainable_state(c.policy.model), "optimizer": c.optimizer.state_dict()}
        )

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def check_grpo(work: Path, steps: int) -> dict[str, Any]:
    import torch

    from queryrl.distributed.worker import load_trainable_state, trainable_state
    from queryrl.models import load_policy
    from queryrl.rollout.sync import rollout_weights
    from queryrl.trainer.loop import Trainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = _toy_cfg(work / "grpo", work / "cache", *LORA, "model.dtype=float32", "model.compute_dtype=bfloat16",
                   f"trainer.device={device}", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.05",
                   f"trainer.total_steps={steps}", f"trainer.save_every={steps}", "actor.ppo_mini_batch_size=8",
                   "rollout.fast_decode=auto")  # fmt: skip
    with Trainer(cfg) as trainer:
        c = trainer.c
        workers = OneRankFSDP(cfg, c)
        c.workers = workers
        trainer.fit()
        merged = {k: v.float().cpu() for k, v in rollout_weights(workers.worker.policy.model, torch.float32)}
        # the checkpointed adapters over the float32 base (the local policy stores its frozen base in bf16)
        mirror = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False).model
        load_trainable_state(mirror, trainable_state(c.policy.model))
        reference = {k: v.float().cpu() for k, v in rollout_weights(mirror, torch.float32)}
        workers.close()
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    keep = ("step", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean",
            "training/rollout_probs_diff_max", "timing_s/step")  # fmt: skip
    table = [{k: r.get(k) for k in keep} for r in rows]
    finite = all(math.isfinite(r["actor/pg_loss"]) and math.isfinite(r["actor/kl_loss"]) for r in rows)
    diff = max((merged[k] - reference[k]).abs().max().item() for k in reference)
    return {
        "worker": workers.info,
        "steps": table,
        "losses_finite": finite,
        "merged_weights_vs_checkpoint_max_diff": diff,
        "ok": finite and len(rows) == steps and diff < 1e-6,
    }


# --- 4. the single-process trainer on the device: GRPO and PPO, evaluation, a checkpoint and a resume ----------


def check_local(work: Path, steps: int) -> dict[str, Any]:
    """The toy presets on the local backend with ``trainer.device`` the GPU (no FSDP, no worker): GRPO with a
    KL loss against the reference, and PPO with its critic; each evaluated and checkpointed every other
    step, then resumed from its last checkpoint for two more steps."""
    import torch

    from queryrl.config import load_config
    from queryrl.trainer.loop import Trainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    out: dict[str, Any] = {"ok": True}
    presets = {"grpo": ("toy_grpo.yaml", ["actor.use_kl_loss=true", "actor.kl_loss_coef=0.05"]),
               "ppo": ("toy_ppo.yaml", ["critic.warmup_steps=1"])}  # fmt: skip
    for name, (preset, extra) in presets.items():
        run_dir = work / f"local-{name}"
        rows: list[dict[str, Any]] = []
        for total in (steps, steps + 2):  # the second run resumes from the first's last checkpoint
            cfg = load_config(
                REPO / "configs" / preset,
                [f"trainer.output_dir={run_dir}", f"model.cache_dir={work / 'cache'}", "trainer.logger=[jsonl]",
                 "trainer.plot=false", "trainer.eval_every=2", "trainer.save_every=2", "trainer.save_samples=0",
                 f"trainer.device={device}", f"trainer.total_steps={total}", "rollout.fast_decode=auto", *extra],
            )  # fmt: skip
            with Trainer(cfg) as trainer:
                trainer.fit()
            rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
        losses = ("actor/pg_loss", "critic/vf_loss")  # PPO's first step trains the critic alone (its warm-up)
        trained = [r for r in rows if any(k in r for k in losses)]
        evaluated = [r["step"] for r in rows if any(k.startswith("val/") for k in r)]
        finite = all(math.isfinite(r[k]) for r in trained for k in losses if k in r)
        steps_seen = sorted({int(r["step"]) for r in trained})
        ok = finite and steps_seen == list(range(1, steps + 3)) and bool(evaluated)
        out[name] = {"steps": steps_seen, "evaluated_at": evaluated, "losses_finite": finite, "ok": ok,
                     "last": {k: v for k, v in trained[-1].items() if k.startswith(("actor/", "critic/"))}}  # fmt: skip
        out["ok"] = out["ok"] and ok
    return out


# --- 5. peak memory of a LoRA GRPO step at 8B ---------------------------------------------------------


def check_memory_8b(smoke: bool) -> dict[str, Any]:
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model

    from queryrl.algos import LossNormalizer
    from queryrl.config import load_config
    from queryrl.engine.batch import Batch
    from queryrl.engine.policy import compute_logprobs
    from queryrl.engine.update import actor_micro_step
    from queryrl.trainer.plan import ModelShape, count_lora_parameters, count_parameters, estimate_memory

    device = _device()
    # the 2-GPU preset's sizes, read as plain YAML (its app keys need the query-rewrite plugin, not installed here)
    preset = yaml.safe_load((REPO / "configs" / "qwen3_8b_2gpu.yaml").read_text())
    shape = dict(SMOKE_SHAPE, head_dim=16) if smoke else QWEN3_8B
    rank = 4 if smoke else int(preset["model"]["lora"]["rank"])
    group = int(preset["rollout"]["n"])
    n = int(preset["data"]["train_batch_size"]) * group
    data = preset["data"]
    p_len, t_len = (16, 8) if smoke else (int(data["max_prompt_length"]), int(data["max_response_length"]))
    micro = int(preset["actor"]["ppo_micro_batch_size"])
    base = _random_lm("qwen3", shape, torch.bfloat16, device)
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    base.config.use_cache = False
    base.enable_input_require_grads()
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=PROJECTIONS, task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    adapters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(adapters, lr=1e-5)
    gen = torch.Generator().manual_seed(0)
    vocab = shape["vocab_size"]
    batch = Batch(
        prompt_ids=torch.randint(0, vocab, (n, p_len), generator=gen),
        prompt_mask=torch.ones(n, p_len, dtype=torch.long),
        response_ids=torch.randint(0, vocab, (n, t_len), generator=gen),
        response_attention_mask=torch.ones(n, t_len, dtype=torch.long),
        response_mask=torch.ones(n, t_len),
        group_ids=torch.arange(n) // group,
        advantages=torch.randn(n, t_len, generator=gen),
    ).to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        weights_bytes = torch.cuda.memory_allocated()
    start = time.perf_counter()
    with model.disable_adapter():  # the reference: the base with the adapters off
        batch.ref_logprobs, _ = compute_logprobs(model, batch, micro, 1.0)
    batch.old_logprobs = batch.ref_logprobs.clone()
    cfg = load_config(None, ["actor.use_kl_loss=true", "actor.kl_loss_coef=0.001"])
    norm = LossNormalizer.from_mask(batch.response_mask)
    model.train()
    metrics: dict[str, float] = {}
    for i in range(0, n, micro):
        metrics = actor_micro_step(cfg, model, batch.select(list(range(i, min(i + micro, n)))), norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    m = ModelShape.from_hf_config({**shape, "model_type": "qwen3"})
    p = count_parameters(m)
    a = count_lora_parameters(m, rank, PROJECTIONS)
    est = estimate_memory(p, "bfloat16", shards=1, lora_params=a, need_ref=True)
    out: dict[str, Any] = {
        "model": "Qwen3-8B's shape, random, bf16" if not smoke else "qwen3, tiny",
        "parameters": p,
        "lora": {"rank": rank, "parameters": a, "targets": PROJECTIONS},
        "sequences": n,
        "prompt_tokens": p_len,
        "response_tokens": t_len,
        "micro_batch": micro,
        "gradient_checkpointing": True,
        "seconds": round(seconds, 2),
        "pg_loss": metrics.get("actor/pg_loss"),
        "dry_run_estimate_gib": round(est.total / 2**30, 2),
        "dry_run_leaves_out": "activations, the CUDA context, allocator fragmentation",
    }
    if device.type == "cuda":
        out["weights_and_adapters_gib"] = round(weights_bytes / 2**30, 2)
        out["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    out["ok"] = math.isfinite(float(metrics.get("actor/pg_loss", float("nan"))))
    return out


# --- the run ----------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (gloo): the script's own test")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of the toy preset")
    parser.add_argument("--only", default="decode,sync,grpo,local,memory_8b", help="comma-separated checks to run")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_check.json")
    args = parser.parse_args()
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu-check needs a CUDA GPU (none is visible); --smoke runs it on CPU", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.backends.cuda.matmul.allow_tf32 = False  # the sync checks compare float32 weights to 1e-6
    report: dict[str, Any] = {"machine": machine(), "torch": torch.__version__, "smoke": args.smoke}
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name(0)
    checks: dict[str, Callable[[Path], dict[str, Any]]] = {
        "decode": lambda work: check_decode(args.smoke),
        "sync": lambda work: check_sync(work, args.smoke),
        "grpo": lambda work: check_grpo(work, args.steps),
        "local": lambda work: check_local(work, 2 if args.smoke else args.steps),
        "memory_8b": lambda work: check_memory_8b(args.smoke),
    }
    with tempfile.TemporaryDirectory(prefix="queryrl-gpu-check-") as tmp:
        for name in args.only.split(","):
            start = time.perf_counter()
            try:
                report[name] = checks[name](Path(tmp))
            except Exception as e:  # recorded: the other checks still run
                report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            report[name]["wall_s"] = round(time.perf_counter() - start, 1)
            print(f"{name}: {'ok' if report[name]['ok'] else 'FAILED'} ({report[name]['wall_s']} s)", flush=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    report["ok"] = all(report[name]["ok"] for name in args.only.split(","))
    write_json(args.out, report)
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1, default=str)[:6000])
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
