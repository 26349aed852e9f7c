"""Stop a run that cannot learn: ``reward.max_skipped_steps`` skipped steps in a row end it, and so do
``trainer.max_no_signal_steps`` steps in a row that had nothing to learn from; a run that updated the
weights in none of its steps ends with :class:`NothingTrained`, whatever those limits say.

A step is skipped when more than ``reward.max_failed_frac`` of its samples failed their reward
(:meth:`queryrl.trainer.loop.Trainer._scored_batch`). One such step is a hiccup (a judge timing out
for a minute); several in a row mean that no reward can be computed at all (a reward file that always
raises, a judge whose key variable is unset, a RAG URL that never answers), and a run that goes on
would print "done" with the initial weights. :class:`SkipWatch` counts the streak and, at the limit,
gives the message naming the first failed sample's error; the trainer raises :class:`RewardsFailing`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from queryrl.redaction import redact
from queryrl.rewards import RewardResult
from queryrl.trainer.metrics import zero_std_group_fraction


class RewardsFailing(RuntimeError):
    """The rewards failed ``reward.max_skipped_steps`` steps in a row: the run stops (the CLI exits 3)."""


class NothingToLearn(RewardsFailing):
    """``trainer.max_no_signal_steps`` steps in a row gave no learning signal: the run stops (exit 3)."""


class NothingTrained(RewardsFailing):
    """Every step the run took was skipped (or had nothing to update): the weights are the starting ones, so the
    run ends non-zero (exit 3) instead of printing "done", and writes no checkpoint of them."""


class RewardFunctionRaised(RewardsFailing):
    """A TRL-style reward function raised (or returned something that is not one number or None per
    completion): the run stops at once with its name and the error, as TRL's trainer raises it (exit 3)."""


@dataclass
class SkipWatch:
    """The current streak of skipped steps.

    Args:
        limit: ``reward.max_skipped_steps``; 0 never stops.
    """

    limit: int
    streak: int = 0
    first_step: int = 0
    first_error: str | None = None
    last_step: int = -1
    trained_step: int = -1
    trained_any: bool = False  # some step of this process got its rewards
    skipped_steps: int = 0  # the steps of this process skipped, in a row or not
    run_error: str | None = None  # the first failed sample's error of this process

    def skipped(self, step: int, results: Sequence[RewardResult]) -> None:
        """A generation batch of step `step` failed because of `results`: the step counts once, and not at
        all when another batch of it (``algo.filter_groups`` generates several) got its rewards."""
        if step in (self.last_step, self.trained_step):
            return
        self.skipped_steps += 1
        if self.run_error is None:
            self.run_error = next((r.error for r in results if r.failed and r.error), None)
        if self.streak == 0:
            self.first_step = step
            self.first_error = next((r.error for r in results if r.failed and r.error), None)
        self.streak += 1
        self.last_step = step

    def trained(self, step: int) -> None:
        """Step `step` got its rewards: the streak ends."""
        self.streak, self.first_error, self.last_step = 0, None, -1
        self.trained_step, self.trained_any = step, True

    def stop_message(self) -> str | None:
        """The message to stop with, or None while the run may go on."""
        if not self.limit or self.streak < self.limit:
            return None
        steps = f"steps {self.first_step}-{self.last_step}" if self.streak > 1 else f"step {self.first_step}"
        first = self.first_error or "no sample was scored"
        return redact(
            f"stopped: the rewards failed in {self.streak} steps in a row ({steps}; "
            f"reward.max_skipped_steps={self.limit}), so nothing was learned from them; first failure: {first}"
        )


def nothing_trained_message(watch: SkipWatch, first_step: int, last_step: int) -> str:
    """Why a run whose steps `first_step`..`last_step` (those of this process) updated nothing ends non-zero:
    how many were skipped (in a row or not, so ``reward.max_skipped_steps`` did not stop it) and the first
    failed sample's error."""
    steps = last_step - first_step + 1
    which = f"steps {first_step}-{last_step}" if steps > 1 else f"step {first_step}"
    if watch.skipped_steps >= steps:
        why = f"{'every one' if steps > 1 else 'it'} was skipped because its rewards failed"
    else:
        why = (
            f"{watch.skipped_steps} were skipped because their rewards failed, the others updated nothing "
            "(algo.filter_groups found no group whose samples scored differently, or critic.warmup_steps held "
            "the actor back)"
        )
    first = watch.run_error or "no sample was scored"
    return redact(
        f"stopped: no step trained: the run took {steps} step{'s' if steps > 1 else ''} ({which}) and {why} "
        f"(reward.max_failed_frac, reward.max_skipped_steps={watch.limit}); the weights are the starting ones, "
        f"so no checkpoint was written; first failure: {first}"
    )


