"""`queryrl serve-judge`'s built-in judges answer the query-rewrite rubric: the app's reward with
``judge.backend=openai`` pointed at them accepts every verdict (no sample fails on the schema)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from queryrl.apps.query_rewrite.demo.data import make_catalogue, sales_demo_rows
from queryrl.apps.query_rewrite.reward.judging import RUBRIC_VERDICT_SCHEMA
from queryrl.apps.query_rewrite.reward.score import compute_score
from queryrl.rewards.json_extract import validate
from queryrl.testing.judge_server import BUILTIN_JUDGES, load_judge_function, make_app, running_server
from tests.loopback import serve_judge_process

JUDGE = {"judge": "openai", "judge_model": "demo-judge", "judge_api_key_env": None, "judge_max_retries": 0}


def _row() -> dict[str, Any]:
    return next(r for r in sales_demo_rows("val") if r["extra_info"]["turn_type"] == "pronoun")


def _rewrite(row: dict[str, Any]) -> str:
    """A parseable answer (the gold document's title), so the reward calls RAG and the judge."""
    titles = {d["doc_id"]: d["title"] for d in make_catalogue()}
    query = titles[row["reward_model"]["ground_truth"]["gold_doc_ids"][0]]
    return json.dumps({"rewritten_query": query}, ensure_ascii=False)


def _score(url: str) -> dict[str, float]:
    row = _row()
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    return asyncio.run(compute_score(row["data_source"], _rewrite(row), gt, info, judge_base_url=url, **JUDGE))


@pytest.fixture
def serve_judge_constant() -> Iterator[str]:
    """`queryrl serve-judge --judge constant` as a real process on 127.0.0.1; yields its base URL."""
    with serve_judge_process("constant") as url:
        yield url


@pytest.mark.slow
def test_serve_judge_constant_is_accepted_by_the_query_rewrite_reward(serve_judge_constant: str) -> None:
    out = _score(serve_judge_constant)  # a schema-invalid verdict raises RewardFailure: the sample fails
    assert out["quality"] == pytest.approx(0.5 + 20 / 40 * 0.2)  # the users' mapping: a tie at 20 of 40
    assert out["judge"] == pytest.approx(2 * out["quality"] - 1)


def test_length_judge_is_accepted_by_the_query_rewrite_reward() -> None:
    with running_server(make_app(load_judge_function("length"))) as url:
        out = _score(url)
    assert 0.0 <= out["quality"] <= 1.0


@pytest.mark.parametrize("name", ["constant", "length"])
def test_verdict_judges_answer_the_full_rubric(name: str) -> None:
    messages = [{"role": "user", "content": "8b: " + "x" * 23 + "\n32b: " + "y" * 17}]
    verdict = json.loads(str(BUILTIN_JUDGES[name](messages)))
    assert validate(verdict, RUBRIC_VERDICT_SCHEMA) == []
    for side in verdict["score"].values():  # the dimensions add up to the sum
        assert side["quality"] + side["relevance"] + side["completeness"] + side["retrieval"] == pytest.approx(
            side["sum"]
        )
