"""Turns that need no retrieval, end to end: the reward (no RAG call), the offline judge, the evaluation."""

from __future__ import annotations

import asyncio
import json
import socket
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from queryrl.apps.query_rewrite.config import QueryRewriteConfig
from queryrl.apps.query_rewrite.demo.data import sales_demo_rows
from queryrl.apps.query_rewrite.eval.run import evaluate
from queryrl.apps.query_rewrite.eval.samples import load_samples
from queryrl.apps.query_rewrite.metrics import abstained_result, no_retrieval_turn, system_metrics
from queryrl.apps.query_rewrite.reward.judging import OfflineJudge, quality_from_verdict
from queryrl.apps.query_rewrite.reward.score import compute_score
from queryrl.config import load_config

WEIGHTS = {"judge": 0.5, "retrieval_rank": 1.0, "format": 0.2}  # the demo's


@cache
def _rows() -> list[dict[str, Any]]:
    return sales_demo_rows("val")


def _of_kind(kind: str) -> dict[str, Any]:
    return next(r for r in _rows() if r["extra_info"]["turn_type"] == kind)


def _answer(query: str) -> str:
    return json.dumps({"rewritten_query": query, "user_profile": "", "history_summary": ""}, ensure_ascii=False)


def _closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _score(row: dict[str, Any], solution: str, **kwargs: Any) -> dict[str, float]:
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    return asyncio.run(compute_score(row["data_source"], solution, gt, info, weights=WEIGHTS, **kwargs))


def test_no_retrieval_turn_rewards_the_empty_query_without_any_service_call() -> None:
    row = _of_kind("chitchat")
    assert not row["reward_model"]["ground_truth"]["gold_doc_ids"]
    down = _closed_url()  # nothing listens there: any RAG call would fail the sample
    empty = _score(row, _answer(""), rag_url=down, rag_max_retries=0, rag_timeout_s=1.0)
    assert empty["score"] == pytest.approx(0.5 * 1.0 + 1.0 * 2.0 + 0.2 * 1.0)
    assert empty["format"] == 1.0
    assert empty["retrieval_rank"] == 2.0
    assert empty["quality"] == 1.0
    assert empty["abstained"] == 1.0
    # a query there retrieves noise: judge -1 (quality 0) and retrieval_rank 0, still no call
    query = _score(row, _answer(row["extra_info"]["contexts"][-1]["content"]), rag_url=down, rag_max_retries=0)
    assert query["score"] == pytest.approx(-0.5 + 0.0 + 0.2)
    assert query["quality"] == 0.0
    assert query["abstained"] == 0.0
    # with the users' hybrid formula too
    hybrid = _score(row, _answer(""), rag_url=down, mode="seed_hybrid")
    assert hybrid["score"] == pytest.approx(0.85 * 1.0)


def test_retrieval_turn_gives_the_empty_query_the_lowest_well_formed_reward() -> None:
    row = _of_kind("pronoun")
    down = _closed_url()
    empty = _score(row, _answer(""), rag_url=down, rag_max_retries=0)  # no call for it either
    # ... and it drops the customer's question: the intent penalty too (reward_intent.py)
    assert empty["score"] == pytest.approx(-0.5 + 0.0 + 0.2 - QueryRewriteConfig().intent_penalty)
    assert empty["intent_check"]["code"] == "empty"
    assert empty["recall_at_5"] == 0.0
    assert empty["abstained"] == 1.0
    # the embedded service: any real rewrite scores at least as much, and the title of the gold document more
    title = next(d for d in _catalogue() if d["doc_id"] == row["reward_model"]["ground_truth"]["gold_doc_ids"][0])
    good = _score(row, _answer(title["title"]))
    bad = _score(row, _answer("你好"))
    assert good["score"] > bad["score"] >= empty["score"]
    assert good["abstained"] == 0.0
    garbage = _score(row, "not json")
    assert garbage["score"] < empty["score"]


@cache
def _catalogue() -> list[dict[str, Any]]:
    from queryrl.apps.query_rewrite.demo.data import make_catalogue

    return make_catalogue()


def _result(*ids: str) -> dict[str, Any]:
    return {"response": [{"doc_id": d, "title": d, "content": d} for d in ids], "rewritten_query": "q" if ids else ""}


