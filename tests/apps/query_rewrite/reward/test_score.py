"""The query-rewrite reward function (queryrl.apps.query_rewrite.reward.score) end to end, on the sales demo."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from functools import cache
from typing import Any

import pytest

from queryrl.apps.query_rewrite.config import QueryRewriteConfig
from queryrl.apps.query_rewrite.demo.data import make_catalogue, sales_demo_corpus, sales_demo_rows
from queryrl.apps.query_rewrite.reward.calls import candidate_calls, pop_reward_metrics
from queryrl.apps.query_rewrite.reward.judge import readable_verdict
from queryrl.apps.query_rewrite.reward.score import RewardFailure, compute_score
from queryrl.rag import BM25Index, Document, HeuristicRewriter
from queryrl.rag import make_app as make_rag_app
from queryrl.rewards import RewardInput, load_reward_function, make_reward_manager
from queryrl.testing.judge_server import make_app as make_judge_app
from queryrl.testing.judge_server import running_server

PENALTY = QueryRewriteConfig().intent_penalty  # what a reply that changes the customer's intent loses


@cache
def _rows() -> list[dict[str, Any]]:
    return [r for r in sales_demo_rows("val") if r["extra_info"]["turn_type"] == "pronoun"]


@cache
def _titles() -> dict[str, str]:
    return {d["doc_id"]: d["title"] for d in make_catalogue()}


def _answer(query: str) -> str:
    return json.dumps({"rewritten_query": query, "user_profile": "", "history_summary": ""}, ensure_ascii=False)


def _correct(row: dict[str, Any]) -> str:
    """The gold product's name + aspect: the gold document's title."""
    return _titles()[row["reward_model"]["ground_truth"]["gold_doc_ids"][0]]


def _score(row: dict[str, Any], solution: str, **kwargs: Any) -> dict[str, float]:
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    return asyncio.run(compute_score(row["data_source"], solution, gt, info, **kwargs))


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def rag_url() -> Iterator[tuple[str, dict[str, int]]]:
    """A real HTTP RAG service over the sales demo; yields (url, its per-endpoint request counts)."""
    app = make_rag_app(
        BM25Index([Document(d["doc_id"], d["title"], d["content"]) for d in sales_demo_corpus()]),
        HeuristicRewriter(),
        top_k=5,
    )
    with running_server(app) as url:
        yield url.removesuffix("/v1"), app.state.requests


def test_correct_rewrite_beats_useless_and_raw_turn() -> None:
    for row in _rows()[:3]:
        good = _score(row, _answer(_correct(row)))
        useless = _score(row, _answer("你好"))
        raw = _score(row, _answer(row["extra_info"]["contexts"][-1]["content"]))
        assert good["score"] > useless["score"]
        assert good["score"] > raw["score"]
        assert good["retrieval_rank"] > 1.5
        assert good["recall_at_5"] == 1.0
        assert good["format"] == 1.0
        # the title query is not always ranked as well as the reference's (rank 2 vs 1): then both lose to
        # it, and a loss's quality depends only on the reference's sum (the users' mapping)
        assert good["quality"] >= useless["quality"]
        assert useless["quality"] < 0.5
        assert useless["retrieval_rank"] == 0.0
        shown = {"candidate_query", "reference_query", "candidate_documents", "reference_documents", "judge_verdict"}
        shown.add("intent_check")  # {"kept", "code", "reason"}: the offline intent check (reward_intent.py)
        assert all(isinstance(v, float) for k, v in good.items() if k not in shown)
        # what a person reads in the samples files: both sides' documents with gold marked, and the verdict
        gold = set(row["reward_model"]["ground_truth"]["gold_doc_ids"])
        assert good["candidate_query"] == _correct(row)
        assert good["reference_query"]
        for side in ("candidate_documents", "reference_documents"):
            assert 0 < len(good[side]) <= 5
            assert all(d["gold"] == (d["doc_id"] in gold) for d in good[side])
        assert any(d["gold"] for d in good["candidate_documents"])  # recall_at_5 == 1
        assert not any(d["gold"] for d in useless["candidate_documents"])
        assert good["judge_verdict"]["better"] in ("candidate", "reference", "same")
        assert set(good["judge_verdict"]["candidate"]) >= {"quality", "relevance", "completeness", "retrieval", "sum"}
        assert good["score"] == pytest.approx(1.0 * good["judge"] + 0.5 * good["retrieval_rank"] + 0.2)


def test_unparseable_output_gets_the_format_penalty_not_a_failure() -> None:
    row = _rows()[0]
    bad = _score(row, "我觉得用户想问配置")  # no JSON at all
    useless = _score(row, _answer("你好"))
    assert bad["format"] == 0.0
    assert bad["retrieval_rank"] == 0.0
    assert bad["judge"] == -1.0
    assert bad["score"] == pytest.approx(-1.0 - PENALTY)  # the floor; it asks nothing: the intent penalty too
    assert bad["intent/changed"] == 1.0
    assert bad["score"] < useless["score"]  # garbage never beats a parseable rewrite


def test_unparsed_retrieve_reads_plain_text_as_the_query_with_format_zero() -> None:
    """A model that answers the query as plain text (no JSON) gets rewards that differ by what it retrieved."""
    row = _rows()[0]
    right = _score(row, f"改写后的查询：{_correct(row)}\n（补全了代词）", unparsed="retrieve")
    wrong = _score(row, "“你好”", unparsed="retrieve")
    nothing = _score(row, "```\n\n```", unparsed="retrieve")
    assert right["candidate_query"] == _correct(row)  # the label, the quotes and the second line are not the query
    assert (right["format"], right["format/plain_text"]) == (0.0, 1.0)
    assert right["retrieval_rank"] > wrong["retrieval_rank"]
    assert right["score"] > wrong["score"] > nothing["score"]  # a signal between answers that all miss the format
    assert nothing["score"] == pytest.approx(-1.0 - PENALTY)  # no usable line: the floor (and it asks nothing)
    parsed = _score(row, _answer(_correct(row)), unparsed="retrieve")
    assert (parsed["format"], parsed["format/plain_text"]) == (1.0, 0.0)
    assert parsed["score"] == pytest.approx(right["score"] + 0.2)  # the format weight is the price of plain text
    assert _score(row, _correct(row))["score"] == pytest.approx(-1.0 - PENALTY)  # the default (floor) is unchanged


def test_plain_text_query_takes_the_first_line_without_labels_or_quotes() -> None:
    from queryrl.apps.query_rewrite.prompts import plain_text_query

    assert plain_text_query("Rewritten query: iPhone 15 battery life\nBecause...") == "iPhone 15 battery life"
    assert plain_text_query("\n\n**查询**：  「星辰X3  手机续航」") == "星辰X3 手机续航"
    assert plain_text_query("```text\n颐和园门票多少钱\n```") == "颐和园门票多少钱"
    assert plain_text_query("x" * 300) is None  # an essay is not a query
    assert plain_text_query("   ") is None
    assert plain_text_query(None) is None


def test_over_long_query_gets_format_zero_and_weights_configure_the_mix() -> None:
    row = _rows()[0]
    out = _score(row, _answer(_correct(row)), max_query_chars=5, weights={"judge": 0.0, "retrieval_rank": 1.0})
    assert out["format"] == 0.0
    assert "quality" not in out
    assert out["score"] == pytest.approx(out["retrieval_rank"])


def test_no_gold_drops_the_retrieval_rank_weight() -> None:
    row = _rows()[0]
    gt: dict[str, list[str]] = {"gold_doc_ids": []}
    query = _answer(_correct(row))
    out = asyncio.run(compute_score(row["data_source"], query, gt, row["extra_info"], weights={"judge": 0.0}))
    assert "retrieval_rank" not in out
    assert out["score"] == pytest.approx(0.2)
    with pytest.raises(RewardFailure, match="offline judge"):  # the offline judge needs gold
        asyncio.run(compute_score(row["data_source"], _answer("你好"), gt, row["extra_info"]))


def test_rag_down_fails_the_sample() -> None:
    row = _rows()[0]
    kwargs: dict[str, Any] = {"rag_url": f"http://127.0.0.1:{_closed_port()}", "rag_timeout_s": 1.0}
    kwargs["rag_max_retries"] = 0
    with pytest.raises(RewardFailure, match="RAG"):
        _score(row, _answer(_correct(row)), **kwargs)
    manager = make_reward_manager("async", compute_score, kwargs, max_retries=0)
    try:
        (result,) = manager.score(
            [RewardInput(row["data_source"], _answer("x"), row["reward_model"]["ground_truth"], row["extra_info"])]
        )
    finally:
        manager.close()
    assert result.failed
    assert "RAG" in (result.error or "")


def test_identical_rewrites_share_one_candidate_call(rag_url: tuple[str, dict[str, int]]) -> None:
    url, requests = rag_url
    row = _rows()[1]
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    query = _correct(row)

    async def group() -> tuple[list[dict[str, float]], int]:
        solutions = [_answer(query), _answer(" " + query.replace(" ", "  ") + "\n"), _answer(query)]
        outs = await asyncio.gather(*(compute_score(row["data_source"], s, gt, info, rag_url=url) for s in solutions))
        again = await compute_score(row["data_source"], _answer(query), gt, info, rag_url=url)  # from the LRU
        other = await compute_score(row["data_source"], _answer("你好"), gt, info, rag_url=url)
        return [*outs, again, other], candidate_calls()

    before = dict(requests)
    outs, calls = asyncio.run(group())
    assert calls == 2
    assert requests["chat_8b"] - before["chat_8b"] == 2  # one for the three identical rewrites, one for "你好"
    assert requests["chat"] - before["chat"] == 1  # the reference, cached by the client per prompt
    assert len({o["score"] for o in outs[:4]}) == 1
    assert outs[4]["score"] < outs[0]["score"]


def test_identical_rewrites_share_one_judge_call(rag_url: tuple[str, dict[str, int]]) -> None:
    url, _ = rag_url
    row = _rows()[2]
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    seen: list[str] = []

    def judge(messages: list[dict[str, Any]]) -> str:
        seen.append(messages[-1]["content"])
        return _verdict("same", 30.0, 30.0)

    with running_server(make_judge_app(judge)) as judge_url:
        kw = {"judge": "openai", "judge_model": "j", "judge_api_key_env": None, "judge_base_url": judge_url}

        async def group() -> list[dict[str, float]]:
            solutions = [_answer(_correct(row))] * 3 + [_answer(" " + _correct(row)), _answer("你好")]
            return await asyncio.gather(
                *(compute_score(row["data_source"], s, gt, info, rag_url=url, **kw) for s in solutions)
            )

        pop_reward_metrics()
        outs = asyncio.run(group())
        metrics = pop_reward_metrics()
    assert len(seen) == 2  # one verdict for the four identical (after normalising) rewrites, one for "你好"
    assert metrics["judge/distinct_calls"] == 2.0
    assert len({o["quality"] for o in outs[:4]}) == 1


def test_runs_on_the_async_managers_loop() -> None:
    fn = load_reward_function("queryrl.apps.query_rewrite.reward.score", "compute_score")
    rows = _rows()[:4]
    inputs = [
        RewardInput(r["data_source"], s, r["reward_model"]["ground_truth"], r["extra_info"])
        for r in rows
        for s in (_answer(_correct(r)), _answer("你好"), "not json")
    ]
    manager = make_reward_manager("async", fn, {"weights": {"judge": 1.0, "retrieval_rank": 0.5, "format": 0.2}})
    try:
        results = manager.score(inputs)
        results_again = manager.score(inputs)  # the second batch on the same loop and clients
    finally:
        manager.close()
    for batch in (results, results_again):
        assert not any(r.failed for r in batch), [r.error for r in batch]
        scores = [r.score for r in batch]
        for i in range(0, len(scores), 3):
            good, useless, garbage = scores[i : i + 3]
            assert good is not None
            assert useless is not None
            assert garbage is not None
            assert good > useless > garbage
        assert batch[0].extra["recall_at_5"] == 1.0
        assert batch[2].extra["format"] == 0.0
    assert [r.score for r in results] == [r.score for r in results_again]


def _verdict(better: str, s8: float, s32: float) -> str:
    def side(total: float) -> dict[str, float]:
        return {
            "quality": total * 0.4,
            "relevance": total * 0.2,
            "completeness": total * 0.2,
            "retrieval": total * 0.2,
            "sum": total,
        }

    return json.dumps({"better": better, "score": {"8b": side(s8), "32b": side(s32)}})


def test_openai_judge_with_and_without_position_swap() -> None:
    row = _rows()[0]
    seen: list[str] = []

    def same(messages: list[dict[str, Any]]) -> str:
        seen.append(messages[-1]["content"])
        return _verdict("same", 30.0, 30.0)

    def first_wins(messages: list[dict[str, Any]]) -> str:  # always prefers position "8b": inconsistent
        return _verdict("8b", 36.0, 20.0)

    def garbage(messages: list[dict[str, Any]]) -> str:
        return "I cannot decide."

    base = {"judge": "openai", "judge_model": "test-judge", "judge_api_key_env": None, "judge_max_retries": 0}
    pop_reward_metrics()
    with running_server(make_judge_app(same)) as url:
        plain = _score(row, _answer(_correct(row)), judge_base_url=url, **base)
        assert "judge/position_consistency" not in pop_reward_metrics()
        swapped = _score(row, _answer(_correct(row)), judge_base_url=url, position_swap=True, **base)
    assert plain["quality"] == pytest.approx(0.5 + 30 / 40 * 0.2)
    assert swapped["quality"] == pytest.approx(plain["quality"])
    assert pop_reward_metrics()["judge/position_consistency"] == 1.0
    assert len(seen) == 3
    assert _correct(row) in seen[0]

    with running_server(make_judge_app(first_wins)) as url:
        one_order = _score(row, _answer(_correct(row)), judge_base_url=url, **base)
        assert one_order["quality"] == pytest.approx(0.7 + 36 / 40 * 0.3)
        with pytest.raises(RewardFailure, match="position-inconsistent"):
            _score(row, _answer(_correct(row)), judge_base_url=url, position_swap=True, **base)
        assert pop_reward_metrics()["judge/position_consistency"] == 0.0
    with running_server(make_judge_app(garbage)) as url, pytest.raises(RewardFailure, match="judge failed"):
        _score(row, _answer(_correct(row)), judge_base_url=url, **base)


def test_verdicts_are_shown_with_candidate_and_reference_not_position_labels() -> None:
    side = {"quality": 12, "relevance": 6, "completeness": 5, "retrieval": 4, "sum": 27}
    other = {"quality": 4, "relevance": 2, "completeness": 2, "retrieval": 1, "sum": 9}
    verdict = {"better": "8b", "score": {"8b": side, "32b": other}, "reason": "更具体"}
    assert readable_verdict(verdict) == {
        "better": "candidate",
        "candidate": side,
        "reference": other,
        "reason": "更具体",
    }
    # with the positions swapped the candidate sat in "32b": the same reading comes out
    swapped = {"better": "32b", "score": {"8b": other, "32b": side}, "reason": "更具体"}
    assert readable_verdict(swapped, candidate_label="32b") == readable_verdict(verdict)
    assert readable_verdict({"better": "same", "score": {"8b": side, "32b": side}})["better"] == "same"


def test_retrieval_entity_reward_is_the_share_of_the_top_k_about_a_gold_title() -> None:
    from queryrl.apps.query_rewrite.reward.modes import retrieval_entity_reward

    assert retrieval_entity_reward(["A", "B", "A", "C", "A", "A"], ["A"], 5) == pytest.approx(0.6)
    assert retrieval_entity_reward(["A", "A"], ["A", "B"], 5) == pytest.approx(0.4)  # fewer than k: misses
    assert retrieval_entity_reward(["A"], [], 5) is None  # no gold titles: not applicable
    with pytest.raises(ValueError, match="k >= 1"):
        retrieval_entity_reward(["A"], ["A"], 0)


def test_retrieval_entity_tells_apart_rewrites_that_miss_the_gold_document() -> None:
    """Two rewrites that both miss the gold document score alike on the rank reward; the one that retrieves
    the gold product's other documents gets the entity share (weighted only when set)."""
    row = _rows()[0]
    gold_id = row["reward_model"]["ground_truth"]["gold_doc_ids"][0]
    product = next(d["product"] for d in make_catalogue() if d["doc_id"] == gold_id)
    titles = [d["title"] for d in make_catalogue() if d["product"] == product]  # the product's documents
    gt = {"gold_doc_ids": ["no-such-document"], "gold_titles": titles}  # a gold document neither retrieves
    weights = {"judge": 0.0, "retrieval_rank": 1.0, "format": 0.2, "retrieval_entity": 1.0}
    other_aspect = next(t for t in titles if t != _titles()[gold_id])  # the right product, another aspect

    def score(answer: str, truth: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return asyncio.run(compute_score(row["data_source"], answer, truth, row["extra_info"], **kw))

    near, far = score(_answer(other_aspect), gt, weights=weights), score(_answer("你好"), gt, weights=weights)
    shown = [d["title"] for d in near["candidate_documents"]]
    assert near["retrieval_entity"] == pytest.approx(sum(t in titles for t in shown) / 5)
    assert near["retrieval_entity"] > 0.0
    assert near["retrieval_rank"] == far["retrieval_rank"] == 0.0
    assert far["retrieval_entity"] < near["retrieval_entity"]
    no_entity = score(_answer(other_aspect), gt, weights={**weights, "retrieval_entity": 0.0})
    assert "retrieval_entity" not in no_entity  # not computed unless weighted
    assert near["score"] == pytest.approx(no_entity["score"] + near["retrieval_entity"])
    assert score("不是JSON", gt, weights=weights)["retrieval_entity"] == 0.0  # unparsed: its floor
    with pytest.raises(RewardFailure, match="gold_titles"):  # data without titles cannot give it: named
        score(_answer(other_aspect), {"gold_doc_ids": ["no-such-document"]}, weights=weights)
