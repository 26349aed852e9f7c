"""The intent check in the reward (reward_intent.py), the offline judge and the LLM judge's rubric line."""

from __future__ import annotations

import asyncio
import json
from functools import cache
from typing import Any

import pytest

from queryrl.apps.query_rewrite.config import QueryRewriteConfig, settings_of
from queryrl.apps.query_rewrite.demo.data import make_catalogue, sales_demo_rows
from queryrl.apps.query_rewrite.intent.check import IntentVerdict
from queryrl.apps.query_rewrite.reward.intent import pop_intent_metrics, with_intent
from queryrl.apps.query_rewrite.reward.judging import OfflineJudge, build_judge_messages
from queryrl.apps.query_rewrite.reward.score import compute_score, pop_reward_metrics
from queryrl.config import ConfigError, load_config


def _answer(query: str) -> str:
    return json.dumps({"rewritten_query": query}, ensure_ascii=False)


def _score(row: dict[str, Any], solution: str, **kwargs: Any) -> dict[str, Any]:
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    return asyncio.run(compute_score(row["data_source"], solution, gt, info, **kwargs))


@cache
def _doc_ids() -> dict[str, str]:
    return {d["title"]: d["doc_id"] for d in make_catalogue()}


def _row(history: list[str], last: str, gold_title: str) -> dict[str, Any]:
    """A demo-like row; the history alternates user / assistant and ends with the assistant."""
    texts = [*history, last]
    roles = ["user" if (len(texts) - 1 - i) % 2 == 0 else "assistant" for i in range(len(texts))]
    contexts = [{"role": r, "content": t} for r, t in zip(roles, texts, strict=True)]
    info = {"contexts": contexts, "turn_type": "explicit", "message_id": f"m-{abs(hash(last))}"}
    gold = {"gold_doc_ids": [_doc_ids()[gold_title]]}
    return {"data_source": "query_rewrite/sales_demo", "reward_model": {"ground_truth": gold}, "extra_info": info}


WARRANTY_TITLE = "朗月 Max8 平板电脑 保修"
WARRANTY_TURN = "你好，朗月Max8平板电脑保修政策是什么？"


@cache
def _reference_rows() -> list[dict[str, Any]]:
    """Demo test turns with gold whose reference answer names the product (latin model) and asks a type."""
    rows = [r for r in sales_demo_rows("test") if r["reward_model"]["ground_truth"]["gold_doc_ids"]]
    return [r for r in rows if r["extra_info"]["turn_type"] in ("explicit", "pronoun")][:4]


def _reference_query(row: dict[str, Any]) -> str:
    return str(json.loads(row["extra_info"]["sft_target"])["rewritten_query"])


def test_a_garbled_copy_of_the_reference_scores_below_the_clean_reference() -> None:
    """Issue 25: "极光 Neo9 无线\ufffd发我看看?" scored 1.843, the same as the clean reference."""
    for row in _reference_rows():
        clean = _reference_query(row)
        broken = clean[:4] + "\ufffd" + clean[5:]
        for settings in ({}, {"intent_penalty": 0.0}, {"intent_penalty": 0.0, "weights": {"judge": 0.0}}):
            good, bad = _score(row, _answer(clean), **settings), _score(row, _answer(broken), **settings)
            assert good["intent/changed"] == 0.0
            assert (bad["intent/changed"], bad["intent_check"]["code"]) == (1.0, "garbled")
            assert bad["format"] == 0.0  # garbled text is not a well-formed answer
            assert bad["score"] < good["score"], (settings, clean, broken)


def test_a_changed_question_pays_the_penalty_even_when_it_retrieves_the_same_document() -> None:
    row = _row([], WARRANTY_TURN, WARRANTY_TITLE)
    kept = _score(row, _answer("朗月Max8平板电脑保修政策是什么？"))
    swapped = _score(row, _answer("你好，朗月Max8平板电脑能七天无理由退吗？"))  # issue 25, from the demo's GRPO
    assert swapped["recall_at_5"] == kept["recall_at_5"] == 1.0  # retrieval alone cannot tell them apart
    assert swapped["intent_check"] == {
        "kept": False,
        "code": "question_changed",
        "reason": swapped["intent_check"]["reason"],
    }
    assert "return instead of warranty" in swapped["intent_check"]["reason"]
    # the offline judge scores the changed side 0 on every dimension: a loss to the reference
    assert swapped["judge_verdict"]["better"] == "reference"
    assert swapped["judge_verdict"]["candidate"]["sum"] == 0.0
    assert swapped["judge"] < 0.0 <= kept["judge"]
    assert swapped["judge_verdict"]["intent_changed"]["8b"] == swapped["intent_check"]["reason"]
    assert swapped["score"] < kept["score"] - QueryRewriteConfig().intent_penalty
    off = _score(row, _answer("你好，朗月Max8平板电脑能七天无理由退吗？"), intent_penalty=0.0)
    assert off["score"] == pytest.approx(swapped["score"] + QueryRewriteConfig().intent_penalty)
    doubled = _score(row, _answer("你好，朗月Max8平板电脑能七天无理由退吗？"), intent_penalty=2.5)
    assert doubled["score"] == pytest.approx(off["score"] - 2.5)
    same = _score(row, _answer("朗月Max8平板电脑保修政策是什么？"), intent_penalty=0.0)
    assert same["score"] == pytest.approx(kept["score"])  # a kept rewrite pays nothing