def has_signal(scores: Tensor, group_ids: Tensor, baselines: Tensor | None = None) -> bool:
    """Whether the scores of a step can move the policy: some group (of size > 1) scored its samples
    differently, or, where no group has two samples, not every sample scored alike; with `baselines` (ReMax's
    greedy reward, grpo_reference's reference reward: one per sample) also a sample scored off its baseline.

    GRPO, RLOO and the other group estimators give every sample of an equal-scored group an advantage
    of 0; a step where every group is like that has no policy gradient at all (a KL term only pulls
    the policy back). The usual causes: answers that never parse (every sample gets the format
    floor), a reward that is constant, or a task too hard or too easy for the model.
    """
    scored = ~torch.isnan(scores)  # unscored samples (TRL's all-None rows) carry no signal
    if baselines is not None and bool((scores[scored] != baselines[scored]).any()):
        return True
    scores, group_ids = scores[scored], group_ids[scored]
    if scores.numel() == 0:
        return False
    sizes = torch.bincount(torch.unique(group_ids, return_inverse=True)[1])
    if bool((sizes > 1).any()):
        return zero_std_group_fraction(scores, group_ids) < 1.0
    return bool(scores.numel() > 1 and (scores != scores[0]).any())


@dataclass
class NoSignalWatch:
    """The current streak of steps without a learning signal (:func:`has_signal`).

    Args:
        limit: ``trainer.max_no_signal_steps``; 0 never stops.
    """

    limit: int
    streak: int = 0
    first_step: int = 0
    parts: dict[str, float] = field(default_factory=dict)  # the reward's parts at the streak's last step
    problem: str | None = None  # the application's reason at the streak's last step
    # the application's check of a step's metrics (Application.learning_problem), if it has one
    problem_of: Callable[[dict[str, float]], str | None] | None = None

    def observe(self, step: int, signal: bool, metrics: dict[str, float]) -> dict[str, float]:
        """Step `step` had (`signal`) or lacked a learning signal; `metrics` are its reward metrics. A reason
        of ``problem_of(metrics)`` that the step cannot teach anything (answers that never parse, empty
        queries: :meth:`~queryrl.application.Application.learning_problem`) counts as no signal. Returns
        ``training/no_signal_steps`` (the streak); a step without signal is said on the console."""
        problem = self.problem_of(metrics) if self.problem_of is not None else None
        if signal and problem is None:
            self.streak = 0
            self.problem = None
            return {"training/no_signal_steps": 0.0}
        why = problem or "every group scored all its samples alike, so every advantage is 0"
        warnings.warn(
            f"no learning signal: {why} (training/no_signal_steps counts the steps in a row; "
            f"trainer.max_no_signal_steps={self.limit} of them stop the run)",
            stacklevel=3,
        )
        if self.streak == 0:
            self.first_step = step
        self.streak += 1
        self.problem = problem
        self.parts = {
            k.removeprefix("reward/").removesuffix("/mean"): v
            for k, v in metrics.items()
            if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2
        }
        return {"training/no_signal_steps": float(self.streak)}

    def stop_message(self) -> str | None:
        """The message to stop with, or None while the run may go on."""
        if not self.limit or self.streak < self.limit:
            return None
        last = self.first_step + self.streak - 1
        parts = ", ".join(f"{k} {v:.3g}" for k, v in sorted(self.parts.items()))
        parts = f"; mean reward parts at the last step: {parts}" if parts else ""
        if self.problem is not None:
            return redact(
                f"stopped: nothing to learn in {self.streak} steps in a row (steps {self.first_step}-{last}; "
                f"trainer.max_no_signal_steps={self.limit}): {self.problem}{parts}"
            )
        return redact(
            f"stopped: no learning signal in {self.streak} steps in a row (steps {self.first_step}-{last}; "
            f"trainer.max_no_signal_steps={self.limit}): in every group all samples got the same reward, so every "
            "advantage was 0 and the policy did not change. Usual causes: answers that never parse (a format the "
            "model does not follow yet: warm it up with SFT, or reward retrieval on plain-text answers), a "
            f"constant reward, a task too hard for the model{parts}"
        )
