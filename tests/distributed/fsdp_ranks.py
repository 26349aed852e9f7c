"""One rank of the FSDP2 weight-sync check, run by tests/distributed/test_fsdp_sync.py in a process of its own
(and by ``make gpu-check`` on a GPU).

Each rank builds the real :class:`~queryrl.distributed.worker.PolicyWorker` (as a Ray worker would),
gives its LoRA adapters non-zero values (the same on every rank), keeps a plain copy of the policy as
the reference, joins a gloo group of `world` ranks (the worker shards the policy with FSDP2) and
generates with ``rollout.backend`` (the vLLM stand-in, or hf with fast decode). Then, at start-up,
after a real FSDP optimizer step and after a checkpoint load (``set_state``), it records:

- ``engine_diff``: max |engine weight - merged reference| (vllm: the stand-in's own parameters);
- ``changed_by_sync``: names of the trainer's shards a sync or a rollout changed (must be none);
- ``same_tokens``: whether the rollout's greedy tokens equal those of the merged reference model.

Rank 0 writes them as JSON to ``out``. One process runs several configurations in turn (one process
group each), so the imports are paid once.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn


def merged(model: nn.Module) -> nn.Module:
    """A plain copy of peft `model` with its adapters merged (peft's own merge), or a copy of a plain model."""
    clone = copy.deepcopy(model)
    return clone.merge_and_unload() if hasattr(clone, "peft_config") else clone  # type: ignore[operator]


def shards(model: nn.Module) -> dict[str, Tensor]:
    """This rank's local shard of every parameter, copied."""
    return {n: getattr(p, "to_local", lambda p=p: p)().detach().clone() for n, p in model.named_parameters()}


def full_reference(worker: Any, plain: nn.Module) -> nn.Module:
    """`plain` (the pre-sharding copy) with the worker's current trainable weights, merged."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(worker.policy.model, options=StateDictOptions(full_state_dict=True))
    own = dict(plain.named_parameters())
    with torch.no_grad():
        for name, value in full.items():
            if name in own:
                own[name].copy_(value)
    return merged(plain)


def rank_main(rank: int, world: int, runs: list[tuple[int, dict[str, Any], str]], fake_vllm: str) -> None:
    """Run :func:`check_run` for each ``(port, config, out)`` of `runs` in turn, in this one process."""
    sys.path.insert(0, fake_vllm)
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    torch.set_num_threads(1)
    for port, cfg, out in runs:
        check_run(rank, world, port, cfg, out)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the last configuration's worker is gone


def check_run(rank: int, world: int, port: int, cfg: dict[str, Any], out: str) -> None:
    """One configuration: a worker joins a group of `world` ranks at `port`, checked at its three stages."""
    from queryrl.distributed.worker import PolicyWorker
    from queryrl.rollout import SamplingParams, make_rollout

    if cfg["rollout"]["backend"] == "vllm":
        import vllm

        vllm.LLM.instances.clear()
    worker = PolicyWorker(cfg, rank, world, roles=("actor",))
    model = worker.policy.model
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: the adapters would be invisible
                p.copy_(0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype))
    plain = copy.deepcopy(model)
    info = worker.init_process_group("127.0.0.1", port)
    assert info["fsdp"], info
    tok = worker.policy.tokenizer
    texts = ["hello", "请问这款手机多少钱？", "What is 3 + 4?"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=8)
    dtype = worker._rollout_dtype()
    result: dict[str, Any] = {"backend": cfg["rollout"]["backend"], "checks": []}

    def check(stage: str, before: dict[str, Tensor]) -> None:
        reference = full_reference(worker, plain)
        out_tokens = worker.generate(prompts, greedy, seed=0).response_ids
        ref_tokens = make_rollout("hf", reference.to(dtype), tok, fast_decode="off").generate(prompts, greedy)
        same = torch.equal(out_tokens.cpu(), ref_tokens.response_ids.cpu())  # the engine may be on a GPU
        row: dict[str, Any] = {"stage": stage, "same_tokens": bool(same)}
        if result["backend"] == "vllm":
            import vllm

            (llm,) = vllm.LLM.instances
            engine = llm.model.lm.state_dict()
            expected = reference.state_dict()
            row["engine_diff"] = max(
                (engine[k].float().cpu() - expected[k].to(dtype).float().cpu()).abs().max().item() for k in expected
            )
            row["engine_dtype"] = str(next(llm.model.lm.parameters()).dtype)
            row["loads"] = llm.model.loads
        after = shards(model)
        row["changed_by_sync"] = [n for n in before if not torch.equal(before[n].cpu(), after[n].cpu())]
        result["checks"].append(row)

    before = shards(model)
    check("start-up", before)  # the first generate builds the engine, which takes the weights

    # a real FSDP step: forward and backward on the sharded policy, AdamW over the shards
    model.train()
    ids = torch.tensor([prompts[0]], device=worker.device)
    loss = model(input_ids=ids).logits.float().pow(2).mean()
    loss.backward()
    worker.optimizers["actor"].step()
    worker.optimizers["actor"].zero_grad()
    stepped = shards(model)
    result["step_moved"] = max((stepped[n].cpu() - before[n].cpu()).abs().max().item() for n in before)
    worker.sync_rollout()
    check("after an optimizer step", stepped)

    # a checkpoint load: every rank takes the same full trainable state
    state = worker.get_state("actor")
    weights = state["weights"] if state is not None else None
    box = [weights]
    torch.distributed.broadcast_object_list(box, src=0)
    loaded = {n: v + 0.01 * torch.randn(v.shape, generator=gen).to(v.device, v.dtype) for n, v in box[0].items()}
    box = [loaded]
    torch.distributed.broadcast_object_list(box, src=0)
    worker.set_state("actor", {"weights": box[0]})
    worker.sync_rollout()
    check("after a checkpoint load", shards(model))

    if rank == 0:
        Path(out).write_text(json.dumps(result))
    torch.distributed.destroy_process_group()