def test_an_answer_with_invented_facts_scores_below_the_question() -> None:
    row = _row(["朗月Max8平板电脑多少钱", "价格是 1998 哦"], "那保修多久", "朗月 Max8 平板电脑 保修")
    asked = _score(row, _answer("朗月Max8 保修多久"))
    answered = _score(row, _answer("朗月Max8 保修是3年"))
    assert asked["intent/changed"] == 0.0
    assert answered["intent_check"]["code"] == "answered"
    assert "3" in answered["intent_check"]["reason"]
    assert answered["score"] < asked["score"]


def test_unparsed_text_stays_below_any_parseable_rewrite() -> None:
    """The penalty must not teach the policy to stop answering in the format: unparsed text asks nothing."""
    row = _row([], WARRANTY_TURN, WARRANTY_TITLE)
    unparsed = _score(row, "我觉得用户想问退货")
    changed = _score(row, _answer("星辰 X3 多少钱"))
    assert unparsed["intent_check"]["code"] == "no_query"
    assert changed["intent/changed"] == 1.0
    assert unparsed["score"] < changed["score"]


def test_intent_metrics_per_step() -> None:
    pop_reward_metrics()  # what earlier tests left
    row = _row([], WARRANTY_TURN, WARRANTY_TITLE)
    for query in ("朗月Max8平板电脑保修政策是什么？", "朗月Max8 保修", "朗月Max8 能七天无理由退吗", "朗月Max8 多少钱"):
        _score(row, _answer(query))
    metrics = pop_reward_metrics()
    assert metrics["reward/intent/changed"] == pytest.approx(0.5)
    assert metrics["reward/intent/checked"] == 4.0
    assert pop_intent_metrics() == {}  # reset by the pop


def test_with_intent_checks_its_penalty() -> None:
    verdict = IntentVerdict(False, "question_changed", "asks return instead of warranty")
    result = {"score": 1.0, "format": 1.0}
    assert with_intent(result, None, 1.0, "mix", {})["score"] == 1.0  # no conversation: unchecked
    assert with_intent(result, verdict, 0.25, "mix", {})["score"] == pytest.approx(0.75)
    row = _row([], WARRANTY_TURN, WARRANTY_TITLE)
    for bad in (-1.0, float("nan"), "a lot", None):  # the settings are checked before any reply is scored
        with pytest.raises(ConfigError, match=r"intent_penalty"):
            _score(row, _answer("朗月Max8 保修"), intent_penalty=bad)
    garbled = IntentVerdict(False, "garbled", "garbled: replacement character U+FFFD")
    out = with_intent(result, garbled, 0.0, "mix", {"format": 0.2})
    assert (out["score"], out["format"]) == (pytest.approx(0.8), 0.0)
    seed = with_intent(result, garbled, 0.0, "seed_hybrid", {"format": 0.2})
    assert (seed["score"], seed["format"]) == (1.0, 0.0)  # seed_hybrid's score has no format term


def test_the_config_key_reaches_the_reward_and_is_checked() -> None:
    cfg = load_config(None, ["app.query_rewrite.intent_penalty=0.5"], allow_missing=True)
    assert settings_of(cfg).intent_penalty == 0.5
    assert QueryRewriteConfig().intent_penalty == 1.0  # on by default
    with pytest.raises(ConfigError, match=r"app\.query_rewrite\.intent_penalty must be >= 0"):
        load_config(None, ["app.query_rewrite.intent_penalty=-1"], allow_missing=True)
    with pytest.raises(ConfigError, match=r"did you mean app\.query_rewrite\.intent_penalty"):
        load_config(None, ["app.query_rewrite.intent_penalti=1"], allow_missing=True)


def _result(query: str, ids: list[str]) -> dict[str, Any]:
    return {"rewritten_query": query, "response": [{"doc_id": i, "title": i, "content": ""} for i in ids]}


def test_offline_judge_scores_an_intent_change_zero() -> None:
    contexts = [{"role": "user", "content": WARRANTY_TURN}]
    judge = OfflineJudge(top_k=5)
    faithful, swapped = _result("朗月Max8 保修", ["g"]), _result("朗月Max8 能七天无理由退吗", ["g"])
    verdict = judge.judge(contexts, swapped, faithful, ["g"])
    assert verdict is not None
    assert verdict["better"] == "32b"
    assert verdict["score"]["8b"] == dict.fromkeys(verdict["score"]["8b"], 0.0)
    assert verdict["score"]["32b"] == judge.side_scores(faithful, ["g"])
    assert "return instead of warranty" in verdict["intent_changed"]["8b"]
    both = judge.judge(contexts, faithful, faithful, ["g"])
    assert both is not None
    assert both["better"] == "same"
    assert "intent_changed" not in both
    reference_changed = judge.judge(contexts, faithful, swapped, ["g"])  # either side is checked
    assert reference_changed is not None
    assert reference_changed["better"] == "8b"
    assert judge.judge([], swapped, faithful, ["g"]) == both  # no conversation: nothing to check
    # the CRM summary is part of the conversation: a product named only there is no invention
    followup = [{"role": "user", "content": "还是我，上次那款有没有赠品?"}]
    carried = _result("上次那款有没有赠品 air1", ["g"])
    assert "intent_changed" in (judge.judge(followup, carried, carried, ["g"]) or {})
    assert "intent_changed" not in (judge.judge(followup, carried, carried, ["g"], sources=["问过 Air1"]) or {})


def test_the_llm_judge_rubric_says_a_changed_question_is_worse() -> None:
    contexts = [{"role": "user", "content": WARRANTY_TURN}]
    for lang, words in (
        ("zh", ("改变了用户当前的问题", "直接回答了问题", "编造", "乱码")),
        ("en", ("intent", "answers it", "invents facts", "garbled")),
    ):
        system = build_judge_messages(contexts, _result("a", []), _result("b", []), lang=lang)[0]["content"]
        for word in words:
            assert word in system, (lang, word)
