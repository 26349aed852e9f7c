"""A run that cannot learn stops (reward.max_skipped_steps, trainer.max_no_signal_steps); the max_failed_frac boundary.

The reward files fail by call count (the ``naive`` manager scores one sample after another), so
which steps fail is exact: the toy preset below has 4 prompts x 4 responses = 16 samples a step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from queryrl.config import ConfigError, load_config
from queryrl.errors import user_error
from queryrl.trainer.loop import Trainer
from queryrl.trainer.skips import (
    NothingToLearn,
    NothingTrained,
    RewardsFailing,
    SkipWatch,
    has_signal,
    nothing_trained_message,
)
from tests.helpers import small_run

REPO = Path(__file__).resolve().parents[2]


def reward_file(tmp_path: Path, fails: str) -> Path:
    """A reward file whose call number k (0-based) raises when the expression `fails` is true."""
    path = tmp_path / "flaky_reward.py"
    path.write_text(
        "import itertools\n"
        "_calls = itertools.count()\n\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    k = next(_calls)\n"
        f"    if {fails}:\n"
        "        raise RuntimeError(f'judge unreachable (call {k})')\n"
        "    return float(len(solution_str) % 3)\n"
    )
    return path


def make_cfg(tmp_path: Path, model_cache: Path, reward: Path, *overrides: str) -> DictConfig:
    return load_config(
        REPO / "configs" / "toy_grpo.yaml",
        [
            *small_run(tmp_path / "runs", model_cache),
            "trainer.save_every=0",
            f"reward.function.path={reward}",
            *overrides,
        ],
    )


def rows(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "runs" / "toy_grpo" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters()}


def fit_changes_weights(cfg: DictConfig) -> bool:
    """Train `cfg`'s run; whether any policy weight moved. A run that trained no step ends with
    :class:`NothingTrained` and no checkpoint (checked here), and its weights did not move."""
    with Trainer(cfg) as trainer:
        before = params(trainer)
        try:
            trainer.fit()
        except NothingTrained:
            assert trainer.updated_steps == 0
            assert not (trainer.run_dir / "checkpoints").exists()
        return any(not torch.equal(before[k], v) for k, v in params(trainer).items())


@pytest.mark.slow
def test_a_run_whose_every_reward_fails_stops_naming_the_first_failure(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_cfg(tmp_path, model_cache, reward_file(tmp_path, "True"), "trainer.total_steps=10")
    with Trainer(cfg) as trainer, pytest.raises(RewardsFailing) as stopped:
        trainer.fit()
    message = str(stopped.value)
    assert "3 steps in a row (steps 1-3; reward.max_skipped_steps=3)" in message
    first = "reward for data_source='toy/target_string' failed: RuntimeError: judge unreachable (call 0)"
    assert message.endswith(f"first failure: {first}")
    assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3]  # the steps before the stop are logged
    assert all(r["reward/step_skipped"] == 1.0 for r in rows(tmp_path))
    assert not (tmp_path / "runs" / "toy_grpo" / "checkpoints").exists()  # nothing learned: nothing to save
    # a skipped step still writes its samples, each failed with its error, for a person to see why
    for step in (1, 2, 3):
        path = tmp_path / "runs" / "toy_grpo" / "samples" / f"step_{step}.jsonl"
        samples = [json.loads(line) for line in path.read_text().splitlines()]
        assert samples
        assert all(s["failed"] and s["score"] is None and "judge unreachable" in s["error"] for s in samples)


def test_a_step_that_trains_ends_the_streak_and_the_stop_keeps_what_was_learned(
    tmp_path: Path, model_cache: Path
) -> None:
    # step 1 trains, step 2 fails, step 3 trains, steps 4-5 fail (16 samples a step)
    fails = "16 <= k < 32 or 48 <= k < 80"
    cfg = make_cfg(tmp_path, model_cache, reward_file(tmp_path, fails), "trainer.total_steps=5")
    with Trainer(cfg) as trainer:
        trainer.fit()  # never 3 in a row: the run completes
    assert [r.get("reward/step_skipped", 0.0) for r in rows(tmp_path)] == [0.0, 1.0, 0.0, 1.0, 1.0]

    other = tmp_path / "again"
    other.mkdir()
    cfg = make_cfg(other, model_cache, reward_file(other, fails), "trainer.total_steps=8", "reward.max_skipped_steps=2")
    with Trainer(cfg) as trainer, pytest.raises(RewardsFailing, match=r"2 steps in a row \(steps 4-5;.*call 48\)"):
        trainer.fit()
    # steps 1 and 3 trained: the stop checkpoints them, so a resume (once the reward is fixed) keeps them
    assert (other / "runs" / "toy_grpo" / "checkpoints" / "step_5" / "state.json").is_file()


def test_max_skipped_steps_0_never_stops_but_training_nothing_fails(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_cfg(
        tmp_path, model_cache, reward_file(tmp_path, "True"), "trainer.total_steps=4", "reward.max_skipped_steps=0"
    )
    with Trainer(cfg) as trainer, pytest.raises(NothingTrained, match=r"^stopped: no step trained: the run took 4"):
        trainer.fit()
    assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3, 4]  # it did not stop early
    assert not (tmp_path / "runs" / "toy_grpo" / "checkpoints").exists()  # not the starting weights as "final"


@pytest.mark.slow
def test_every_step_skipped_but_fewer_than_max_skipped_steps_exits_3(tmp_path: Path, model_cache: Path) -> None:
    """2 skipped steps never reach reward.max_skipped_steps=3 in a row; the run still trained on none of them."""
    cfg = make_cfg(tmp_path, model_cache, reward_file(tmp_path, "True"), "trainer.total_steps=2")
    with Trainer(cfg) as trainer, pytest.raises(NothingTrained) as stopped:
        trainer.fit()
    message = str(stopped.value)
    assert message.startswith("stopped: no step trained: the run took 2 steps (steps 1-2) and every one was skipped")
    assert message.endswith("RuntimeError: judge unreachable (call 0)")
    assert user_error(stopped.value) == (message, 3)
    assert not (tmp_path / "runs" / "toy_grpo" / "checkpoints").exists()


@pytest.mark.slow
def test_skips_not_in_a_row_around_a_trained_step_let_the_run_complete(tmp_path: Path, model_cache: Path) -> None:
    # steps 1 and 3 fail (16 samples a step), step 2 trains; reward.max_skipped_steps=2 is never reached in a row
    fails = "k < 16 or k >= 32"
    cfg = make_cfg(
        tmp_path, model_cache, reward_file(tmp_path, fails), "trainer.total_steps=3", "reward.max_skipped_steps=2"
    )
    with Trainer(cfg) as trainer:
        trainer.fit()
        assert (trainer.updated_steps, trainer.skips.skipped_steps) == (1, 2)
    assert [r.get("reward/step_skipped", 0.0) for r in rows(tmp_path)] == [1.0, 0.0, 1.0]
    assert (tmp_path / "runs" / "toy_grpo" / "checkpoints" / "step_3" / "state.json").is_file()


def test_the_nothing_trained_message_counts_skips_in_a_row_or_not() -> None:
    watch = SkipWatch(limit=3)
    watch.skipped(1, [])
    watch.trained(2)  # a step whose group filter then left nothing to update (algo.filter_groups)
    watch.skipped(3, [])
    assert (watch.skipped_steps, watch.streak, watch.stop_message()) == (2, 1, None)
    message = nothing_trained_message(watch, 1, 3)
    assert message.startswith("stopped: no step trained: the run took 3 steps (steps 1-3) and 2 were skipped")
    assert "algo.filter_groups" in message
    one = SkipWatch(limit=0)
    one.skipped(5, [])  # a resumed run's only step
    assert "the run took 1 step (step 5) and it was skipped" in nothing_trained_message(one, 5, 5)


def test_max_skipped_steps_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"reward\.max_skipped_steps must be >= 0"):
        load_config(None, ["reward.max_skipped_steps=-1"])


def test_skip_watch_counts_each_step_once() -> None:
    watch = SkipWatch(limit=2)
    watch.skipped(1, [])
    watch.skipped(1, [])  # filter_groups: a second generation batch of the same step
    assert watch.stop_message() is None
    watch.skipped(2, [])
    assert watch.stop_message() is not None
    assert "no sample was scored" in str(watch.stop_message())
    watch.trained(3)
    watch.skipped(3, [])  # filter_groups: a later batch of a step that trained does not count
    assert watch.streak == 0


# --- reward.max_failed_frac: a step is skipped when MORE than that fraction failed ----------------


@pytest.mark.parametrize(("max_failed_frac", "skipped"), [(0.5, False), (0.45, True)])
def test_exactly_max_failed_frac_failed_trains_on_the_rest(
    tmp_path: Path, model_cache: Path, max_failed_frac: float, skipped: bool
) -> None:
    cfg = make_cfg(
        tmp_path,
        model_cache,
        reward_file(tmp_path, "k % 2 == 0"),  # exactly half of every step fails
        "trainer.total_steps=1",
        f"reward.max_failed_frac={max_failed_frac}",
        "reward.drop_failed_groups=false",  # the failed samples alone (every group has one)
    )
    changed = fit_changes_weights(cfg)
    (row,) = rows(tmp_path)
    assert row["reward/failed_frac"] == 0.5
    assert row["reward/failed"] == 8.0
    assert row.get("reward/step_skipped", 0.0) == float(skipped)
    assert changed is not skipped  # at the boundary the step trains on the 8 samples that were scored


def test_the_boundary_is_exact_for_fractions_that_floats_round(tmp_path: Path, model_cache: Path) -> None:
    # 5 prompts x 2 responses: 3 of 10 fail, and 3/10 must not read as 0.30000000000000004 > 0.3
    cfg = make_cfg(
        tmp_path,
        model_cache,
        reward_file(tmp_path, "k % 10 < 3"),
        "trainer.total_steps=1",
        "data.train_batch_size=5",
        "actor.ppo_mini_batch_size=5",
        "rollout.n=2",
        "reward.max_failed_frac=0.3",
        "reward.drop_failed_groups=false",
    )
    with Trainer(cfg) as trainer:
        trainer.fit()
    (row,) = rows(tmp_path)
    assert row["reward/failed"] == 3.0
    assert "reward/step_skipped" not in row


@pytest.mark.parametrize("drop_failed_groups", [True, False])
def test_a_failed_samples_group_mates_are_left_out_with_it(
    tmp_path: Path, model_cache: Path, drop_failed_groups: bool
) -> None:
    """Failures that fall on one kind of sample in every group (a RAG outage: each rewrite that needed retrieval)
    left an update on the other kind only; by default the groups go, and so does the step."""
    cfg = make_cfg(
        tmp_path,
        model_cache,
        reward_file(tmp_path, "k % 4 == 0"),  # one sample of each of the 4 groups of 4
        "trainer.total_steps=1",
        f"reward.drop_failed_groups={str(drop_failed_groups).lower()}",
    )
    changed = fit_changes_weights(cfg)
    (row,) = rows(tmp_path)
    assert row["reward/failed"] == 4.0
    if drop_failed_groups:
        assert (row["reward/dropped_group_mates"], row["reward/failed_frac"], row["reward/step_skipped"]) == (12, 1, 1)
        assert not changed
        shown = [
            json.loads(line) for line in (tmp_path / "runs/toy_grpo/samples/step_1.jsonl").read_text().splitlines()
        ]
        mates = [r for r in shown if "another sample of its group failed" in r.get("not_trained", "")]
        assert mates
        assert all("failed" not in r and r["score"] is not None for r in mates)  # scored, shown, not trained
    else:
        assert (row["reward/failed_frac"], row.get("reward/step_skipped", 0.0)) == (0.25, 0.0)
        assert "reward/dropped_group_mates" not in row
        assert changed  # trained on the 12 that could be scored


def test_a_group_that_failed_whole_costs_no_other_group(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_cfg(tmp_path, model_cache, reward_file(tmp_path, "k < 4"), "trainer.total_steps=1")  # group 0
    with Trainer(cfg) as trainer:
        trainer.fit()
    (row,) = rows(tmp_path)
    assert (row["reward/failed"], row["reward/failed_frac"], row.get("reward/step_skipped", 0.0)) == (4, 0.25, 0)
    assert row.get("reward/dropped_group_mates", 0.0) == 0.0


# --- no learning signal -------------------------------------------------------------------------------------


def constant_reward_file(tmp_path: Path, value: str) -> Path:
    """A reward that scores every sample `value` (a Python expression of `k`, the call number)."""
    path = tmp_path / "constant_reward.py"
    path.write_text(
        "import itertools\n"
        "_calls = itertools.count()\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    k = next(_calls)\n    return {{'score': float({value}), 'format': 0.0}}\n"
    )
    return path


def test_a_run_without_learning_signal_stops_saying_why(tmp_path: Path, model_cache: Path) -> None:
    """What a model that never follows the answer format does: every sample gets the same floor score."""
    cfg = make_cfg(tmp_path, model_cache, constant_reward_file(tmp_path, "-1"), "trainer.total_steps=10",
                   "trainer.max_no_signal_steps=3")  # fmt: skip
    with Trainer(cfg) as trainer, pytest.raises(NothingToLearn) as stopped:
        trainer.fit()
    message = str(stopped.value)
    assert "no learning signal in 3 steps in a row (steps 1-3; trainer.max_no_signal_steps=3)" in message
    assert "answers that never parse" in message
    assert "mean reward parts at the last step: format 0" in message
    assert [r["training/no_signal_steps"] for r in rows(tmp_path)] == [1.0, 2.0, 3.0]
    assert [r["reward/zero_std_group_frac"] for r in rows(tmp_path)] == [1.0, 1.0, 1.0]
    assert user_error(stopped.value) == (message, 3)  # the CLI's exit code: the run did not learn


def test_a_step_with_signal_ends_the_streak(tmp_path: Path, model_cache: Path) -> None:
    # 16 samples a step in 4 groups of 4: steps 3 and 6 vary one sample, the others are constant
    varied = "1.0 if k in (32, 80) else 0.0"
    cfg = make_cfg(tmp_path, model_cache, constant_reward_file(tmp_path, varied), "trainer.total_steps=6",
                   "trainer.max_no_signal_steps=3")  # fmt: skip
    with Trainer(cfg) as trainer:
        trainer.fit()  # never 3 in a row
    assert [r["training/no_signal_steps"] for r in rows(tmp_path)] == [1.0, 2.0, 0.0, 1.0, 2.0, 0.0]


def test_has_signal_by_groups_and_without_them() -> None:
    groups = torch.tensor([0, 0, 1, 1])
    assert not has_signal(torch.tensor([1.0, 1.0, 0.0, 0.0]), groups)  # groups differ from each other only
    assert has_signal(torch.tensor([1.0, 0.0, 0.0, 0.0]), groups)
    singles = torch.tensor([0, 1, 2])
    assert has_signal(torch.tensor([1.0, 0.0, 0.0]), singles)  # n = 1: the batch is the comparison
    assert not has_signal(torch.tensor([0.5, 0.5, 0.5]), singles)


def test_max_no_signal_steps_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.max_no_signal_steps must be >= 0"):
        load_config(None, ["trainer.max_no_signal_steps=-1"])
