from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from queryrl.rag import (
    REWRITERS,
    BM25Index,
    HeuristicRewriter,
    LastTurnRewriter,
    build_rewriter,
    make_rewriter,
    register_rewriter,
)
from queryrl.rag.rewriters import OpenAICompatibleRewriter
from queryrl.testing.judge_server import make_app as make_judge_app
from queryrl.testing.judge_server import running_server
from tests.rag.helpers import PRONOUN_CONTEXTS


def test_heuristic_resolves_pronoun_where_last_turn_fails(index: BM25Index) -> None:
    heuristic = asyncio.run(HeuristicRewriter().rewrite(PRONOUN_CONTEXTS, "", ""))
    raw = asyncio.run(LastTurnRewriter().rewrite(PRONOUN_CONTEXTS, "", ""))
    assert heuristic == "iphone 15 它多少钱？"
    assert raw == "它多少钱？"
    assert index.search(heuristic, k=1)[0].doc_id == "iphone-price"
    assert index.search(raw, k=1)[0].doc_id != "iphone-price"  # every price doc ties; nothing points at the iPhone


def test_heuristic_rule_edges() -> None:
    rw = HeuristicRewriter(entities=["华为"])
    switch = [{"role": "user", "content": "iPhone 15 多少钱"}, {"role": "user", "content": "小米 14 呢？"}]
    assert rw.rewrite_sync(switch) == "小米 14 呢？"  # names its own product: standalone
    chinese = [{"role": "user", "content": "华为的手机怎么样"}, {"role": "user", "content": "保修多久？"}]
    assert rw.rewrite_sync(chinese) == "华为 保修多久？"  # a known entity written in Chinese
    assert rw.rewrite_sync([{"role": "user", "content": "你好"}]) == ""  # small talk: no retrieval
    assert HeuristicRewriter(abstain=False).rewrite_sync([{"role": "user", "content": "你好"}]) == "你好"
    assert rw.rewrite_sync([], history_summary="用户在看 vivo X100") == ""  # no user turn: nothing to rewrite
    summary_only = [{"role": "user", "content": "它的颜色？"}]
    assert rw.rewrite_sync(summary_only, history_summary="用户在看 vivo X100") == "vivo x100 它的颜色？"


def test_registry() -> None:
    assert isinstance(make_rewriter("heuristic", max_terms=2), HeuristicRewriter)
    with pytest.raises(ValueError, match="unknown rewriter"):
        make_rewriter("nope")
    register_rewriter("test-last", LastTurnRewriter)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_rewriter("test-last", LastTurnRewriter)
    finally:
        REWRITERS.unregister("test-last")


def test_openai_compatible_rewriter_and_fallback() -> None:
    replies = iter(['好的：{"rewritten_query": "iPhone 15 价格"}', "no json here"])

    def judge_fn(messages: list[dict[str, Any]]) -> str:
        payload = json.loads(messages[-1]["content"])
        assert payload["conversation"][-1]["content"] == "它多少钱？"
        return next(replies)

    with running_server(make_judge_app(judge_fn), max_lifetime_s=60) as url:
        rw = OpenAICompatibleRewriter(url, "m", api_key_env=None, max_retries=0, timeout_s=5)

        async def run() -> list[str]:
            try:
                return [await rw.rewrite(PRONOUN_CONTEXTS, "", "") for _ in range(2)]
            finally:
                await rw.client.aclose()

        assert asyncio.run(run()) == ["iPhone 15 价格", "它多少钱？"]  # unparseable -> last user turn


def test_build_rewriter_takes_what_each_factory_needs() -> None:
    offered = {"entities": ["颐和园"], "latin_entities": True, "base_url": None, "model": None}
    heuristic = build_rewriter("heuristic", offered)
    assert isinstance(heuristic, HeuristicRewriter)
    talk = [
        {"role": "user", "content": "颐和园在哪"},
        {"role": "assistant", "content": "在海淀"},
        {"role": "user", "content": "门票多少钱"},
    ]
    assert heuristic.rewrite_sync(talk) == "颐和园 门票多少钱"  # the entities reached it (without: "门票多少钱")
    assert isinstance(build_rewriter("last_turn", offered), LastTurnRewriter)  # takes none of them
    with pytest.raises(ValueError, match="rewriter 'openai' needs base_url, model"):
        build_rewriter("openai", offered)
    with pytest.raises(TypeError):  # the user's own settings are passed as they are: a typo is not dropped
        build_rewriter("heuristic", offered, {"max_termz": 2})
