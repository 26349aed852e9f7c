"""The graded retrieval component (``weights.retrieval_graded``): hand-worked numbers, and on eval rows (the demo's,
KdConv travel's where present) that it tells apart rewrites retrieving the same top 5 and pays no query stuffing."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
from functools import cache
from typing import Any

import pytest

from queryrl.apps.query_rewrite.config import QueryRewriteConfig
from queryrl.apps.query_rewrite.data.kdconv import doc_entity, kdconv_rows
from queryrl.apps.query_rewrite.demo.data import make_catalogue, sales_demo_rows
from queryrl.apps.query_rewrite.reward.graded import length_budget
from queryrl.apps.query_rewrite.reward.modes import length_factor, retrieval_graded_reward
from queryrl.apps.query_rewrite.reward.score import RewardFailure, compute_score, score_reply
from tests.helpers import KDCONV, needs_kdconv

WEIGHTS = {"judge": 0.0, "retrieval_rank": 1.0, "format": 0.2, "retrieval_graded": 1.0}
ROWS = 32  # rows per data set in the stuffing test (at least 30)


def test_retrieval_graded_reward_hand_worked() -> None:
    # gold first, the best other document at 0.6 of it: discount 1, separation (1 + 0.4) / 2 = 0.7
    assert retrieval_graded_reward(["g", "a", "b"], [1.0, 0.6, 0.5], ["g"]) == pytest.approx((1.0 + 0.7) / 2)
    # the same documents in the same order, the runner-up closer (0.9): separation 0.55, so 0.775 instead of 0.85
    assert retrieval_graded_reward(["g", "a", "b"], [1.0, 0.9, 0.5], ["g"]) == pytest.approx((1.0 + 0.55) / 2)
    # gold second at 0.8 of the top: discount 1 / log2(3) = 0.6309, separation (1 - 0.2) / 2 = 0.4
    assert retrieval_graded_reward(["a", "g", "b"], [1.0, 0.8, 0.5], ["g"]) == pytest.approx(
        (1 / math.log2(3) + 0.4) / 2
    )
    # gold tied with the best other document (a query that names no entity): separation 0.5, not the top
    assert retrieval_graded_reward(["g", "a"], [1.0, 1.0], ["g"]) == pytest.approx(0.75)
    # several gold documents: the best-ranked counts, the others are not "other"
    assert retrieval_graded_reward(["g1", "g2", "a"], [1.0, 0.9, 0.5], ["g2", "g1"]) == pytest.approx(0.875)
    assert retrieval_graded_reward(["a", "b"], [1.0, 0.5], ["g"]) == 0.0  # gold not in the list
    assert retrieval_graded_reward(["g"], [0.0], ["g"]) == pytest.approx(0.5)  # nothing matched: discount only
    assert retrieval_graded_reward(["g"], [1.0], []) is None  # no gold: not applicable
    assert retrieval_graded_reward(["g", "a"], [1.0, 0.6], ["g"], length=0.5) == pytest.approx(0.425)
    assert retrieval_graded_reward(["g", "a"], [1.0, 0.6], ["g"], intent_kept=False) == 0.0
    with pytest.raises(ValueError, match="one score per document"):
        retrieval_graded_reward(["g", "a"], [1.0], ["g"])
    with pytest.raises(ValueError, match="length must be in"):
        retrieval_graded_reward(["g"], [1.0], ["g"], length=1.5)


def test_length_factor() -> None:
    assert length_factor(10, 20) == 1.0
    assert length_factor(20, 20) == 1.0
    assert length_factor(30, 20) == pytest.approx(0.5)
    assert length_factor(40, 20) == 0.0
    assert length_factor(90, 20) == 0.0
    assert length_factor(1, 0) == 1.0  # a budget below 1 counts as 1


def _answer(query: str) -> str:
    return json.dumps({"rewritten_query": query}, ensure_ascii=False)


def _score(row: dict[str, Any], query: str, **kwargs: Any) -> dict[str, Any]:
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    kwargs.setdefault("weights", WEIGHTS)
    return asyncio.run(compute_score(row["data_source"], _answer(query), gt, info, **kwargs))


@cache
def _demo_rows() -> list[dict[str, Any]]:
    return [r for r in sales_demo_rows("val") if r["reward_model"]["ground_truth"]["gold_doc_ids"]]


@cache
def _demo_product() -> dict[str, str]:
    return {d["doc_id"]: d["product"] for d in make_catalogue()}


def _stuffed(row: dict[str, Any], plain: str, entity: str) -> dict[str, str]:
    """The stuffed variants of the plain rewrite: the entity repeated 3 times, the last 3 turns copied, 3x longer
    (and the entity named once, what repeating it is compared with too)."""
    last3 = " ".join(str(m["content"]) for m in row["extra_info"]["contexts"][-3:])
    return {
        "entity_x1": f"{plain} {entity}",  # the entity named once: the fair baseline of entity_x3
        "entity_x3": f"{plain} {entity} {entity} {entity}",
        "copied_turns": f"{plain} {last3}",
        "three_times": " ".join([plain] * 3),
    }


def _stuffing_means(rows: list[dict[str, Any]], entity_of: Any, **kwargs: Any) -> dict[str, dict[str, float]]:
    """Per variant (plain: the reference pipeline's own query) the mean graded component and mean total score."""
    seen: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        plain = _score(row, "x", **kwargs)["reference_query"]  # the reference rewriter's query for this turn
        entity = entity_of(row["reward_model"]["ground_truth"]["gold_doc_ids"][0])
        for name, query in {"plain": plain, **_stuffed(row, plain, entity)}.items():
            out = _score(row, query, **kwargs)
            seen.setdefault(name, []).append((out["retrieval_graded"], out["score"]))
    return {
        name: {"graded": statistics.mean(v[0] for v in vals), "score": statistics.mean(v[1] for v in vals)}
        for name, vals in seen.items()
    }


def test_stuffed_rewrites_never_beat_the_plain_one_on_demo_rows() -> None:
    """Over 32 demo rows: the reference's query plain against the same with the entity x3, the last 3 turns
    copied, and 3x its length; no stuffing gets more graded reward on average. (The rank reward alone pays the
    entity x3 here: its mean total score is above the plain one's with or without this component.)"""
    means = _stuffing_means(_demo_rows()[:ROWS], _demo_product().__getitem__)
    assert means["plain"]["graded"] > 0.2  # the plain rewrite earns the component on these rows
    for name in ("entity_x3", "copied_turns", "three_times"):
        assert means[name]["graded"] < means["plain"]["graded"] / 2, (name, means)
    assert means["entity_x3"]["graded"] < means["entity_x1"]["graded"] / 2, means


@needs_kdconv()
def test_stuffed_rewrites_never_beat_the_plain_one_on_kdconv_rows() -> None:
    rows = kdconv_rows(KDCONV / "dev.json", require_gold=True)[:ROWS]
    means = _stuffing_means(rows, doc_entity, corpus=f"kdconv:{KDCONV / 'kb_travel.json'}")
    for name in ("entity_x3", "copied_turns", "three_times"):
        assert means[name]["graded"] <= means["plain"]["graded"], (name, means)
    assert means["entity_x3"]["graded"] < means["entity_x1"]["graded"], means  # naming it once pays, repeating no more


def test_same_top5_in_the_same_order_scores_apart() -> None:
    """Rewrites that retrieve the same 5 documents in the same order (so the rank reward ties) get different
    graded rewards where the scores differ: higher where gold stands further clear of the other documents
    (compared per unit of length factor, so the length budget is not what tells them apart)."""
    pairs = 0
    for row in _demo_rows()[:20]:
        gold_id = row["reward_model"]["ground_truth"]["gold_doc_ids"][0]
        title, product, turn = (
            _demo_title()[gold_id],
            _demo_product()[gold_id],
            row["extra_info"]["contexts"][-1]["content"],
        )
        results = [_score(row, q) for q in (title, turn, f"{product} {turn}", f"{title} {turn}", f"{title} {product}")]
        budget = length_budget(row["extra_info"], results[0]["reference_query"])
        per_unit = []
        for out in results:
            factor = length_factor(len(out["candidate_query"]), budget)
            if factor > 0 and not out["intent/changed"]:
                per_unit.append((out, out["retrieval_graded"] / factor))
        for i, (a, graded_a) in enumerate(per_unit):
            for b, graded_b in per_unit[i + 1 :]:
                if _ids(a) != _ids(b) or graded_a == pytest.approx(graded_b):
                    continue
                pairs += 1
                assert a["retrieval_rank"] == b["retrieval_rank"]
                assert (graded_a > graded_b) == (_margin(a) > _margin(b))
    assert pairs >= 5


def _ids(out: dict[str, Any]) -> list[str]:
    return [d["doc_id"] for d in out["candidate_documents"]]


def _margin(out: dict[str, Any]) -> float:
    docs = out["candidate_documents"]
    gold = max((d["score"] for d in docs if d["gold"]), default=0.0)
    return gold - max((d["score"] for d in docs if not d["gold"]), default=0.0)


@cache
def _demo_title() -> dict[str, str]:
    return {d["doc_id"]: d["title"] for d in make_catalogue()}


def test_the_intent_check_and_the_length_budget_zero_the_component() -> None:
    """An answer instead of a question retrieves the gold document first and still gets 0 (the intent check);
    another product's question too; a right rewrite within its budget gets it; the mix adds it at its weight."""
    row = _demo_rows()[0]
    gold = row["reward_model"]["ground_truth"]["gold_doc_ids"][0]
    content = next(d["content"] for d in make_catalogue() if d["doc_id"] == gold)
    answer = _score(row, content)
    assert answer["retrieval_rank"] == 2.0
    assert answer["intent/changed"] == 1.0
    assert answer["retrieval_graded"] == 0.0
    right = _score(row, _demo_title()[gold])
    assert right["intent/changed"] == 0.0
    assert right["retrieval_graded"] > 0.5
    long = _score(row, " ".join([right["candidate_query"]] * 4))  # the same documents, four times the length
    assert _ids(long) == _ids(right)
    assert long["intent/changed"] == 0.0
    assert long["retrieval_graded"] == 0.0
    off = _score(row, right["candidate_query"], weights={**WEIGHTS, "retrieval_graded": 0.0})
    assert "retrieval_graded" not in off  # computed only where weighted
    assert right["score"] == pytest.approx(off["score"] + right["retrieval_graded"])
    unparsed = asyncio.run(
        compute_score(
            row["data_source"], "不是JSON", row["reward_model"]["ground_truth"], row["extra_info"], weights=WEIGHTS
        )
    )
    assert unparsed["retrieval_graded"] == 0.0  # its floor


def test_a_service_without_scores_fails_the_sample_naming_the_field() -> None:
    from queryrl.apps.query_rewrite.reward.graded import graded_component

    row = _demo_rows()[0]
    documents = [{"doc_id": "a", "title": "", "content": ""}]
    with pytest.raises(RewardFailure, match="numeric 'score'"):
        graded_component("q", documents, ["a"], row["extra_info"], "", None)


def test_a_turn_without_gold_drops_the_weight() -> None:
    row = _demo_rows()[0]
    settings = QueryRewriteConfig(reward_mode="mix")
    settings.weights.retrieval_graded = 1.0
    settings.weights.judge = 0.0
    info = {**row["extra_info"], "turn_type": "explicit"}
    out = asyncio.run(score_reply(settings, "", _answer(row["extra_info"]["contexts"][-1]["content"]), [], info))
    assert "retrieval_graded" not in out
    assert "retrieval_rank" not in out


def test_abstention_sets_the_component_at_its_top_or_floor() -> None:
    chat = next(r for r in sales_demo_rows("val") if r["extra_info"]["turn_type"] == "chitchat")
    assert _score(chat, "")["retrieval_graded"] == 1.0  # the right abstention
    assert _score(chat, "云帆 S9 手机 价格")["retrieval_graded"] == 0.0  # a query where none was needed
    assert _score(_demo_rows()[0], "")["retrieval_graded"] == 0.0  # no query on a turn with gold


def test_rank_depth_lets_the_component_read_past_the_top_k() -> None:
    """A query whose gold document is below the top 5 gets 0 at the default depth and its discounted rank and
    margin with ``rag.rank_depth`` 20."""
    for row in _demo_rows()[:40]:
        shallow = _score(row, row["extra_info"]["contexts"][-1]["content"])
        deep = _score(row, row["extra_info"]["contexts"][-1]["content"], rank_depth=20)
        if shallow["recall_at_5"] == 0.0 and deep["retrieval_rank"] > 0.0 and not deep["intent/changed"]:
            assert shallow["retrieval_graded"] == 0.0
            assert 0.0 < deep["retrieval_graded"] < 0.5  # rank 6 or deeper: discount <= 1 / log2(7), a trailing margin
            return
    pytest.fail("no demo turn whose raw text ranks gold between 6 and 20")
