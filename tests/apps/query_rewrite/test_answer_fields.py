"""Query-only answers by default, the domain line, cut-off replies: from the prepared rows (prompt, SFT
target, ``extra_info``) through the reward (what ``/rag/chat_8b`` receives) and eval to the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.data.conversations import conversations_to_rows
from queryrl.apps.query_rewrite.data.kdconv import kdconv_domain, kdconv_rows
from queryrl.apps.query_rewrite.data.sft_targets import SFT_TARGET_KEY, add_sft_targets
from queryrl.apps.query_rewrite.demo.data import DOMAIN, sales_demo_rows
from queryrl.apps.query_rewrite.prompts import ANSWER_FIELDS, ParsedRewrite
from queryrl.apps.query_rewrite.reward.modes import format_reward, parse_answer
from queryrl.apps.query_rewrite.reward.score import compute_score
from queryrl.cli import app
from queryrl.data.records import load_records
from queryrl.rewards import RewardInput, make_reward_manager
from queryrl.rewards.manager import summarize
from tests.apps.query_rewrite.helpers import CONVERSATION
from tests.apps.query_rewrite.helpers import demo_row as _row
from tests.apps.query_rewrite.helpers import gold_title as _query
from tests.apps.query_rewrite.helpers import write_log as _log
from tests.helpers import KDCONV, needs_kdconv

runner = CliRunner()


# --- rows and SFT targets ----------------------------------------------------------------------------


def test_rows_ask_for_the_query_only_by_default_and_record_it() -> None:
    rows = add_sft_targets(conversations_to_rows([CONVERSATION], "logs"))
    for row in rows:
        info = row["extra_info"]
        assert info["answer_fields"] == ["rewritten_query"]
        assert info["domain"] == "客服对话"
        assert "场景：客服对话。" in row["prompt"][0]["content"]
        assert list(json.loads(info[SFT_TARGET_KEY])) == ["rewritten_query"]  # exactly the row's fields
    # the profile and summary are still shown to the policy as inputs
    assert "学生" in rows[1]["prompt"][1]["content"]
    assert "问过星辰 X3 的价格" in rows[1]["prompt"][1]["content"]


def test_sft_targets_have_exactly_the_fields_the_row_asked_for() -> None:
    rows = conversations_to_rows([CONVERSATION], "logs", domain="电子产品销售客服", answer_fields=ANSWER_FIELDS)
    rows = add_sft_targets(rows)
    second = rows[1]
    assert second["extra_info"]["answer_fields"] == list(ANSWER_FIELDS)
    assert "场景：电子产品销售客服。" in second["prompt"][0]["content"]
    assert "user_profile" in second["prompt"][0]["content"]
    target = json.loads(second["extra_info"][SFT_TARGET_KEY])
    assert list(target) == list(ANSWER_FIELDS)
    assert (target["user_profile"], target["history_summary"]) == ("学生", "问过星辰 X3 的价格")  # carried over
    partial = add_sft_targets(
        conversations_to_rows([CONVERSATION], "x", answer_fields=["history_summary", "rewritten_query"])
    )
    assert list(json.loads(partial[1]["extra_info"][SFT_TARGET_KEY])) == ["rewritten_query", "history_summary"]


def test_sales_demo_rows_say_electronics_sales_and_answer_only_the_query() -> None:
    rows = sales_demo_rows("val")
    assert DOMAIN == "电子产品销售客服"
    assert all(f"场景：{DOMAIN}。" in r["prompt"][0]["content"] for r in rows)
    targets = [json.loads(r["extra_info"][SFT_TARGET_KEY]) for r in rows]
    assert all(list(t) == ["rewritten_query"] for t in targets)
    assert all(r["extra_info"]["answer_fields"] == ["rewritten_query"] for r in rows)
    # the chitchat turns still get an empty target query: "no retrieval needed"
    chitchat = [t for r, t in zip(rows, targets, strict=True) if r["extra_info"]["turn_type"] == "chitchat"]
    assert chitchat
    assert all(t["rewritten_query"] == "" for t in chitchat)


def test_kdconv_domain_from_the_path() -> None:
    assert kdconv_domain("data/kdconv/travel/dev.json") == "旅游咨询（北京的景点）"
    assert kdconv_domain("x/dev.json", "x/kb_film.json") == "电影知识问答"
    assert kdconv_domain("music/test.json", lang="en") == "music, songs and singers"
    assert kdconv_domain("somewhere/dev.json") == "客服对话"  # nothing names a domain: the neutral default


@needs_kdconv()
def test_kdconv_rows_say_travel() -> None:
    rows = kdconv_rows(KDCONV / "dev.json")[:3]
    assert all("场景：旅游咨询（北京的景点）。" in r["prompt"][0]["content"] for r in rows)
    assert all("销售" not in r["prompt"][0]["content"] for r in rows)
    custom = kdconv_rows(KDCONV / "dev.json", domain="北京旅游", answer_fields=ANSWER_FIELDS)[0]
    assert "场景：北京旅游。" in custom["prompt"][0]["content"]
    assert custom["extra_info"]["answer_fields"] == list(ANSWER_FIELDS)


# --- the reward: what /rag/chat_8b receives, the truncated count -------------------------------------


def _score(row: dict[str, Any], answer: str, url: str, **info: Any) -> dict[str, float]:
    gt = row["reward_model"]["ground_truth"]
    kwargs = {"rag_url": url, "weights": {"judge": 0.0}}
    return asyncio.run(compute_score(row["data_source"], answer, gt, {**row["extra_info"], **info}, **kwargs))


def test_a_query_only_answer_sends_the_rows_profile_and_summary(recording_rag: tuple[str, list[Any]]) -> None:
    url, bodies = recording_rag
    row = _row()
    query = _query(row)
    _score(row, json.dumps({"rewritten_query": query}, ensure_ascii=False), url)
    body = bodies[-1]
    assert body["rewritten_query"] == query
    assert body["user_profile"] == row["extra_info"]["user_profile"]
    assert body["history_summary"] == row["extra_info"]["history_summary"]
    # an answer that updates them is sent as answered
    answer = {"rewritten_query": query, "user_profile": "企业采购", "history_summary": "问过三款"}
    _score(row, json.dumps(answer, ensure_ascii=False), url, answer_fields=list(ANSWER_FIELDS))
    assert (bodies[-1]["user_profile"], bodies[-1]["history_summary"]) == ("企业采购", "问过三款")


def test_a_truncated_answer_is_scored_and_counted(recording_rag: tuple[str, list[Any]]) -> None:
    url, bodies = recording_rag
    row = _row()
    query = _query(row)
    whole = _score(row, json.dumps({"rewritten_query": query}, ensure_ascii=False), url)
    cut_text = json.dumps({"rewritten_query": query}, ensure_ascii=False)[:-1] + ', "user_profile": "学生, 预'
    cut = _score(row, cut_text, url)
    assert bodies[-1]["rewritten_query"] == query
    assert bodies[-1]["user_profile"] == row["extra_info"]["user_profile"]  # the cut profile is not sent
    assert cut["format/truncated"] == 1.0
    assert whole["format/truncated"] == 0.0
    assert cut["format"] == 1.0  # query-only row: full format credit
    assert cut["score"] == pytest.approx(whole["score"])
    # a row whose prompt asked for profile and summary too: the cut lost them, half the format credit
    asked_all = _score(row, cut_text, url, answer_fields=list(ANSWER_FIELDS))
    assert asked_all["format"] == 0.5
    assert asked_all["score"] == pytest.approx(whole["score"] - 0.2 * 0.5)  # format weight 0.2
    garbage = _score(row, '{"rewritten_query": "星辰', url)  # cut inside the query: a format failure
    assert (garbage["format"], garbage["format/truncated"]) == (0.0, 0.0)


def test_the_truncated_share_is_logged_as_reward_format_truncated(recording_rag: tuple[str, list[Any]]) -> None:
    url, _ = recording_rag
    row = _row()
    whole = json.dumps({"rewritten_query": _query(row)}, ensure_ascii=False)
    cut = whole[:-1] + ', "history_summary": "问过'
    manager = make_reward_manager("async", compute_score, {"rag_url": url, "weights": {"judge": 0.0}})
    try:
        gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
        results = manager.score([RewardInput(row["data_source"], s, gt, info) for s in (whole, cut, cut, "x")])
    finally:
        manager.close()
    assert not any(r.failed for r in results)
    assert summarize(results)["reward/format/truncated/mean"] == pytest.approx(0.5)


def test_format_credit_of_a_truncated_answer() -> None:
    assert format_reward(True, "X3 续航", 256) == 1.0
    assert format_reward(True, "X3 续航", 256, missing_fields=True) == 0.5  # lost a field it was asked for
    assert format_reward(True, "长" * 300, 256, missing_fields=True) == 0.0
    assert format_reward(False, None, 256, missing_fields=True) == 0.0
    # the reward's parser: an empty (abstaining) query in a cut-off reply is an answer too
    assert parse_answer('{"rewritten_query": "", "user_profile": "学') == ParsedRewrite("", truncated=True)
    assert parse_answer('{"rewritten_query": "X3", "user_profile": 3, "history_summary": "问') is None


# --- eval: the model's reply without profile/summary gets the sample's -------------------------------


@pytest.mark.slow
def test_eval_model_answers_fall_back_to_the_samples_profile_and_summary(
    tiny_cfg: DictConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import queryrl.trainer.scoring
    from queryrl.apps.query_rewrite.eval.generation import model_answers
    from queryrl.apps.query_rewrite.eval.samples import load_samples
    from queryrl.models.loading import resolve_model_path

    samples = [s for s in load_samples("builtin://sales_demo/val") if s.user_profile and s.history_summary][:3]
    replies = [
        '{"rewritten_query": "星辰 X3 续航"}',  # query only
        '{"rewritten_query": "星辰 X3 续航", "user_profile": "企业采购", "history_summary": "问过三款"}',
        '{"rewritten_query": "星辰 X3 续航", "user_profile": "学',  # cut off
    ]
    # the reply text is fixed here (an untrained tiny model writes no JSON); model_answers parses it
    monkeypatch.setattr(queryrl.trainer.scoring, "decode_responses", lambda tok, chunk: replies[: len(chunk)])
    folder = resolve_model_path(tiny_cfg.model)
    answers = model_answers(folder, samples, batch_size=3, max_new_tokens=1, device="cpu")
    assert [a.query for a in answers] == ["星辰 X3 续航"] * 3
    for sample, answer in zip((samples[0], samples[2]), (answers[0], answers[2]), strict=True):
        assert (answer.user_profile, answer.history_summary) == (sample.user_profile, sample.history_summary)
    assert (answers[1].user_profile, answers[1].history_summary) == ("企业采购", "问过三款")


# --- the CLI -----------------------------------------------------------------------------------------


def test_prepare_conversations_answer_fields_and_domain(tmp_path: Path) -> None:
    log = _log(tmp_path / "log.csv")
    base = ["prepare", "conversations", "--input", str(log), "--val-fraction", "0", "--test-fraction", "0"]
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "default")])
    assert result.exit_code == 0, result.output
    (row, *_) = load_records(tmp_path / "default" / "train.parquet")
    assert list(row["extra_info"]["answer_fields"]) == ["rewritten_query"]
    assert "场景：客服对话。" in row["prompt"][0]["content"]
    assert list(json.loads(row["extra_info"][SFT_TARGET_KEY])) == ["rewritten_query"]

    fields = "rewritten_query,user_profile,history_summary"
    out = tmp_path / "all"
    result = runner.invoke(app, [*base, "--out", str(out), "--answer-fields", fields, "--domain", "电子产品销售客服"])
    assert result.exit_code == 0, result.output
    rows = load_records(out / "train.parquet")
    assert len(rows) == 6
    for row in rows:
        assert list(row["extra_info"]["answer_fields"]) == list(ANSWER_FIELDS)
        assert row["extra_info"]["domain"] == "电子产品销售客服"
        assert "场景：电子产品销售客服。" in row["prompt"][0]["content"]
        assert list(json.loads(row["extra_info"][SFT_TARGET_KEY])) == list(ANSWER_FIELDS)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [("user_profile", "must include 'rewritten_query'"), ("rewritten_query,summary", "unknown 'summary'")],
)
def test_prepare_conversations_rejects_bad_answer_fields(tmp_path: Path, fields: str, problem: str) -> None:
    out = tmp_path / "out"
    args = ["prepare", "conversations", "--input", str(_log(tmp_path / "log.csv")), "--out", str(out)]
    result = runner.invoke(app, [*args, "--answer-fields", fields])
    assert result.exit_code == 2
    assert "--answer-fields" in result.output
    assert problem in result.output
    assert not out.exists()  # nothing written


@needs_kdconv()
def test_prepare_kdconv_answer_fields_and_domain(tmp_path: Path) -> None:
    args = ["prepare", "kdconv", "--input", str(KDCONV / "dev.json"), "--kb", str(KDCONV / "kb_travel.json")]
    result = runner.invoke(
        app, [*args, "--out", str(tmp_path / "a"), "--answer-fields", "rewritten_query,user_profile"]
    )
    assert result.exit_code == 0, result.output
    row = load_records(tmp_path / "a" / "dev.parquet")[0]
    assert list(row["extra_info"]["answer_fields"]) == ["rewritten_query", "user_profile"]
    assert "场景：旅游咨询（北京的景点）。" in row["prompt"][0]["content"]  # from the path: travel
    assert list(json.loads(row["extra_info"][SFT_TARGET_KEY])) == ["rewritten_query", "user_profile"]

    result = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--domain", "北京景点导览"])
    assert result.exit_code == 0, result.output
    row = load_records(tmp_path / "b" / "dev.parquet")[0]
    assert "场景：北京景点导览。" in row["prompt"][0]["content"]
    assert list(row["extra_info"]["answer_fields"]) == ["rewritten_query"]

    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "c"), "--answer-fields", "query"])
    assert bad.exit_code == 2
    assert "--answer-fields: unknown 'query'" in bad.output
    assert not (tmp_path / "c").exists()


# --- the frozen-policy reference rewriter --------------------------------------------------------------


def test_policy_rewriter_uses_the_rows_prompt_and_accepts_empty_and_cut_answers(tiny_cfg: DictConfig) -> None:
    import torch

    from queryrl.apps.query_rewrite.policy_rewriter import PolicyRewriter
    from queryrl.models.loading import resolve_model_path

    rewriter = PolicyRewriter(resolve_model_path(tiny_cfg.model), domain=DOMAIN)
    prompts: list[str] = []
    reply: list[str] = []

    def generate(input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        """The untrained tiny model writes no JSON: its continuation is fixed here, through its tokenizer."""
        prompts.append(rewriter.tokenizer.decode(input_ids[0]))
        answer = rewriter.tokenizer(reply[0], return_tensors="pt", add_special_tokens=False)["input_ids"]
        return torch.cat([input_ids, answer], dim=1)

    rewriter.model.generate = generate
    contexts = [{"role": "user", "content": "在吗？"}]
    reply[:] = ['{"rewritten_query": ""}']
    assert rewriter.rewrite_sync(contexts) == ""  # no retrieval needed: not the fallback
    assert f"场景：{DOMAIN}。" in prompts[-1]
    assert "user_profile" not in prompts[-1]
    reply[:] = ['{"rewritten_query": "星辰 X3 续航", "user_profile": "学']
    assert rewriter.rewrite_sync([{"role": "user", "content": "星辰 X3 续航怎么样"}]) == "星辰 X3 续航"
    reply[:] = ['{"rewritten_query": "星辰']
    assert rewriter.rewrite_sync([{"role": "user", "content": "星辰 X3 续航怎么样"}]) == "星辰 X3 续航怎么样"
    assert (rewriter.fallbacks, rewriter.truncated) == (1, 1)
