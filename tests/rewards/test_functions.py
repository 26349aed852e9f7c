"""Routing to the built-in scorers and loading a reward function from a file."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from queryrl.rewards import RewardError, default_compute_score, load_reward_function


def write(path: Path, source: str) -> str:
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_routes_gsm8k_by_both_names() -> None:
    for source in ("openai/gsm8k", "gsm8k"):
        assert default_compute_score(source, "#### 1,234", "1234") == 1.0
        assert default_compute_score(source, "#### 5", "1234") == 0.0


def test_gsm8k_is_strict_unless_kwargs_say_otherwise() -> None:
    assert default_compute_score("gsm8k", "the answer is 12", "12") == 0.0
    assert default_compute_score("gsm8k", "the answer is 12", "12", method="flexible") == 1.0


def test_routes_toy() -> None:
    assert default_compute_score("toy/target_string", " abce ", "abcd") == pytest.approx(0.75)


def test_a_kwarg_the_scorer_does_not_take_is_an_error() -> None:
    with pytest.raises(TypeError):
        default_compute_score("toy/target_string", "a", "a", method="flexible")


def test_unknown_data_source_says_how_to_use_a_custom_file() -> None:
    with pytest.raises(RewardError) as info:
        default_compute_score("my/dataset", "x", "y")
    message = str(info.value)
    assert "'my/dataset'" in message
    for known in ("openai/gsm8k", "gsm8k", "toy/target_string"):
        assert known in message
    assert "reward.function.path=my_reward.py reward.function.name=compute_score" in message
    assert "custom_reward_function.path" in message
    assert isinstance(info.value, ValueError)


def test_no_path_means_the_built_ins() -> None:
    assert load_reward_function(None) is default_compute_score
    assert load_reward_function("") is default_compute_score


def test_load_sync_function(tmp_path: Path) -> None:
    path = write(
        tmp_path / "my_reward.py",
        """
        from dataclasses import dataclass  # a dataclass needs the module in sys.modules

        @dataclass
        class Weights:
            hit: float = 2.0

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return Weights().hit if solution_str == ground_truth else 0.0
        """,
    )
    fn = load_reward_function(path)
    assert fn("any", "a", "a") == 2.0
    assert fn("any", "a", "b") == 0.0


def test_load_async_function_with_another_name(tmp_path: Path) -> None:
    path = write(
        tmp_path / "judge.py",
        """
        import asyncio

        async def judge(data_source, solution_str, ground_truth, extra_info=None):
            await asyncio.sleep(0)
            return {"score": 1.0, "acc": 1.0}
        """,
    )
    fn = load_reward_function(path, "judge")
    assert asyncio.run(fn("any", "a", "a")) == {"score": 1.0, "acc": 1.0}


def test_two_files_with_the_same_name_do_not_clash(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fa = load_reward_function(write(tmp_path / "a" / "reward.py", "def compute_score(**kw):\n    return 1.0\n"))
    fb = load_reward_function(write(tmp_path / "b" / "reward.py", "def compute_score(**kw):\n    return 2.0\n"))
    assert (fa(), fb()) == (1.0, 2.0)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RewardError, match=r"'nope\.py' not found"):
        load_reward_function("nope.py")


def test_not_a_python_file(tmp_path: Path) -> None:
    path = write(tmp_path / "reward.txt", "def compute_score(**kw):\n    return 1.0\n")
    with pytest.raises(RewardError, match=r"\.py file"):
        load_reward_function(path)


def test_syntax_error_carries_the_original_error(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.py", "def compute_score(:\n    return 1\n")
    with pytest.raises(RewardError, match=r"broken\.py.*failed to import: SyntaxError"):
        load_reward_function(path)


def test_error_at_import_carries_the_original_error(tmp_path: Path) -> None:
    path = write(tmp_path / "needs.py", "import not_a_module_anyone_has\n")
    with pytest.raises(RewardError, match=r"ModuleNotFoundError.*not_a_module_anyone_has"):
        load_reward_function(path)


def test_missing_function_lists_what_the_file_has(tmp_path: Path) -> None:
    path = write(tmp_path / "r.py", "def score_it(**kw):\n    return 1.0\n")
    with pytest.raises(RewardError, match=r"no 'compute_score'; callables it defines: score_it"):
        load_reward_function(path)


def test_attribute_that_is_not_callable(tmp_path: Path) -> None:
    path = write(tmp_path / "r.py", "compute_score = 1.0\n")
    with pytest.raises(RewardError, match="is a float, not a function"):
        load_reward_function(path)


def test_importable_module_path() -> None:
    from queryrl.apps.query_rewrite import reward

    assert load_reward_function("queryrl.apps.query_rewrite.reward", "compute_score") is reward.compute_score
    assert load_reward_function("queryrl.apps.query_rewrite.reward.score", "compute_score") is reward.compute_score
    assert load_reward_function("queryrl.rewards.functions", "default_compute_score") is default_compute_score


def test_module_path_errors() -> None:
    with pytest.raises(RewardError, match=r"no importable module 'queryrl\.not_a_module'"):
        load_reward_function("queryrl.not_a_module.reward")
    with pytest.raises(RewardError, match=r"module 'queryrl\.rewards\.functions' has no 'nope'; callables"):
        load_reward_function("queryrl.rewards.functions", "nope")
    with pytest.raises(RewardError, match="is a tuple, not a function"):
        load_reward_function("queryrl.rewards.functions", "MATH_SOURCES")
