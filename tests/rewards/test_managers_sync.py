"""The in-process managers (batch, dapo), the submit/result interface and the shared options."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from typing import Any

import pytest

from queryrl.config import RewardConfig
from queryrl.rewards import (
    MANAGER_OPTIONS,
    REWARD_MANAGERS,
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    PendingRewards,
    RewardError,
    RewardInput,
    RewardResult,
    default_compute_score,
    make_reward_manager,
    overlong_penalty,
    summarize,
)


def inputs(*solutions: str, lengths: list[int] | None = None) -> list[RewardInput]:
    lengths = lengths or [0] * len(solutions)
    return [RewardInput("src", s, "a", {"i": i}, n) for i, (s, n) in enumerate(zip(solutions, lengths, strict=True))]


def test_reward_input_keeps_its_old_positional_form() -> None:
    x = RewardInput("src", "response", "truth", {"k": 1})
    assert x.response_length == 0


def test_naive_submit_is_done_at_once() -> None:
    with NaiveRewardManager(lambda solution_str, **kw: float(solution_str == "a")) as manager:
        pending = manager.submit(inputs("a", "b"))
        assert pending.done()
        assert len(pending) == 2
        assert [r.score for r in pending.result()] == [1.0, 0.0]
        assert manager.pop_metrics() == {}


# -- batch -------------------------------------------------------------------------------------


class BatchFn:
    """A batch reward function that records its calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        data_sources: list[str],
        solution_strs: list[str],
        ground_truths: list[str],
        extra_infos: list[dict[str, Any]],
        bonus: float = 0.0,
    ) -> list[Any]:
        self.calls.append({"data_sources": data_sources, "extra_infos": extra_infos})
        out: list[Any] = []
        for s, g in zip(solution_strs, ground_truths, strict=True):
            if s == "dict":
                out.append({"score": 0.5, "acc": 1.0})
            elif s == "none":
                out.append(None)
            else:
                out.append(float(s == g) + bonus)
        return out


def test_batch_calls_the_batch_form_once_per_call() -> None:
    fn = BatchFn()
    manager = BatchRewardManager(fn, {"bonus": 0.25})
    results = manager.score(inputs("a", "b", "dict", "none"))
    assert [r.score for r in results] == [1.25, 0.25, 0.5, None]
    assert results[2].extra == {"acc": 1.0}
    assert results[3].error is not None
    assert "score is None" in results[3].error  # one bad item fails alone, through to_result
    assert len(fn.calls) == 1
    assert fn.calls[0]["data_sources"] == ["src"] * 4
    assert fn.calls[0]["extra_infos"][1] == {"i": 1}
    manager.score(inputs("a"))
    assert len(fn.calls) == 2
    assert manager.score([]) == []
    assert len(fn.calls) == 2  # nothing to score: no call


def test_batch_wrong_length_fails_every_sample() -> None:
    results = BatchRewardManager(lambda **kw: [1.0, 1.0]).score(inputs("a", "b", "c"))
    assert all(r.failed for r in results)
    assert all("returned 2 values for 3 inputs" in (r.error or "") for r in results)


def test_batch_exception_fails_every_sample() -> None:
    def fn(**kw: Any) -> list[float]:
        raise RuntimeError("verifier down")

    results = BatchRewardManager(fn).score(inputs("a", "b"))
    assert [r.score for r in results] == [None, None]
    assert all("batch reward function raised RuntimeError: verifier down" in (r.error or "") for r in results)
    assert summarize(results)["reward/failed"] == 2.0


def test_batch_not_a_list_fails_every_sample() -> None:
    results = BatchRewardManager(lambda **kw: 1.0).score(inputs("a", "b"))
    assert all("TypeError" in (r.error or "") for r in results)


def test_batch_async_function() -> None:
    async def fn(solution_strs: list[str], **kw: Any) -> list[float]:
        return [float(len(s)) for s in solution_strs]

    with BatchRewardManager(fn) as manager:
        assert [r.score for r in manager.score(inputs("a", "bbb"))] == [1.0, 3.0]


# -- dapo --------------------------------------------------------------------------------------


def test_overlong_penalty_hand_worked() -> None:
    # L = 20, B = 4: expected length L - B = 16; the penalty falls from 0 at 16 to -factor at 20
    assert overlong_penalty(10, 20, 4, 1.0) == 0.0  # exceed = -6: min(6/4, 0) = 0
    assert overlong_penalty(16, 20, 4, 1.0) == 0.0  # exceed = 0
    assert overlong_penalty(17, 20, 4, 1.0) == -0.25  # exceed = 1: -1/4
    assert overlong_penalty(18, 20, 4, 1.0) == -0.5  # exceed = 2: -2/4
    assert overlong_penalty(20, 20, 4, 1.0) == -1.0  # exceed = 4: -4/4
    assert overlong_penalty(18, 20, 4, 0.5) == -0.25  # -2/4 * 0.5
    assert overlong_penalty(20, 20, 0, 1.0) == 0.0  # B = 0: off