def test_offline_judge_on_both_sides_of_the_decision() -> None:
    judge = OfflineJudge(top_k=5)
    noise = _result("a", "b", "c")
    # a no-retrieval turn: abstaining beats retrieving noise, in either position; two abstentions tie
    v = judge.judge([], abstained_result(), noise, [], no_retrieval=True)
    assert v is not None
    assert v["better"] == "8b"
    assert v["score"]["8b"]["sum"] == 40.0
    assert v["score"]["32b"]["sum"] == 0
    assert quality_from_verdict(v) == 1.0
    v = judge.judge([], noise, abstained_result(), [], no_retrieval=True)
    assert v is not None
    assert v["better"] == "32b"
    assert quality_from_verdict(v) == 0.0
    v = judge.judge([], abstained_result(), abstained_result(), [], no_retrieval=True)
    assert v is not None
    assert v["better"] == "same"
    v = judge.judge([], noise, _result("d"), [], no_retrieval=True)  # both wrong
    assert v is not None
    assert v["better"] == "same"
    assert v["score"]["8b"]["sum"] == 0.0
    # a retrieval turn: abstaining loses to finding the gold document
    v = judge.judge([], abstained_result(), _result("x", "g"), ["g"])
    assert v is not None
    assert v["better"] == "32b"
    assert v["score"]["8b"]["sum"] == 0.0
    assert judge.judge([], abstained_result(), noise, []) is None  # no gold, no label: cannot judge


def test_evaluation_on_a_mixed_set(tmp_path: Path, model_cache: Path) -> None:
    out = tmp_path / "eval.json"
    report = evaluate(
        "builtin://sales_demo/test",
        "raw_turn,concat_last3,reference",
        out,
        load_config(None, ["app.query_rewrite.judge.backend=offline"], allow_missing=True),
        judge=True,
        max_samples=60,
        n_boot=50,
        cache_dir=str(model_cache),
        echo=None,
    )
    systems = report["systems"]
    samples = [json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    quiet = [s for s in samples if not s["gold"]]
    assert quiet
    assert all(s["kind"] == "chitchat" for s in quiet)
    for _name, m in systems.items():
        # retrieval metrics over the retrieval turns only; the no-retrieval turns on their own metric
        assert m["n"] == 60 - len(quiet)
        assert m["n_skipped"] == len(quiet) == m["n_no_retrieval"]
        assert m["false_abstain"] == 0.0
        assert m["by_kind"]["chitchat"]["n"] == len(quiet)
        assert "recall@5" not in m["by_kind"]["chitchat"]
    assert systems["raw_turn"]["abstain_accuracy"] == 0.0  # the baselines never abstain
    assert systems["concat_last3"]["abstain_accuracy"] == 0.0
    assert 0.0 < systems["reference"]["abstain_accuracy"] < 1.0  # the heuristic knows some small talk
    table = (tmp_path / "eval.json").read_text(encoding="utf-8")
    assert "abstain_accuracy" in table
    # where the reference abstained and the raw turn retrieved something (noise), the raw turn lost; the
    # judge reads results only, so a query that finds nothing ("在吗" matches no document) ties
    abstained = [s for s in quiet if s["systems"]["reference"]["query"] == ""]
    assert abstained
    for s in abstained:
        assert s["systems"]["reference"]["top5"] == []
        assert s["systems"]["raw_turn"]["verdict"] == ("32b" if s["systems"]["raw_turn"]["top5"] else "same")
    assert any(s["systems"]["raw_turn"]["top5"] for s in abstained)


def test_system_metrics_of_a_system_that_abstains(model_cache: Path) -> None:
    samples = load_samples("builtin://sales_demo/test", 80, str(model_cache))
    quiet = [no_retrieval_turn(s.gold, s.kind) for s in samples]
    ranked = [[] if q else list(s.gold) for s, q in zip(samples, quiet, strict=True)]
    perfect = system_metrics(ranked, samples, [True] * 80, [True] * 80, [1, 5], 20, 0, abstained=quiet)
    assert perfect["abstain_accuracy"] == 1.0
    assert perfect["false_abstain"] == 0.0
    assert perfect["recall@5"] == 1.0  # over the retrieval turns only
    always = system_metrics([[]] * 80, samples, [True] * 80, [True] * 80, [1, 5], 20, 0, abstained=[True] * 80)
    assert always["abstain_accuracy"] == 1.0
    assert always["false_abstain"] == 1.0
    assert always["recall@5"] == 0.0
