"""An LLM judge behind any OpenAI-compatible API: the client (:mod:`.client`), what it remembers between
requests (:mod:`.memory`: the verdict cache, refusals) and what it may send and retry (:mod:`.policy`)."""

from queryrl.rewards.json_extract import parse_verdict
from queryrl.rewards.judge.client import JudgeClient
from queryrl.rewards.judge.memory import JudgeResult
from queryrl.rewards.judge.policy import JudgeConfigError, JudgeUnavailable
from queryrl.rewards.judge.usage import collect_judge_metrics, judge_cost

__all__ = [
    "JudgeClient",
    "JudgeConfigError",
    "JudgeResult",
    "JudgeUnavailable",
    "collect_judge_metrics",
    "judge_cost",
    "parse_verdict",
]
