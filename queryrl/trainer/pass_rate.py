"""Which training prompts give GRPO a signal, measured before training (``queryrl pass-rate``).

GRPO learns only from a group whose samples score differently: the advantage of a group whose rewards are all
equal is zero for every sample, so its generation, reference and update work teach nothing. On the query
rewriter's KdConv runs about 70 % of the groups were flat, and the logged groups say why: about two fifths were
prompts every sample already solved and about a third prompts no sample (nor the reference pipeline) solved.

This samples each training prompt `samples` times with the run's own starting policy, sampling settings and
reward (the same config ``queryrl train`` reads), and records per row the mean and spread of the rewards and
how many different responses there were. The rows whose rewards differed are the ones a GRPO step at the start
of the run can learn from; written to a parquet file of their own (the original columns, plus
``extra_info.pass_rate``), they become the run's ``data.train_files``. The idea is offline difficulty
filtering: Skywork-OR1 (He et al. 2025, arXiv:2505.22312) drops the prompts its starting model always or never
solves before RL; DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476; ``algo.filter_groups`` here) does
the same online, step by step, at the price of generating the flat groups it throws away in every step. Done
once, the measurement is shared by every run that starts from the same model (several GRPO seeds, a seed grid).

What it does not know: a prompt that was flat for the starting policy may carry a signal later in the run and
the reverse; `keep_flat` keeps a seeded share of the flat rows so the run still sees some of them.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from queryrl.atomic import atomic_path
from queryrl.config import ConfigError
from queryrl.data import DataError
from queryrl.data.prompts import PromptItem
from queryrl.engine.seeding import seed_everything
from queryrl.rewards import RewardError
from queryrl.trainer.metrics import PhaseTimer

PASS_RATE_KEY = "pass_rate"  # in extra_info of every written row


@dataclass(frozen=True)
class RowRate:
    """One prompt's measurement: its samples' rewards (failed samples left out) and distinct responses."""

    samples: int
    scored: int
    reward_mean: float | None
    reward_std: float | None
    distinct_responses: int

    @property
    def informative(self) -> bool:
        """At least two scored samples with different rewards: a GRPO group that teaches something."""
        return self.reward_std is not None and self.scored >= 2 and self.reward_std > 0.0


@dataclass
class PassRates:
    """What ``queryrl pass-rate`` measured (the report written beside the rows)."""

    rows: int = 0
    samples_per_row: int = 0
    informative: int = 0
    flat: int = 0
    one_response: int = 0  # flat rows whose samples were one text: flat under any reward
    unscored: int = 0  # rows with fewer than two scored samples
    kept: int = 0
    keep_flat: float = 0.0
    seconds: float = 0.0
    reward_mean: float | None = None
    files: list[str] = field(default_factory=list)

    def summary(self) -> str:
        share = self.informative / self.rows if self.rows else 0.0
        return (
            f"{self.rows} prompts x {self.samples_per_row} samples in {self.seconds:.0f} s: {self.informative} with "
            f"rewards that differ ({share:.0%}), {self.flat} flat ({self.one_response} of them one response), "
            f"{self.unscored} without two scored samples; kept {self.kept}"
        )


def _std(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def rate_rows(
    cfg: DictConfig,
    samples: int | None = None,
    rows: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[PromptItem], list[RowRate], float]:
    """Sample every training prompt of `cfg` (`rows`: the first ones after a seeded shuffle) `samples` times
    (default ``rollout.n``) with the run's starting policy and score them with its reward. Returns the
    prompts, their measurements and the seconds it took. No reference model is loaded and nothing is trained."""
    from queryrl.trainer.components import build_components
    from queryrl.trainer.scoring import generate_and_score, train_sampling

    cfg = cfg.copy()
    cfg.actor.use_kl_loss = False  # nothing is updated: the reference model is not needed
    cfg.algo.use_kl_in_reward = False
    cfg.trainer.backend = "local"  # sampling and scoring only: this process's model, no Ray workers
    seed_everything(cfg.trainer.seed)
    c = build_components(cfg)
    sampling = train_sampling(cfg, samples)
    items = [item for ds in c.loader.datasets for item in ds.items]
    random.Random(cfg.trainer.seed).shuffle(items)
    items = items[: rows or len(items)]
    per = max(int(cfg.data.train_batch_size), 1)
    start = time.perf_counter()
    rates: list[RowRate] = []
    for first in range(0, len(items), per):
        chunk = items[first : first + per]
        batch, results = generate_and_score(
            c.rollout, c.reward, c.policy.tokenizer, chunk, sampling, PhaseTimer(), c.device, c.select
        )
        stop = next((r for r in results if r.stop), None)
        if stop is not None:
            raise RewardError(f"pass-rate: the reward function raised: {stop.error}")
        which = batch.group_ids.tolist()
        texts = batch.non_tensor["response_text"]
        for i in range(len(chunk)):
            mine = [k for k, p in enumerate(which) if p == i]
            scores = [float(results[k].score) for k in mine if results[k].score is not None]  # type: ignore[arg-type]
            scores = [s for s in scores if math.isfinite(s)]
            rates.append(
                RowRate(
                    samples=len(mine),
                    scored=len(scores),
                    reward_mean=statistics.fmean(scores) if scores else None,
                    reward_std=_std(scores) if scores else None,
                    distinct_responses=len({texts[k] for k in mine}),
                )
            )
        if progress is not None:
            done = min(first + per, len(items))
            progress(f"pass-rate: {done}/{len(items)} prompts, {time.perf_counter() - start:.0f} s")
    return items, rates, time.perf_counter() - start


def kept_rows(rates: list[RowRate], keep_flat: float, seed: int) -> list[bool]:
    """The rows to train on: every informative row, and a seeded `keep_flat` share of the others."""
    if not 0.0 <= keep_flat <= 1.0:
        raise ConfigError(f"pass-rate: --keep-flat must be within [0, 1] (got {keep_flat})")
    draw = random.Random(seed)
    return [r.informative or draw.random() < keep_flat for r in rates]


def write_rows(out: Path, items: list[PromptItem], rates: list[RowRate], keep: list[bool]) -> int:
    """The kept rows, as read from their files, with ``extra_info.pass_rate`` added, to `out` (parquet, written
    under a temporary name and renamed). Returns how many were written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for item, rate, k in zip(items, rates, keep, strict=True):
        if not k:
            continue
        row = dict(item.row)
        row["extra_info"] = dict(row.get("extra_info") or {}) | {PASS_RATE_KEY: asdict(rate)}
        rows.append(row)
    if not rows:
        raise DataError(
            "pass-rate: no row is left to write (every prompt's samples scored alike); "
            "raise --keep-flat, sample more (--samples) or check the reward"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
    return len(rows)


def report_of(cfg: DictConfig, rates: list[RowRate], keep: list[bool], keep_flat: float, seconds: float) -> PassRates:
    """The counts ``queryrl pass-rate`` prints and writes beside the rows."""
    flat = [r for r in rates if not r.informative and r.scored >= 2]
    means = [r.reward_mean for r in rates if r.reward_mean is not None]
    return PassRates(
        rows=len(rates),
        samples_per_row=max((r.samples for r in rates), default=0),
        informative=sum(r.informative for r in rates),
        flat=len(flat),
        one_response=sum(r.distinct_responses == 1 for r in flat),
        unscored=sum(r.scored < 2 for r in rates),
        kept=sum(keep),
        keep_flat=keep_flat,
        seconds=round(seconds, 1),
        reward_mean=statistics.fmean(means) if means else None,
        files=[str(f) for f in cfg.data.train_files],
    )
