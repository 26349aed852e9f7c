"""`make gpu-check`: the checks a lent GPU machine runs first, in one command, with nothing downloaded.

    python benchmarks/gpu_check.py            # on a CUDA machine: benchmarks/results/gpu_check.json
    python benchmarks/gpu_check.py --smoke    # the same code on CPU (gloo), tiny sizes (tests/benchmarks/)

The lent machines have their own Python with torch, transformers and peft, reach no package
registry, and have neither Ray nor vLLM (too large to carry). So this script uses queryrl from
this checkout (``sys.path``; torch is the machine's own) and drives the FSDP2 path through
torch.distributed directly: the real :class:`~queryrl.distributed.worker.PolicyWorker`, joined into
a one-rank NCCL group, where a Ray actor would be. Eight checks, each recorded even when another fails
(the JSON is written after each, so a run stopped by its time limit keeps what it measured):

1. ``decode``: the hf rollout's fast decode path against transformers' ``generate`` on a random
   model with Qwen2-0.5B's shape (greedy, the same prompts): in float32 every row's greedy tokens must
   be equal; in bf16, tokens/s of each and where each row's tokens first differ.
2. ``decode_graph``: the fast path's token step in a CUDA graph (``rollout.decode_graph=on``) against
   the dynamic fast path and ``generate``: tokens/s at 8, 64 and 256 rows in bf16, and in float32 the
   graph's greedy tokens equal to the fast path's (benchmarks/gpu_compare.py).
3. ``sync``: the weight-sync checks of tests/distributed/fsdp_ranks.py on the GPU: LoRA in bf16 mixed
   precision and LoRA over a bf16 base, handing the weights to the vLLM stand-in (tests/rollout/
   fake_vllm, which loads them as vLLM's default loader does), and LoRA with the hf fast decode
   engine; at start-up, after an FSDP optimizer step and after a checkpoint load: the engine's
   weights against the merged model, the trainer's shards untouched, the greedy tokens.
4. ``grpo``: a few GRPO steps of the toy preset (the tiny model learning to say "hello"; KL loss on)
   with LoRA and bf16 mixed precision, the policy sharded by FSDP2 over NCCL in the worker, which
   also generates: pg_loss and kl_loss finite at every step, rollout/trainer log-prob agreement,
   and the worker's merged weights equal to those of the checkpointed adapters.
5. ``local``: the toy presets on the single-process trainer with ``trainer.device`` the GPU: GRPO
   with a KL loss and PPO with a critic, evaluated and checkpointed every other step, then resumed.
6. ``matmul_rate``: the GPU's bf16 matmul rate, measured in this run (gpu_compare.py).
7. ``memory_8b``: the peak GPU memory of one LoRA GRPO step of a random Qwen3-8B-shaped model at the
   2-GPU preset's sizes, next to what ``--dry-run`` estimates; two more steps timed, the step's matmul
   FLOPs and their share of the measured rate (gpu_compare.py).
8. ``trl_step``: the same step in TRL's GRPOTrainer on the same GPU, beside queryrl's: step times and
   ratios (benchmarks/gpu_trl.py; TRL and datasets come as wheels from ``make gpu-wheels``).

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
from gpu_compare import QWEN2_05B, SMOKE_SHAPE, check_decode_graph, check_matmul_rate, check_memory_8b, decode_paths
from gpu_trl import check_trl_step

FAKE_VLLM = REPO / "tests" / "rollout" / "fake_vllm"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- 1. fast decode against generate ----------------------------------------------------------------


FAST = ("fast", "generate")


def check_decode(smoke: bool) -> dict[str, Any]:
    """In float32 the two paths must agree token for token (TF32 off); in bf16 (the speed run) they
    round differently (another kernel order), so a row may part after a near-tie: the first divergence
    of each row is recorded, not required to be absent."""
    import torch

    shape = SMOKE_SHAPE if smoke else QWEN2_05B
    exact = decode_paths(
        shape, torch.float32, 4 if smoke else 8, 8 if smoke else 32, (16, 32) if smoke else (64, 256), FAST
    )
    out: dict[str, Any] = {"model": "qwen2, Qwen2-0.5B's shape" if not smoke else "qwen2, tiny", "float32": exact}
    if not smoke:
        out["bfloat16"] = decode_paths(shape, torch.bfloat16, 32, 128, (64, 256), FAST)
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


# --- the run ----------------------------------------------------------------------------------------------

# in this order: the comparison with TRL last, as the longest (it stops early near --budget-s)
CHECKS = ("decode", "decode_graph", "sync", "grpo", "local", "matmul_rate", "memory_8b", "trl_step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (gloo): the script's own test")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of the toy preset")
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks to run")
    parser.add_argument(
        "--budget-s", type=float, default=450.0, help="the run's time limit: trl_step runs fewer steps near it"
    )
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
    begin = time.perf_counter()
    checks: dict[str, Callable[[Path], dict[str, Any]]] = {
        "decode": lambda work: check_decode(args.smoke),
        "decode_graph": lambda work: check_decode_graph(args.smoke),
        "sync": lambda work: check_sync(work, args.smoke),
        "grpo": lambda work: check_grpo(work, args.steps),
        "local": lambda work: check_local(work, 2 if args.smoke else args.steps),
        "matmul_rate": lambda work: check_matmul_rate(args.smoke),
        "memory_8b": lambda work: check_memory_8b(args.smoke),
        "trl_step": lambda work: check_trl_step(
            args.smoke, report.get("memory_8b"), args.budget_s - (time.perf_counter() - begin)
        ),
    }
    names = args.only.split(",")
    with tempfile.TemporaryDirectory(prefix="queryrl-gpu-check-") as tmp:
        for name in names:
            start = time.perf_counter()
            try:
                report[name] = checks[name](Path(tmp))
            except Exception as e:  # recorded: the other checks still run
                report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            report[name]["wall_s"] = round(time.perf_counter() - start, 1)
            print(f"{name}: {'ok' if report[name]['ok'] else 'FAILED'} ({report[name]['wall_s']} s)", flush=True)
            report["ok"] = all(report[n]["ok"] for n in names if n in report)
            write_json(args.out, report | {"finished": False})  # kept if the time limit stops the run
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    report["ok"] = all(report[name]["ok"] for name in names)
    report["finished"] = True
    write_json(args.out, report)
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1, default=str)[:6000])
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
