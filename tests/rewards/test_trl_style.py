"""TRL-style reward functions (``fn(prompts, completions, **kwargs) -> list[float | None]``) under queryrl.

The functions below are written in the spirit of the examples in TRL's GRPOTrainer documentation
("Using a custom reward function": a length reward, a format reward over conversational completions,
an accuracy reward against a solution column that returns None where there is none).
"""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from queryrl.config import ConfigError, load_config
from queryrl.data.records import TextPrompt, load_records
from queryrl.rewards import RewardError, RewardInput, load_reward_function, make_reward_manager
from queryrl.rewards.trl_style import TrainerState, TRLRewardFunction, is_trl_style, with_style
from queryrl.trainer.loop import Trainer
from queryrl.trainer.preflight import check_reward, config_reward_spec
from tests.helpers import make_cfg, metrics_of, params

CHAT_PROMPT = [{"role": "system", "content": "Think, then answer."}, {"role": "user", "content": "2 + 3?"}]


def reward_len(completions: list[str], **kwargs: Any) -> list[float]:
    """TRL's docs: prefer completions of 20 characters (plain-text completions)."""
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward(completions: list[list[dict[str, str]]], **kwargs: Any) -> list[float]:
    """TRL's docs: 1 when the conversational completion is ``<think>...</think><answer>...</answer>``."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(pattern, content) else 0.0 for content in contents]


def accuracy_reward(completions: list[Any], ground_truth: list[Any], **kwargs: Any) -> list[float | None]:
    """TRL's accuracy reward in spirit: the answer against the reference; None where there is no reference."""
    rewards: list[float | None] = []
    for completion, truth in zip(completions, ground_truth, strict=True):
        if truth is None:
            rewards.append(None)  # not applicable: a failed sample, never 0
            continue
        answer = re.search(r"<answer>(.*?)</answer>", completion[0]["content"])
        rewards.append(float(answer is not None and answer.group(1).strip() == str(truth)))
    return rewards


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """A verl-style function (for the detection)."""
    return float(solution_str == ground_truth)


def chat_input(text: str, truth: Any, **row: Any) -> RewardInput:
    """The input the trainer makes for a verl-layout row with a chat prompt."""
    full_row = {
        "data_source": "my/math",
        "prompt": CHAT_PROMPT,
        "reward_model": {"ground_truth": truth},
        "extra_info": {"index": 0},
    } | row
    return RewardInput("my/math", text, truth, {"index": 0}, row=full_row, completion_ids=[5, 6, 7], step=3)


GOOD = "<think>2 plus 3</think><answer>5</answer>"


# -- detection ------------------------------------------------------------------------------------


def test_auto_detection_both_ways() -> None:
    def prompts_first(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]]) -> list[float]:
        return [0.0] * len(completions)

    def verl_with_kwargs(data_source: str, solution_str: str, completions: Any = None, **kwargs: Any) -> float:
        return 0.0

    def verl_batch(data_sources: list[str], solution_strs: list[str], **kwargs: Any) -> list[float]:
        return [0.0] * len(solution_strs)

    for fn in (reward_len, format_reward, accuracy_reward, prompts_first):
        assert is_trl_style(fn), fn.__name__
    for fn in (compute_score, verl_with_kwargs, verl_batch, print):
        assert not is_trl_style(fn), getattr(fn, "__name__", fn)
    assert isinstance(with_style(reward_len, "auto"), TRLRewardFunction)
    assert with_style(compute_score, "auto") is compute_score
    assert with_style(reward_len, "verl") is reward_len  # forced
    assert isinstance(with_style(compute_score, "trl"), TRLRewardFunction)  # forced
    with pytest.raises(RewardError, match=r"reward\.function\.style must be one of auto, verl, trl"):
        with_style(reward_len, "hf")


