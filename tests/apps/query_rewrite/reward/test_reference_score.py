"""The query-rewrite reward's ``reference_score``: the reference pipeline's own rewrite of the turn scored as if
the policy had written it, its judge component a tie (what algo.adv_estimator=grpo_reference counts)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from queryrl.apps.query_rewrite.config import (
    QueryRewriteConfig,
    QueryRewriteJudgeConfig,
    QueryRewriteRAGConfig,
    QueryRewriteWeights,
    settings_of,
)
from queryrl.apps.query_rewrite.demo.data import sales_demo_rows
from queryrl.apps.query_rewrite.reward.score import QueryRewriteReward
from queryrl.config import load_config
from queryrl.rewards import REFERENCE_SCORE


def _settings(mode: str = "mix", **weights: float) -> QueryRewriteConfig:
    return QueryRewriteConfig(
        enable=True,
        reward_mode=mode,
        weights=QueryRewriteWeights(**weights),
        judge=QueryRewriteJudgeConfig(backend="offline"),
        rag=QueryRewriteRAGConfig(corpus="sales_demo", top_k=5),
        reference_score=True,
    )


def _rows() -> list[dict[str, Any]]:
    return [r for r in sales_demo_rows("val") if (r["reward_model"]["ground_truth"] or {}).get("gold_doc_ids")][:6]


def _reward(s: QueryRewriteConfig, row: dict[str, Any], reply: str) -> dict[str, Any]:
    truth, info = row["reward_model"]["ground_truth"], row["extra_info"]
    return asyncio.run(QueryRewriteReward(s)(row["data_source"], reply, truth, info))


def _answer(query: str) -> str:
    return json.dumps({"rewritten_query": query}, ensure_ascii=False)


def test_the_reference_s_own_rewrite_scores_its_reference_score_and_every_reply_of_a_turn_gets_the_same() -> None:
    s = _settings(judge=0.5, retrieval_rank=1.0, format=0.2)
    differs = 0
    for row in _rows():
        first = _reward(s, row, _answer("你好"))
        # the reference's rewrite as the policy's reply: the same documents, judged a tie, so the same score
        same = _reward(s, row, _answer(first["reference_query"]))
        assert same["judge_verdict"]["better"] == "same"
        assert same["score"] == same[REFERENCE_SCORE]
        # any reply to the turn, parsed or not, gets that one reference score (one baseline a group)
        garbled = _reward(s, row, "{not json")
        assert first[REFERENCE_SCORE] == same[REFERENCE_SCORE] == garbled[REFERENCE_SCORE]
        assert "reference_query" not in garbled  # no RAG call for its own score: /rag/chat asked for the reference
        differs += first["score"] != first[REFERENCE_SCORE]
    assert differs  # not trivially equal: a greeting retrieves less than the reference's query


def test_without_the_setting_the_reward_returns_no_reference_score() -> None:
    off = QueryRewriteConfig(**{**vars(_settings(judge=0.5, retrieval_rank=1.0)), "reference_score": False})
    assert REFERENCE_SCORE not in _reward(off, _rows()[0], _answer("你好"))


@pytest.mark.parametrize(("estimator", "on"), [("grpo_reference", True), ("grpo", False), ("remax", False)])
def test_the_estimator_that_needs_it_turns_it_on(estimator: str, on: bool) -> None:
    cfg = load_config(None, ["app.query_rewrite.enable=true", f"algo.adv_estimator={estimator}"])
    assert settings_of(cfg).reference_score is on
