"""Several TRL-style functions with weights (``reward.functions``), combined as TRL's GRPOTrainer combines
``reward_funcs`` with ``reward_weights``: the weighted sum of the functions that scored a sample."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from queryrl.config import ConfigError, load_config
from queryrl.rewards import RewardError, RewardInput, make_reward_manager
from queryrl.rewards.loading import load_weighted_functions
from queryrl.rewards.trl_style import WeightedTRLRewards
from queryrl.trainer.loop import Trainer
from queryrl.trainer.plan import build_plan
from queryrl.trainer.preflight import check_reward, config_reward_spec
from tests.helpers import make_cfg, metrics_of

REWARDS = '''
import asyncio
import re


def format_reward(completions, **kwargs):
    """1 when the reply is <think>...</think><answer>...</answer> (TRL's docs, conversational)."""
    return [1.0 if re.match(r"^<think>.*?</think><answer>.*?</answer>$", c[0]["content"]) else 0.0 for c in completions]


async def accuracy_reward(completions, ground_truth, **kwargs):
    """The answer against the reference; None where there is none (not applicable)."""
    await asyncio.sleep(0)
    out = []
    for c, truth in zip(completions, ground_truth):
        m = re.search(r"<answer>(.*?)</answer>", c[0]["content"])
        out.append(None if truth is None else float(m is not None and m.group(1) == str(truth)))
    return out


def none_reward(completions, **kwargs):
    return [None] * len(completions)


def broken_reward(completions, **kwargs):
    raise ValueError("no model")


def short_list(completions, **kwargs):
    return [1.0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
'''

CHAT_PROMPT = [{"role": "user", "content": "2 + 3?"}]
GOOD = "<think>2 plus 3</think><answer>5</answer>"


def chat_input(text: str, truth: Any) -> RewardInput:
    row = {"data_source": "my/math", "prompt": CHAT_PROMPT, "reward_model": {"ground_truth": truth}}
    return RewardInput("my/math", text, truth, {}, row=row, completion_ids=[1, 2], step=1)


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(REWARDS))
    return path


def entries(path: Path, *named: tuple[str, float]) -> list[dict[str, Any]]:
    return [{"path": str(path), "name": name, "style": "auto", "weight": weight} for name, weight in named]


@pytest.mark.parametrize("manager_name", ["naive", "batch", "dapo", "async"])
def test_weighted_sum_of_the_functions_that_scored(rewards_file: Path, manager_name: str) -> None:
    fn = load_weighted_functions(entries(rewards_file, ("format_reward", 0.5), ("accuracy_reward", 2.0)))
    assert isinstance(fn, WeightedTRLRewards)
    inputs = [chat_input(GOOD, "5"), chat_input(GOOD, None), chat_input("<answer>4</answer>", "5")]
    with make_reward_manager(manager_name, fn) as manager:
        results = manager.score(inputs)
    # 0.5 * format + 2 * accuracy; accuracy's None (no reference) leaves it out (TRL's nansum)
    assert [r.score for r in results] == [2.5, 0.5, 0.0]
    assert results[0].extra["format_reward"] == 1.0
    assert results[0].extra["accuracy_reward"] == 1.0
    assert "accuracy_reward" not in results[1].extra  # the step's reward/accuracy_reward/mean is over 2 samples


def test_a_sample_no_function_scored_is_unscored(rewards_file: Path) -> None:
    fn = load_weighted_functions(entries(rewards_file, ("none_reward", 1.0), ("accuracy_reward", 1.0)))
    with make_reward_manager("naive", fn) as manager:
        results = manager.score([chat_input(GOOD, None), chat_input(GOOD, "5")])
    assert results[0].unscored
    assert not results[0].failed
    assert results[1].score == 1.0


@pytest.mark.parametrize(
    ("name", "message"),
    [("broken_reward", "broken_reward raised ValueError: no model"), ("short_list", "returned 1 values for 2")],
)
def test_a_broken_function_fails_the_batch_naming_it(rewards_file: Path, name: str, message: str) -> None:
    fn = load_weighted_functions(entries(rewards_file, ("format_reward", 1.0), (name, 1.0)))
    with make_reward_manager("naive", fn) as manager:
        results = manager.score([chat_input(GOOD, "5"), chat_input(GOOD, "5")])
    assert all(r.failed and r.stop for r in results)  # TRL raises: the run stops, naming the function
    assert message in str(results[0].error)
    assert f"{rewards_file}:{name}" in str(results[0].error)


def test_loading_refuses_verl_style_and_duplicate_names_get_labels(rewards_file: Path) -> None:
    with pytest.raises(RewardError, match=r"reward.functions\[1\] .*compute_score\) is verl-style"):
        load_weighted_functions(entries(rewards_file, ("format_reward", 1.0), ("compute_score", 1.0)))
    twice = load_weighted_functions(entries(rewards_file, ("format_reward", 1.0), ("format_reward", 3.0)))
    assert [label for _, _, label in twice.members] == ["format_reward", "format_reward_1"]
    result = asyncio.run(twice._call_all(completions=[[{"role": "assistant", "content": GOOD}]]))
    assert twice.results(result, [chat_input(GOOD, "5")])[0].score == 4.0
    with pytest.raises(RewardError, match="needs a path"):
        load_weighted_functions([{"name": "f"}])


def test_config_checks() -> None:
    with pytest.raises(ConfigError, match="both set"):
        load_config(None, ["reward.functions=[{path: a.py, name: f}]", "reward.function.path=b.py"])
    with pytest.raises(ConfigError, match=r"reward.functions\[0\] needs a path"):
        load_config(None, ["reward.functions=[{name: f}]"])


@pytest.mark.slow
def test_a_grpo_run_with_two_weighted_functions(rewards_file: Path, tmp_path: Path, model_cache: Path) -> None:
    functions = (
        f"reward.functions=[{{path: {rewards_file}, name: format_reward, weight: 0.5}},"
        f" {{path: {rewards_file}, name: accuracy_reward, weight: 2.0}}]"
    )
    cfg = make_cfg(tmp_path, model_cache, functions, "trainer.total_steps=2")
    spec = config_reward_spec(cfg)
    assert "not called before training" in check_reward(cfg, spec)  # queryrl train's preflight: loaded only
    plan = build_plan(cfg).render()
    assert f"functions 0.5 x {rewards_file}:format_reward + 2 x {rewards_file}:accuracy_reward" in plan
    with Trainer(cfg) as trainer:
        assert isinstance(trainer.c.reward.fn, WeightedTRLRewards)
        trainer.fit()
    rows = metrics_of(tmp_path / "toy_grpo")
    assert [r["step"] for r in rows] == [1, 2]
    assert all("reward/format_reward/mean" in r and "reward/accuracy_reward/mean" in r for r in rows)
    samples = [json.loads(x) for x in (tmp_path / "toy_grpo" / "samples" / "step_2.jsonl").read_text().splitlines()]
    assert all(set(s["reward_parts"]) == {"format_reward", "accuracy_reward"} for s in samples if not s.get("failed"))
