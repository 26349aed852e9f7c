"""``app.query_rewrite.rag.rank_depth``: the rank reward reads the service's list to that depth (ConvSearch-R1
ranks to 100); the judge, recall@5 and the samples files still see the first ``top_k``."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from queryrl.apps.query_rewrite.config import settings_of
from queryrl.apps.query_rewrite.demo.data import sales_demo_corpus, sales_demo_rows
from queryrl.apps.query_rewrite.reward.modes import retrieval_rank_reward
from queryrl.apps.query_rewrite.reward.score import QueryRewriteReward
from queryrl.config import ConfigError, load_config
from queryrl.rag import BM25Index, Document


def _score(row: dict[str, Any], query: str, settings: Any) -> dict[str, Any]:
    gt, info = row["reward_model"]["ground_truth"], dict(row["extra_info"], answer_format="text")
    return asyncio.run(QueryRewriteReward(settings)(row["data_source"], query, gt, info))


def _deep_case() -> tuple[dict[str, Any], str, int]:
    """A demo turn and a query (its own current turn) whose gold document BM25 ranks below 5 but within 100,
    with that rank, found by an index of its own."""
    index = BM25Index([Document(d["doc_id"], d["title"], d["content"]) for d in sales_demo_corpus()])
    for row in sales_demo_rows("val"):
        gold = set(row["reward_model"]["ground_truth"]["gold_doc_ids"])
        query = row["extra_info"]["contexts"][-1]["content"]
        ids = [hit.doc_id for hit in index.search(query, 100)]
        rank = next((i + 1 for i, doc in enumerate(ids) if doc in gold), None)
        if gold and rank is not None and 10 < rank <= 100:
            return row, query, rank
    raise AssertionError("no demo turn whose own text ranks its gold document between 11 and 100")


def test_rank_depth_rewards_a_gold_document_below_the_judges_top_k() -> None:
    row, query, rank = _deep_case()
    base = settings_of(load_config(None, ["app.query_rewrite.enable=true", "app.query_rewrite.reward_mode=mix"]))
    shallow = _score(row, query, base)
    deep = _score(row, query, replace(base, rag=replace(base.rag, rank_depth=100)))
    assert shallow["retrieval_rank"] == 0.0  # gold is not in the 5 documents the service returned
    assert deep["retrieval_rank"] == pytest.approx((100 - rank) / 90)  # the paper's tail, from an index of its own
    assert deep["retrieval_rank"] == retrieval_rank_reward(["x"] * (rank - 1) + ["gold"], ["gold"])
    assert deep["score"] > shallow["score"]
    # what the judge, recall@5 and the samples files see is unchanged: the first top_k documents
    assert deep["recall_at_5"] == shallow["recall_at_5"] == 0.0
    assert deep["candidate_documents"] == shallow["candidate_documents"]
    assert len(deep["candidate_documents"]) == len(deep["reference_documents"]) == 5
    assert deep["judge"] == shallow["judge"]


def test_rank_depth_is_checked_against_top_k_and_the_rewards_depth() -> None:
    for bad in ("3", "101"):
        with pytest.raises(ConfigError, match=r"app\.query_rewrite\.rag\.rank_depth must be null or in \[rag\.top_k=5"):
            load_config(None, [f"app.query_rewrite.rag.rank_depth={bad}"])
    cfg = load_config(None, ["app.query_rewrite.rag.rank_depth=100"])
    assert settings_of(cfg).rag.rank_depth == 100
    assert settings_of(load_config(None, [])).rag.rank_depth is None  # the default: the judge's top_k
