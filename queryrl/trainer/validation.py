"""The trainer's validation pass: greedy (by default) generation on every validation set, scored per
``data_source`` (``val/<source>/score/mean``, ``val/score/mean``, ``val/response_length/mean``,
``val/reward/failed`` and, for TRL-style functions that left samples unscored, ``val/reward/unscored``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from queryrl.redaction import redact
from queryrl.rollout import SamplingParams
from queryrl.trainer.components import Components
from queryrl.trainer.metrics import PhaseTimer
from queryrl.trainer.scoring import generate_and_score
from queryrl.trainer.skips import RewardFunctionRaised


def validate(
    c: Components, cfg: DictConfig, sampling: SamplingParams, step: int, progress: Mapping[str, Any]
) -> dict[str, float]:
    """Score the policy of `c` on every validation set of `c` with `sampling` at training step `step`.

    Raises:
        RewardFunctionRaised: a TRL-style reward function raised in validation (TRL stops there too).
    """
    per_source: dict[str, list[float]] = {}
    lengths: list[float] = []
    failed = unscored = 0
    for dataset in c.val_datasets:
        items = dataset.items[: cfg.data.max_val_samples or None]
        for start in range(0, len(items), cfg.data.val_batch_size):
            chunk = items[start : start + cfg.data.val_batch_size]
            batch, results = generate_and_score(
                c.rollout, c.reward, c.policy.tokenizer, chunk, sampling, PhaseTimer(), c.device,
                step=step,  # a TRL-style function's trainer_state.global_step, as in TRL's evaluation
                progress=progress,
            )  # fmt: skip
            fatal = next((r for r in results if r.stop), None)
            if fatal is not None:
                raise RewardFunctionRaised(redact(f"stopped in validation at step {step}: {fatal.error}"))
            for row, result in zip(batch.non_tensor["row"], results, strict=True):
                if result.score is None:
                    failed += 1
                elif result.unscored:  # TRL's nanmean leaves it out of the mean
                    unscored += 1
                else:
                    per_source.setdefault(str(row.get("data_source", "")), []).append(result.score)
            lengths += batch.response_lengths.float().tolist()
    metrics = {f"val/{src}/score/mean": sum(v) / len(v) for src, v in per_source.items()}
    every = [s for v in per_source.values() for s in v]
    if every:
        metrics["val/score/mean"] = sum(every) / len(every)
    if lengths:
        metrics["val/response_length/mean"] = sum(lengths) / len(lengths)
    metrics["val/reward/failed"] = float(failed)
    if unscored:
        metrics["val/reward/unscored"] = float(unscored)
    return metrics
