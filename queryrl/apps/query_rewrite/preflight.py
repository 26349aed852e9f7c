"""What the query-rewrite application checks before training (:mod:`queryrl.trainer.preflight`).

The same checks as ``queryrl eval`` (:mod:`.eval.checks`): an OpenAI-compatible judge, when the reward
uses one, answers with these settings (key variable, ``GET /models``, one tiny request); an external
RAG service answers ``GET /health``, then one ``POST /rag/chat_8b`` and one ``POST /rag/chat`` with the
fields training sends for the first training row (its current turn as the rewrite), each answer checked
by the client's contract check that checks every answer of the run
(:func:`~.eval.checks.check_rag_endpoint`); one line per endpoint. The reward checked is the
application's own (:meth:`~.reward.score.QueryRewriteReward.from_config`).
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from queryrl.apps.query_rewrite.config import QueryRewriteConfig, QueryRewriteRAGConfig, reward_weights, settings_of
from queryrl.apps.query_rewrite.eval.checks import ServiceCheckFailed, check_judge, check_rag, check_rag_endpoint
from queryrl.trainer.preflight import Check, PreflightError, RewardSpec, first_row


def _one_message(check: Callable[[], str]) -> Check:
    def run() -> str:
        try:
            return check()
        except ServiceCheckFailed as exc:
            raise PreflightError(str(exc)) from None

    return run


def uses_judge(settings: QueryRewriteConfig) -> bool:
    """The reward calls the OpenAI-compatible judge (seed_hybrid always judges; other modes when weighted)."""
    weighted = settings.reward_mode == "seed_hybrid" or reward_weights(settings).get("judge", 0.0) != 0.0
    return settings.judge.backend == "openai" and weighted


def reward_spec(cfg: DictConfig) -> RewardSpec:
    """The application's reward as the run will call it, to score the first row with."""
    from queryrl.apps.query_rewrite.reward.score import QueryRewriteReward
    from queryrl.apps.query_rewrite.training import REWARD_FUNCTION

    return RewardSpec(REWARD_FUNCTION, "compute_score", {}, fn=QueryRewriteReward.from_config(cfg))


def service_checks(cfg: DictConfig) -> list[Check]:
    """The judge (if the reward uses it) and the external RAG service (if ``rag.url``), in that order."""
    from queryrl.apps.query_rewrite.reward.judge import judge_client

    settings = settings_of(cfg)
    checks: list[Check] = []
    if uses_judge(settings):
        client = judge_client(settings.judge)
        checks.append(_one_message(lambda: check_judge(client)))
    rag = cfg.app.query_rewrite.rag
    if rag.url:
        checks.append(_one_message(lambda: check_rag(str(rag.url), float(rag.timeout_s))))
        checks += [_one_message(_endpoint_check(cfg, endpoint)) for endpoint in ("chat_8b", "chat")]
    return checks


def _endpoint_check(cfg: DictConfig, endpoint: str) -> Callable[[], str]:
    """:func:`check_rag_endpoint` of `endpoint` with the first row of the first training file."""

    def check() -> str:
        rag = OmegaConf.to_object(cfg.app.query_rewrite.rag)
        assert isinstance(rag, QueryRewriteRAGConfig)
        path, row = first_row(cfg)
        return check_rag_endpoint(rag, endpoint, dict(row.get("extra_info") or {}), f"the first row of {path}")

    return check
