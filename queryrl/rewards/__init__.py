"""Rewards: the verl ``compute_score`` contract (and TRL's), built-in scorers, and the managers that call them.

Typical wiring (``cfg.reward`` is a :class:`queryrl.config.RewardConfig`)::

    fn = load_reward_function(cfg.reward.function.path, cfg.reward.function.name)
    manager = make_reward_manager(cfg.reward.manager, fn, cfg.reward.kwargs)
    results = manager.score([RewardInput(data_source, response, ground_truth, extra_info), ...])
    metrics = summarize(results)  # reward/failed, reward/<key>/mean
"""

from queryrl.rewards.async_manager import AsyncRewardManager, RateLimiter
from queryrl.rewards.batch_manager import BatchRewardManager
from queryrl.rewards.dapo_manager import DAPORewardManager, overlong_penalty
from queryrl.rewards.functions import (
    BUILTIN_SCORERS,
    RewardError,
    RewardFn,
    default_compute_score,
)
from queryrl.rewards.json_extract import extract_json, json_objects, validate
from queryrl.rewards.judge import (
    JudgeClient,
    JudgeConfigError,
    JudgeResult,
    collect_judge_metrics,
)
from queryrl.rewards.loading import load_reward_function, load_weighted_functions
from queryrl.rewards.manager import (
    MANAGER_OPTIONS,
    REFERENCE_SCORE,
    REWARD_MANAGERS,
    NaiveRewardManager,
    PendingRewards,
    RewardInput,
    RewardManager,
    RewardResult,
    make_reward_manager,
    summarize,
    to_result,
)
from queryrl.rewards.parallel import ParallelRewardManager
from queryrl.rewards.reward_model import RewardModelScorer
from queryrl.rewards.scorers import gsm8k, toy
from queryrl.rewards.scorers.code import ExecResult, run_code
from queryrl.rewards.trl_style import TrainerState, TRLRewardFunction, is_trl_style

__all__ = [
    "BUILTIN_SCORERS",
    "MANAGER_OPTIONS",
    "REFERENCE_SCORE",
    "REWARD_MANAGERS",
    "AsyncRewardManager",
    "BatchRewardManager",
    "DAPORewardManager",
    "ExecResult",
    "JudgeClient",
    "JudgeConfigError",
    "JudgeResult",
    "NaiveRewardManager",
    "ParallelRewardManager",
    "PendingRewards",
    "RateLimiter",
    "RewardError",
    "RewardFn",
    "RewardInput",
    "RewardManager",
    "RewardModelScorer",
    "RewardResult",
    "TRLRewardFunction",
    "TrainerState",
    "collect_judge_metrics",
    "default_compute_score",
    "extract_json",
    "gsm8k",
    "is_trl_style",
    "json_objects",
    "load_reward_function",
    "load_weighted_functions",
    "make_reward_manager",
    "overlong_penalty",
    "run_code",
    "summarize",
    "to_result",
    "toy",
    "validate",
]