def test_loading_from_a_file_detects_the_style(tmp_path: Path) -> None:
    path = tmp_path / "my_rewards.py"
    path.write_text(
        "def length(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    trl = load_reward_function(str(path), "length")
    assert isinstance(trl, TRLRewardFunction)
    assert trl.name == f"{path}:length"  # errors name the file and the function
    assert not isinstance(load_reward_function(str(path), "compute_score"), TRLRewardFunction)
    assert not isinstance(load_reward_function(str(path), "length", "verl"), TRLRewardFunction)
    with pytest.raises(RewardError, match="style=trl needs a function of yours"):
        load_reward_function(None, style="trl")


def test_the_config_refuses_an_unknown_style() -> None:
    with pytest.raises(ConfigError, match=r"reward\.function\.style='hf' is not one of: auto, verl, trl"):
        load_config(None, ["reward.function.style=hf"])


# -- what the function gets -----------------------------------------------------------------------


def test_the_call_gets_prompts_completions_ids_columns_and_the_step() -> None:
    seen: dict[str, Any] = {}

    def spy(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        seen.update(kwargs, prompts=prompts, completions=completions)
        return [1.0] * len(completions)

    inputs = [chat_input(GOOD, "5", solution="five"), chat_input("x", None)]
    with make_reward_manager("naive", with_style(spy, "auto"), {"weight": 2}) as manager:
        assert [r.score for r in manager.score(inputs)] == [1.0, 1.0]
    assert seen["prompts"] == [CHAT_PROMPT, CHAT_PROMPT]
    assert seen["completions"] == [[{"role": "assistant", "content": GOOD}], [{"role": "assistant", "content": "x"}]]
    assert seen["completion_ids"] == [[5, 6, 7], [5, 6, 7]]
    assert seen["ground_truth"] == ["5", None]  # from reward_model.ground_truth
    assert seen["solution"] == ["five", None]  # a column only one row has: None for the other
    assert seen["data_source"] == ["my/math", "my/math"]
    assert seen["extra_info"] == [{"index": 0}, {"index": 0}]
    assert seen["reward_model"] == [{"ground_truth": "5"}, {"ground_truth": None}]
    assert seen["trainer_state"] == TrainerState(global_step=3)
    assert seen["weight"] == 2  # reward.kwargs
    assert "prompt" not in seen


@pytest.mark.parametrize("manager_name", ["naive", "async", "batch"])
def test_log_metric_and_log_extra_reach_the_metrics_and_the_samples(manager_name: str) -> None:
    """TRL 1.16 passes both; a function that called them got a TypeError here before."""
    from queryrl.trainer.scoring import reward_side_metrics

    def logs(completions: list[Any], log_metric: Any, log_extra: Any, **kwargs: Any) -> list[float]:
        lengths = [float(len(c[0]["content"])) for c in completions]
        log_metric("mean_length", sum(lengths) / len(lengths))
        log_extra("length", lengths)
        return [1.0] * len(completions)

    inputs = [chat_input("ab", "5"), chat_input("abcd", "5")]
    with make_reward_manager(manager_name, with_style(logs, "auto")) as manager:
        results = manager.score(inputs)
        metrics = reward_side_metrics(manager)
    assert [r.info.get("length") for r in results] == [2.0, 4.0]
    assert metrics["mean_length"] == 3.0
    state = TrainerState(global_step=2, max_steps=10, epoch=0.5, num_train_epochs=1)
    assert (state.max_steps, state.epoch, state.log_history) == (10, 0.5, ())


def test_plain_completions_without_prompt_messages_and_no_state_without_a_step() -> None:
    inputs = [RewardInput("toy", "a" * n, None) for n in (20, 15, 26)]
    with make_reward_manager("naive", with_style(reward_len, "auto")) as manager:
        assert [r.score for r in manager.score(inputs)] == [0.0, -5.0, -6.0]
    kwargs = TRLRewardFunction(reward_len).call_kwargs(inputs, {})
    assert kwargs["completions"] == ["a" * 20, "a" * 15, "a" * 26]
    assert kwargs["prompts"] == [None, None, None]
    assert kwargs["trainer_state"] is None


def test_string_prompts_in_the_data_give_plain_prompts_and_completions(tmp_path: Path) -> None:
    data = tmp_path / "plain.jsonl"
    rows = [{"prompt": f"Count to {n}:", "data_source": "plain", "reward_model": {"ground_truth": n}} for n in (3, 4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_records(data)
    # the policy is prompted with one user message; the string is kept for TRL-style functions
    assert loaded[0]["prompt"] == [{"role": "user", "content": "Count to 3:"}]
    assert isinstance(loaded[0]["prompt"], TextPrompt)
    again = pickle.loads(pickle.dumps(loaded[0]))  # Ray workers and reward processes get rows pickled
    assert isinstance(again["prompt"], TextPrompt)
    assert again["prompt"].text == "Count to 3:"
    assert json.loads(json.dumps(loaded[0]["prompt"])) == [{"role": "user", "content": "Count to 3:"}]
    inputs = [
        RewardInput("plain", "1 2 3" + "x" * k, r["reward_model"]["ground_truth"], row=r) for k, r in enumerate(loaded)
    ]
    kwargs = TRLRewardFunction(reward_len).call_kwargs(inputs, {})
    assert kwargs["prompts"] == ["Count to 3:", "Count to 4:"]
    assert kwargs["completions"] == ["1 2 3", "1 2 3x"]
    with make_reward_manager("naive", with_style(reward_len, "auto")) as manager:
        assert [r.score for r in manager.score(inputs)] == [-15.0, -14.0]
    # a batch that mixes the two forms is conversational, as TRL decides by the first example's format
    mixed = TRLRewardFunction(reward_len).call_kwargs([inputs[0], chat_input("y", None)], {})
    assert mixed["prompts"] == [[{"role": "user", "content": "Count to 3:"}], CHAT_PROMPT]
    assert mixed["completions"][0] == [{"role": "assistant", "content": "1 2 3"}]


# -- managers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("manager_name", ["naive", "batch", "dapo", "async"])
def test_one_call_per_batch_and_none_is_an_unscored_sample(manager_name: str) -> None:
    calls: list[int] = []

    def accuracy(completions: list[Any], ground_truth: list[Any], **kwargs: Any) -> list[float | None]:
        calls.append(len(completions))
        return accuracy_reward(completions, ground_truth)

    inputs = [chat_input(GOOD, "5"), chat_input(GOOD, None), chat_input("<answer>4</answer>", "5")]
    with make_reward_manager(manager_name, with_style(accuracy, "auto")) as manager:
        results = manager.score(inputs)
    assert calls == [3]
    assert results[0].score == 1.0
    assert results[2].score == 0.0
    # TRL 1.16: None is "not scored", not a failure: NaN reward, kept, no error
    assert results[1].unscored
    assert not results[1].failed
    assert results[1].error is None
    assert math.isnan(results[1].score or 0.0)
    if manager_name == "dapo":
        assert results[0].extra == {"acc": 1.0}  # dapo's extras apply to the scored samples
    nan = TRLRewardFunction(accuracy).results([float("nan"), None], inputs[:2])
    assert [r.unscored for r in nan] == [True, True]  # NaN is what TRL makes of None


@pytest.mark.parametrize("manager_name", ["naive", "async"])
def test_an_async_trl_function(manager_name: str) -> None:
    async def format_async(completions: list[Any], **kwargs: Any) -> list[float]:
        await asyncio.sleep(0)
        return format_reward(completions)

    inputs = [chat_input(GOOD, "5"), chat_input("no tags", "5")]
    with make_reward_manager(manager_name, with_style(format_async, "auto")) as manager:
        assert [r.score for r in manager.score(inputs)] == [1.0, 0.0]


def test_the_async_manager_retries_the_batch_call() -> None:
    attempts: list[int] = []

    def flaky(completions: list[Any], **kwargs: Any) -> list[float]:
        attempts.append(len(completions))
        if len(attempts) == 1:
            raise ConnectionError("judge unreachable")
        return [1.0] * len(completions)

    with make_reward_manager("async", with_style(flaky, "auto"), max_retries=1, backoff_s=0.0) as manager:
        assert [r.score for r in manager.score([chat_input("a", "5"), chat_input("b", "5")])] == [1.0, 1.0]
        assert manager.pop_metrics()["reward/retries"] == 1.0
    assert attempts == [2, 2]


def test_the_parallel_manager_refuses_a_trl_function_when_built() -> None:
    with pytest.raises(RewardError, match=r"reward\.manager=parallel scores one sample per worker process.*TRL-style"):
        make_reward_manager("parallel", with_style(reward_len, "auto"))


# -- bad returns: one error naming the function ---------------------------------------------------


@pytest.mark.parametrize("manager_name", ["naive", "batch", "async"])
@pytest.mark.parametrize(
    ("returned", "reason"),
    [
        ([1.0], "returned 1 values for 2 completions"),
        ([1.0, "high"], "returned 'high' (str) for completion 1: expected a number or None"),
        (0.5, "returned float, not a list of numbers"),
    ],
)
def test_a_bad_return_fails_every_sample_with_one_error(manager_name: str, returned: Any, reason: str) -> None:
    def broken(prompts: list[Any], completions: list[Any], **kwargs: Any) -> Any:
        return returned

    with make_reward_manager(manager_name, with_style(broken, "auto")) as manager:
        results = manager.score([chat_input("a", "5"), chat_input("b", "5")])
    assert all(r.failed for r in results)
    assert {r.error for r in results} == {
        f"reward for data_source='my/math' failed: TRL-style reward function "
        f"{__name__}.test_a_bad_return_fails_every_sample_with_one_error.<locals>.broken {reason}"
    }


def test_an_exception_stops_nan_is_unscored_and_a_kwarg_clash_fails() -> None:
    def raises(completions: list[Any], **kwargs: Any) -> list[float]:
        raise KeyError("solution")

    def nan(completions: list[Any], **kwargs: Any) -> list[float]:
        return [float("nan"), 1.0]

    inputs = [chat_input("a", "5"), chat_input("b", "5")]
    with make_reward_manager("naive", with_style(raises, "auto")) as manager:
        raised = manager.score(inputs)
    assert all("raised KeyError: 'solution'" in str(r.error) and r.stop for r in raised)  # TRL raises: the run stops
    with make_reward_manager("naive", with_style(nan, "auto")) as manager:
        scored = manager.score(inputs)
    assert [r.unscored for r in scored] == [True, False]
    assert scored[1].score == 1.0
    with make_reward_manager("naive", with_style(reward_len, "auto"), {"ground_truth": "x"}) as manager:
        results = manager.score(inputs)
    assert all("reward.kwargs ground_truth" in str(r.error) for r in results)


# -- a real run -----------------------------------------------------------------------------------

TRL_REWARD_FILE = '''
import json
import re


def similarity(prompts, completions, completion_ids, ground_truth, trainer_state, log, **kwargs):
    """Characters of the reference the reply contains, in the spirit of TRL's examples (conversational)."""
    with open(log, "a") as f:
        f.write(json.dumps({"step": trainer_state and trainer_state.global_step, "n": len(completions),
                            "max_steps": trainer_state.max_steps, "epoch": trainer_state.epoch,
                            "epochs": trainer_state.num_train_epochs, "history": list(trainer_state.log_history),
                            "role": completions[0][0]["role"], "prompt_role": prompts[0][-1]["role"],
                            "ids": all(isinstance(i, int) for ids in completion_ids for i in ids)}) + "\\n")
    return [len(set(c[0]["content"]) & set(t)) / len(set(t)) for c, t in zip(completions, ground_truth)]
'''


@pytest.mark.slow
def test_a_grpo_run_with_a_trl_style_reward_file(tmp_path: Path, model_cache: Path) -> None:
    reward = tmp_path / "trl_reward.py"
    reward.write_text(textwrap.dedent(TRL_REWARD_FILE))
    log = tmp_path / "calls.jsonl"
    cfg = make_cfg(
        tmp_path,
        model_cache,
        f"reward.function.path={reward}",
        "reward.function.name=similarity",
        f"+reward.kwargs.log={log}",
        "data.val_files=[builtin://toy_target_string/val]",
        "data.max_val_samples=4",
        "rollout.micro_batch_size=6",  # generation chunks of 6 split the groups of 4: the call must not
    )
    # queryrl train's preflight loads it and does not call it (TRL makes no such call)
    assert "not called before training" in check_reward(cfg, config_reward_spec(cfg))
    assert not log.exists()
    with Trainer(cfg) as trainer:
        assert isinstance(trainer.c.reward.fn, TRLRewardFunction)
        per_epoch = len(trainer.c.loader)
        before = params(trainer.c.policy.model)
        trainer.fit()
        after = params(trainer.c.policy.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {c["step"] for c in calls} == {1, 2}  # validation at the end sees the step too, as in TRL
    # TRL's TrainerState fields: the run's length and where it stands (epochs done, at the step's start)
    assert {(c["max_steps"], c["epochs"], c["history"] == []) for c in calls} == {(2, 1, True)}
    assert sorted({c["epoch"] for c in calls}) == [0.0, 1 / per_epoch]
    # one call per step on all 4 x 4 samples (TRL: one per generation batch), then the 4 validation prompts
    assert [c["n"] for c in calls] == [16, 16, 4]
    assert all(c["role"] == "assistant" and c["prompt_role"] == "user" and c["ids"] for c in calls)
    rows = metrics_of(tmp_path / "toy_grpo")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/failed"] == 0.0 and 0.0 <= r["critic/score/mean"] <= 1.0 for r in rows)


PLAIN_REWARD_FILE = """
import json


def short(prompts, completions, log, **kwargs):
    with open(log, "a") as f:
        f.write(json.dumps({"prompt": prompts[0], "completion": completions[0]}) + "\\n")
    return [-abs(20 - len(c)) / 20 for c in completions]
"""


@pytest.mark.slow
def test_a_run_on_string_prompts_gives_a_trl_function_strings(tmp_path: Path, model_cache: Path) -> None:
    data = tmp_path / "plain.jsonl"
    rows = [{"prompt": f"Say hello {n} times.", "data_source": "plain"} for n in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward = tmp_path / "plain_reward.py"
    reward.write_text(PLAIN_REWARD_FILE)
    log = tmp_path / "calls.jsonl"
    cfg = make_cfg(
        tmp_path,
        model_cache,
        f"data.train_files=[{data}]",
        f"reward.function.path={reward}",
        "reward.function.name=short",
        f"+reward.kwargs.log={log}",
        "trainer.total_steps=1",
    )
    with Trainer(cfg) as trainer:
        trainer.fit()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls
    assert all(isinstance(c["completion"], str) and c["prompt"].startswith("Say hello") for c in calls)
