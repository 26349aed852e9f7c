"""Stop a run that cannot learn: ``reward.max_skipped_steps`` skipped steps in a row end it.

A step is skipped when more than ``reward.max_failed_frac`` of its samples failed their reward
(:meth:`queryrl.trainer.loop.Trainer._scored_batch`). One such step is a hiccup (a judge timing out
for a minute); several in a row mean that no reward can be computed at all (a reward file that always
raises, a judge whose key variable is unset, a RAG URL that never answers), and a run that goes on
would print "done" with the initial weights. :class:`SkipWatch` counts the streak and, at the limit,
gives the message naming the first failed sample's error; the trainer raises :class:`RewardsFailing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from queryrl.redaction import redact
from queryrl.rewards import RewardResult


class RewardsFailing(RuntimeError):
    """The rewards failed ``reward.max_skipped_steps`` steps in a row: the run stops (the CLI exits 3)."""


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

    def skipped(self, step: int, results: Sequence[RewardResult]) -> None:
        """A generation batch of step `step` failed because of `results`: the step counts once, and not at
        all when another batch of it (``algo.filter_groups`` generates several) got its rewards."""
        if step in (self.last_step, self.trained_step):
            return
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
