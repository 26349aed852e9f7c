"""Rewards overlap generation: each chunk's rewards start while later chunks still generate."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg

LATENCY_S = 0.3

SLOW_JUDGE = f"""
import asyncio, time

async def compute_score(data_source, solution_str, ground_truth, extra_info=None, log_path=None):
    with open(log_path, "a") as f:
        f.write(f"{{time.monotonic()}}\\n")
    await asyncio.sleep({LATENCY_S})  # a judge behind an API with a fixed latency
    return float(len(solution_str) % 3)
"""


@pytest.mark.slow
def test_rewards_start_before_generation_ends_and_the_wait_is_one_latency(tmp_path: Path, model_cache: Path) -> None:
    reward_file = tmp_path / "slow_judge.py"
    reward_file.write_text(SLOW_JUDGE)
    log = tmp_path / "calls.log"
    cfg = make_cfg(
        tmp_path,
        model_cache,
        f"reward.function.path={reward_file}",
        f"reward.kwargs.log_path={log}",
        "reward.manager=async",
        "reward.max_concurrency=64",
        "rollout.micro_batch_size=4",  # 16 sequences -> 4 chunks
        "trainer.total_steps=1",
    )
    trainer = Trainer(cfg)
    chunk_done: list[float] = []
    generate_chunks = trainer.c.rollout.generate_chunks

    def timed_chunks(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for chunk in generate_chunks(*args, **kwargs):
            time.sleep(0.1)  # make each chunk take visible time, as a real model's would
            chunk_done.append(time.monotonic())
            yield chunk

    trainer.c.rollout.generate_chunks = timed_chunks  # type: ignore[method-assign]
    metrics = trainer.fit()
    starts = sorted(float(x) for x in log.read_text().split())
    assert len(chunk_done) == 4
    assert len(starts) == 16
    assert starts[0] < chunk_done[-1], "the first rewards must start before the last chunk is generated"
    # 4 chunks x 0.1 s of generation hide most of the judge latency; what is left is < 1 latency
    assert metrics["timing_s/reward_wait"] < 1.1 * LATENCY_S
    assert metrics["reward/failed"] == 0
