"""The rollout engine's weights under FSDP2 on gloo CPU ranks, at world sizes 1 and 2 (see fsdp_ranks.py).

Before this test existed, the sync handed vLLM DTensor shards ("aten.copy_.default got mixed torch.Tensor
and DTensor"), and with LoRA it merged the adapters into the gathered weights and unmerged them from the
shards, moving the trainer's base weights by up to 0.39 at every sync. Here the worker is the real one;
the engine is the vLLM stand-in, whose loader copies into its own full-size parameters as vLLM's does, or
the hf backend with its fast decode path. Every stage must give the engine the merged weights (to 1e-6;
one bf16 rounding in mixed precision), leave every shard of the trainer bit for bit as it was, and sample
the greedy tokens of the merged model.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from tests.distributed.fsdp_ranks import rank_main
from tests.helpers import FAKE_VLLM, make_cfg

pytestmark = pytest.mark.slow

LORA = ("model.lora.rank=4", "model.lora.alpha=8", "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,up_proj]")
MODELS = {
    "full": ("model.lora.rank=0",),
    "lora": LORA,
    "lora_mixed": (*LORA, "model.dtype=float32", "model.compute_dtype=bfloat16"),
    "lora_bf16_base": (*LORA, "model.dtype=bfloat16"),  # the GPU preset's: fp32 adapters over a bf16 base
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


VARIANTS = [(name, "vllm", overrides) for name, overrides in MODELS.items()] + [
    ("lora -> hf fast decode", "hf", (*MODELS["lora"], "rollout.fast_decode=auto"))
]


def run_ranks(tmp_path: Path, model_cache: Path, world: int) -> dict[str, dict[str, Any]]:
    """Every variant in one set of `world` rank processes (the imports paid once): its checks by name."""
    runs = []
    for i, (_, backend, overrides) in enumerate(VARIANTS):
        cfg = make_cfg(
            tmp_path, model_cache, "ray.fsdp=true", "ray.fsdp_on_cpu=true", f"rollout.backend={backend}", *overrides
        )
        runs.append((_free_port(), OmegaConf.to_container(cfg, resolve=True), str(tmp_path / f"result-{i}.json")))
    mp.spawn(rank_main, args=(world, runs, str(FAKE_VLLM)), nprocs=world, join=True)
    return {name: json.loads(Path(out).read_text()) for (name, _, _), (_, _, out) in zip(VARIANTS, runs, strict=True)}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2])
def test_the_engine_gets_the_merged_weights_and_the_trainer_keeps_its_own(
    tmp_path: Path, model_cache: Path, tiny_bundle: Any, world: int
) -> None:
    results = run_ranks(tmp_path, model_cache, world)
    print(json.dumps({name: r["checks"] for name, r in results.items()}, indent=1))
    for name, result in results.items():
        assert result["step_moved"] > 1e-4, name  # the optimizer step changed the weights the sync must follow
        stages = [c["stage"] for c in result["checks"]]
        assert stages == ["start-up", "after an optimizer step", "after a checkpoint load"], name
        for row in result["checks"]:
            assert row["changed_by_sync"] == [], (name, row["stage"])
            assert row["same_tokens"], (name, row["stage"])
        if result["backend"] != "vllm":
            continue
        assert [c["loads"] for c in result["checks"]] == [1, 2, 3], name
        tolerance = 1e-6 if name in ("full", "lora") else 2**-7  # bf16 engines: one rounding of the merged weight
        for row in result["checks"]:
            assert row["engine_diff"] < tolerance, (name, row["stage"])
