"""What the query-rewrite application checks before training (:mod:`queryrl.trainer.preflight`).

The same checks as ``queryrl eval`` (:mod:`.eval.checks`): an OpenAI-compatible judge, when the reward
uses one, answers with these settings (key variable, ``GET /models``, one tiny request); an external
RAG service answers ``GET /health``, then one ``POST /rag/chat_8b`` and one ``POST /rag/chat`` with the
fields training sends for the first training row (its current turn as the rewrite), each answer checked
by the client's contract check that checks every answer of the run
(:func:`~.eval.checks.check_rag_endpoint`); one line per endpoint. The reward checked is the
application's own (:meth:`~.reward.score.QueryRewriteReward.from_config`), scoring the first row's
reference rewrite (:func:`reference_reply`): a reply that parses, so that the check runs the retrieval and
the judge that training's rewards run, instead of an empty reply's format floor.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from queryrl.apps.query_rewrite.config import QueryRewriteConfig, QueryRewriteRAGConfig, reward_weights, settings_of
from queryrl.apps.query_rewrite.eval.checks import ServiceCheckFailed, check_judge, check_rag, check_rag_endpoint
from queryrl.trainer.preflight import Check, PreflightError, RewardSpec, first_row, shown


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

    reward = QueryRewriteReward.from_config(cfg)
    return RewardSpec(REWARD_FUNCTION, "compute_score", {}, fn=reward, probe=reference_reply)


def reference_reply(row: Mapping[str, Any]) -> tuple[str, str]:
    """The reply the preflight scores for `row`: its reference rewrite in the answer format its prompt asks for,
    the row's ``extra_info.sft_target`` where the data carries one, else queryrl's heuristic rewrite of it
    (:func:`~.data.sft_targets.add_sft_targets`, which labels turns that need no retrieval with an empty query).
    Returns (the reply and where it came from, in words; the reply)."""
    from queryrl.apps.query_rewrite.data.sft_targets import SFT_SOURCE_KEY, SFT_TARGET_KEY, add_sft_targets

    info = row.get("extra_info") or {}
    if not (isinstance(info.get(SFT_TARGET_KEY), str) and info[SFT_TARGET_KEY].strip()):
        info = add_sft_targets([copy.deepcopy(dict(row))])[0]["extra_info"]
    reply = str(info[SFT_TARGET_KEY])
    return f"the reference rewrite {shown(reply)} from {info.get(SFT_SOURCE_KEY) or 'extra_info.sft_target'}", reply


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
