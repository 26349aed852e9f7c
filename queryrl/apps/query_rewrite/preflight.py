"""What the query-rewrite application checks before training (:mod:`queryrl.trainer.preflight`).

The same checks as ``queryrl eval`` (:mod:`.eval_checks`): an OpenAI-compatible judge, when the reward
uses one, answers with these settings (key variable, ``GET /models``, one tiny request); an external
RAG service answers ``GET /health`` and one ``POST /rag/chat`` whose documents keep the response contract
(:func:`~.eval_checks.check_rag_contract`). The reward checked is the application's own
(:data:`~queryrl.apps.query_rewrite.training.REWARD_FUNCTION` with :func:`~.training.reward_kwargs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from queryrl.apps.query_rewrite.eval.checks import ServiceCheckFailed, check_judge, check_rag, check_rag_contract
from queryrl.trainer.preflight import Check, PreflightError, RewardSpec


def _one_message(check: Callable[[], str]) -> Check:
    def run() -> str:
        try:
            return check()
        except ServiceCheckFailed as exc:
            raise PreflightError(str(exc)) from None

    return run


def uses_judge(kwargs: dict[str, Any]) -> bool:
    """The reward calls the OpenAI-compatible judge (seed_hybrid always judges; other modes when weighted)."""
    weighted = kwargs["mode"] == "seed_hybrid" or float(kwargs["weights"].get("judge") or 0.0) != 0.0
    return kwargs["judge"] == "openai" and weighted


def reward_spec(cfg: DictConfig) -> RewardSpec:
    from queryrl.apps.query_rewrite.training import REWARD_FUNCTION, reward_kwargs

    return RewardSpec(REWARD_FUNCTION, "compute_score", reward_kwargs(cfg))


def service_checks(cfg: DictConfig) -> list[Check]:
    """The judge (if the reward uses it) and the external RAG service (if ``rag.url``), in that order."""
    from queryrl.apps.query_rewrite.reward.judge import judge_client, judge_request_options

    kwargs = dict(reward_spec(cfg).kwargs)
    checks: list[Check] = []
    if uses_judge(kwargs):
        client = judge_client(
            str(kwargs["judge_base_url"]),
            str(kwargs["judge_model"]),
            kwargs["judge_api_key_env"],
            float(kwargs["judge_timeout_s"]),
            int(kwargs["judge_max_retries"]),
            **judge_request_options(kwargs),
        )
        checks.append(_one_message(lambda: check_judge(client)))
    rag = cfg.app.query_rewrite.rag
    if rag.url:
        checks.append(_one_message(lambda: check_rag(str(rag.url), float(rag.timeout_s))))
        fields = dict(rag.document_fields)
        contract = lambda: check_rag_contract(str(rag.url), float(rag.timeout_s), fields, rag.token_env)  # noqa: E731
        checks.append(_one_message(contract))
    return checks
