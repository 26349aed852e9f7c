"""Plain helpers shared by test modules of several packages (fixtures live in ``conftest.py``).

Test modules import from here, never from one another (``tests/test_layout.py`` checks it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from queryrl.apps.query_rewrite.data.kdconv import KDCONV_VARIABLE, kdconv_missing
from queryrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
# KdConv's travel folder (not in the repository): $KDCONV_DIR, else shared/data/kdconv/travel beside the checkout;
# film/ and music/ are read beside it
KDCONV = Path(os.environ.get(KDCONV_VARIABLE) or REPO.parent / "shared" / "data" / "kdconv" / "travel")


def needs_kdconv(*files: str) -> pytest.MarkDecorator:
    """Skip unless KdConv's `files` exist (paths under KdConv's root, default ``travel/dev.json`` and
    ``travel/kb_travel.json``; travel is :data:`KDCONV`), the reason saying where KdConv comes from
    (:func:`~queryrl.apps.query_rewrite.data.kdconv.kdconv_missing`)."""
    paths = [KDCONV / name.removeprefix("travel/") if name.startswith("travel/") else KDCONV.parent / name
             for name in files or ("travel/dev.json", "travel/kb_travel.json")]  # fmt: skip
    missing = [p for p in paths if not p.is_file()]
    return pytest.mark.skipif(bool(missing), reason=kdconv_missing(missing[0]) if missing else "KdConv is present")


# the CPU stand-in for vLLM 0.32 (tests/rollout/fake_vllm/README.md), put on sys.path by the fake_vllm fixture
FAKE_VLLM = REPO / "tests" / "rollout" / "fake_vllm"

# The users' scripts/run_hybrid_grpo_query_RL.sh, entry point swapped for `queryrl train`.
SEED_LAUNCH = r"""
queryrl train \
    algorithm.adv_estimator=grpo \
    algorithm.norm_adv_by_std_in_grpo=true \
    algorithm.use_kl_in_reward=false \
    +algorithm.hybrid_grpo_gpt5.enable=true \
    +algorithm.hybrid_grpo_gpt5.group_size=5 \
    +algorithm.hybrid_grpo_gpt5.gpt5_weight=0.85 \
    +algorithm.hybrid_grpo_gpt5.grpo_weight=0.15 \
    +algorithm.hybrid_grpo_gpt5.selection_method=max_log_prob \
    data.train_files=/home/jovyan2/query_rl/data/sales_rag/train.parquet \
    data.val_files=/home/jovyan2/query_rl/data/sales_rag/val.parquet \
    data.train_batch_size=8 \
    actor_rollout_ref.model.path=/home/jovyan2/query_rl/model/Qwen3-8B \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.temperature=0.7 \
    trainer.project_name='sales_rag_grpo_gpt5_v4' \
    trainer.experiment_name='qwen3_8b_grpo_gpt5_hybrid' \
    trainer.n_gpus_per_node=2 \
    trainer.total_epochs=20 \
    +seed=42
"""


def small_run(output_dir: Path, model_cache: Path) -> list[str]:
    """The overrides that shrink a preset for a test: 4 prompts x 4 samples, JSONL logging, no plots or validation."""
    return [
        f"trainer.output_dir={output_dir}",
        f"model.cache_dir={model_cache}",
        "trainer.logger=[jsonl]",
        "trainer.plot=false",
        "trainer.eval_every=0",
        "data.val_files=[]",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "rollout.n=4",
    ]


def make_cfg(tmp_path: Path, model_cache: Path, *overrides: str) -> DictConfig:
    """The toy preset, shrunk to a few fast steps.

    Args:
        tmp_path: The run's output folder (``trainer.output_dir``).
        model_cache: Where the tiny model is built (``model.cache_dir``).
        *overrides: Dotted overrides applied after the shrinking ones.

    Returns:
        The loaded config: two GRPO steps of 4 prompts x 4 samples, JSONL logging only, no validation.
    """
    return load_config(
        REPO / "configs" / "toy_grpo.yaml",
        [*small_run(tmp_path, model_cache), "trainer.total_steps=2", "trainer.save_every=0", *overrides],
    )


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of `module`'s parameters by name, to compare before and after training."""
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """`b` has `a`'s parameters, name for name, bit for bit (a resumed run against the one that never stopped)."""
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], atol=0, rtol=0, msg=k)


def metrics_of(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of `run_dir`'s ``metrics.jsonl``, one dict per logged step."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def cfg_with_reward_file(tmp_path: Path, model_cache: Path, source: str, name: str, *overrides: str) -> DictConfig:
    """:func:`make_cfg` with the reward function `name` of a file holding `source` (``tmp_path/reward.py``)."""
    reward = tmp_path / "reward.py"
    reward.write_text(source)
    return make_cfg(tmp_path, model_cache, f"reward.function.path={reward}", f"reward.function.name={name}", *overrides)


TARGET = "hello world"  # the SFT tests' fixed target and prompts
PROMPTS = ["Say hello.", "Greet the world.", "What do you say?", "Reply please."]


def write_sft_rows(path: Path, prompts: list[str] = PROMPTS, target: Any = TARGET, bad_row: int | None = None) -> Path:
    """A JSON-lines file of verl rows whose ``extra_info.sft_target`` is `target` (absent at `bad_row`)."""
    rows = []
    for i, prompt in enumerate(prompts):
        extra: dict[str, Any] = {"index": i} if i == bad_row else {"index": i, "sft_target": target}
        rows.append({"data_source": "test/sft", "prompt": [{"role": "user", "content": prompt}], "extra_info": extra})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_sft_cfg(tmp_path: Path, model_cache: Path, data: Path, *overrides: str) -> DictConfig:
    """A small SFT run on `data` into ``tmp_path/out``."""
    return load_config(
        None,
        [
            f"model.cache_dir={model_cache}",
            f"sft.train_files=[{data}]",
            f"sft.output_dir={tmp_path / 'out'}",
            f"trainer.output_dir={tmp_path}",
            "trainer.logger=[jsonl]",
            "trainer.num_threads=1",
            "sft.batch_size=4",
            "sft.micro_batch_size=4",
            "sft.lr_schedule=constant",
            *overrides,
        ],
    )