def test_dapo_adds_the_penalty_and_reports_verl_extras() -> None:
    manager = make_reward_manager(
        "dapo",
        lambda solution_str, **kw: 1.0 if solution_str == "a" else -1.0,
        overlong_buffer_len=4,
        overlong_penalty_factor=0.5,
        max_response_length=20,
    )
    results = manager.score(inputs("a", "a", "b", "a", lengths=[10, 18, 18, 20]))
    # scores 1, 1, -1, 1; penalties (factor 0.5) 0, -0.25, -0.25, -0.5
    assert [r.score for r in results] == [1.0, 0.75, -1.25, 0.5]
    assert [r.extra["acc"] for r in results] == [1.0, 1.0, -1.0, 1.0]  # the unpenalised score
    assert [r.extra["overlong_reward"] for r in results] == [0.0, -0.25, -0.25, -0.5]
    assert [r.extra["overlong"] for r in results] == [0.0, 1.0, 1.0, 1.0]
    assert summarize(results)["reward/overlong_reward/mean"] == pytest.approx(-0.25)  # -1 / 4


def test_dapo_keeps_the_functions_acc_and_leaves_failures_failed() -> None:
    def fn(solution_str: str, **kw: Any) -> Any:
        return None if solution_str == "bad" else {"score": -1.0, "acc": 0.0}

    manager = DAPORewardManager(fn, overlong_buffer_len=2, max_response_length=10)
    good, bad = manager.score(inputs("x", "bad", lengths=[9, 10]))
    assert good.score == -1.5  # exceed = 9 - 8 = 1: -1/2
    assert good.extra["acc"] == 0.0  # the function's own acc, as in verl
    assert bad.failed
    assert bad.extra == {}


def test_dapo_without_a_buffer_is_the_plain_score() -> None:
    (result,) = DAPORewardManager(lambda **kw: 1.0).score(inputs("x", lengths=[10_000]))
    assert result == RewardResult(score=1.0, extra={"acc": 1.0})


def test_dapo_needs_max_response_length() -> None:
    with pytest.raises(RewardError, match="max_response_length"):
        DAPORewardManager(lambda **kw: 1.0, overlong_buffer_len=4)


def test_dapo_warns_when_lengths_are_missing(caplog: pytest.LogCaptureFixture) -> None:
    manager = DAPORewardManager(lambda **kw: 1.0, overlong_buffer_len=4, max_response_length=20)
    results = manager.score(inputs("a", "b"))
    assert [r.score for r in results] == [1.0, 1.0]
    assert "response_length is 0" in caplog.text


# -- options and the handle ----------------------------------------------------------------------


def all_options() -> dict[str, Any]:
    """RewardConfig's manager settings, as the trainer passes them."""
    # max_failed_frac, max_skipped_steps and drop_failed_groups are the trainer's step policy, not manager settings;
    # multi_objective_aggregation belongs with functions (how they combine)
    fields = {f.name for f in dataclasses.fields(RewardConfig)} - {
        "manager",
        "function",
        "functions",
        "multi_objective_aggregation",
        "kwargs",
        "max_failed_frac",
        "max_skipped_steps",
        "drop_failed_groups",
    }
    options = {name: getattr(RewardConfig(), name) for name in fields}
    options |= {"max_response_length": 64, "overlong_buffer_len": 8}
    return options


def test_manager_options_are_the_reward_config_fields() -> None:
    assert set(all_options()) == MANAGER_OPTIONS


@pytest.mark.parametrize("name", REWARD_MANAGERS.names())
def test_every_manager_takes_every_option(name: str) -> None:
    if name == "batch":
        fn: Any = lambda solution_strs, **kw: [1.0] * len(solution_strs)  # noqa: E731
    else:
        fn = default_compute_score  # importable by name, so the parallel workers can load it
    with make_reward_manager(name, fn, {}, **all_options()) as manager:
        (result,) = manager.score([RewardInput("openai/gsm8k", "#### 7", "7", {}, 3)])
        assert result.score == 1.0
        assert isinstance(manager.pop_metrics(), dict)


@pytest.mark.parametrize("name", ["naive", "batch", "dapo", "parallel", "async"])
def test_unknown_option_is_an_error(name: str) -> None:
    with pytest.raises(RewardError, match=r"unknown option\(s\) num_wokers"):
        make_reward_manager(name, default_compute_score, num_wokers=4)


def test_pending_rewards_waits_and_names_cancelled_samples() -> None:
    done: Future[RewardResult] = Future()
    done.set_result(RewardResult(score=1.0))
    running: Future[RewardResult] = Future()
    pending = PendingRewards([done, running], ["a", "b"])
    assert not pending.done()
    with pytest.raises(TimeoutError, match="1 of 2 rewards not done"):
        pending.result(timeout=0.01)
    running.cancel()
    assert pending.done()
    first, second = pending.result()
    assert first.score == 1.0
    assert second.failed
    assert "data_source='b'" in (second.error or "")
    assert "closed" in (second.error or "")
