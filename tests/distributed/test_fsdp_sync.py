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

from tests.conftest import FAKE_VLLM
from tests.distributed.fsdp_ranks import rank_main
from tests.helpers import make_cfg

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


def run_ranks(tmp_path: Path, model_cache: Path, world: int, backend: str, *overrides: str) -> dict[str, Any]:
    cfg = make_cfg(
        tmp_path, model_cache, "ray.fsdp=true", "ray.fsdp_on_cpu=true", f"rollout.backend={backend}", *overrides
    )
    out = tmp_path / "result.json"
    plain = OmegaConf.to_container(cfg, resolve=True)
    mp.spawn(rank_main, args=(world, _free_port(), plain, str(FAKE_VLLM), str(out)), nprocs=world, join=True)
    return json.loads(out.read_text())


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("model", list(MODELS))
def test_vllm_engine_gets_the_merged_weights_and_the_trainer_keeps_its_own(
    tmp_path: Path, model_cache: Path, tiny_bundle: Any, world: int, model: str
) -> None:
    result = run_ranks(tmp_path, model_cache, world, "vllm", *MODELS[model])
    assert result["step_moved"] > 1e-4  # the optimizer step changed the weights the sync must follow
    tolerance = 1e-6 if model in ("full", "lora") else 2**-7  # bf16 engines: one rounding of the merged weight
    print(json.dumps(result["checks"], indent=1))
    assert [c["stage"] for c in result["checks"]] == ["start-up", "after an optimizer step", "after a checkpoint load"]
    assert [c["loads"] for c in result["checks"]] == [1, 2, 3]
    for row in result["checks"]:
        assert row["changed_by_sync"] == [], row["stage"]
        assert row["engine_diff"] < tolerance, row["stage"]
        assert row["same_tokens"], row["stage"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2])
def test_hf_fast_decode_under_fsdp_samples_the_merged_model(
    tmp_path: Path, model_cache: Path, tiny_bundle: Any, world: int
) -> None:
    result = run_ranks(tmp_path, model_cache, world, "hf", *MODELS["lora"], "rollout.fast_decode=auto")
    for row in result["checks"]:
        assert row["changed_by_sync"] == [], row["stage"]
        assert row["same_tokens"], row["stage"]
