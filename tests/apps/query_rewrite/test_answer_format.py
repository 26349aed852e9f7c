"""The plain-text answer format (``answer_format=text``): the prompt, the parser, the prepared rows and their
SFT targets, the reward (a retrieval signal for a model that does not stop after its line) and eval."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.data.conversations import conversations_to_rows
from queryrl.apps.query_rewrite.data.sft_targets import SFT_TARGET_KEY, add_sft_targets
from queryrl.apps.query_rewrite.prompts import (
    NO_QUERY,
    ParsedRewrite,
    build_messages,
    check_answer_format,
    parse_text_answer,
    system_prompt,
)
from queryrl.apps.query_rewrite.reward.modes import parse_answer
from queryrl.apps.query_rewrite.reward.score import compute_score
from queryrl.cli import app
from queryrl.data.records import load_records
from tests.apps.query_rewrite.helpers import CONVERSATION
from tests.apps.query_rewrite.helpers import demo_row as _row
from tests.apps.query_rewrite.helpers import gold_title as _query
from tests.apps.query_rewrite.helpers import write_log as _log
from tests.helpers import KDCONV, needs_kdconv

runner = CliRunner()
HISTORY = [
    {"role": "user", "content": "故宫门票多少钱？"},
    {"role": "assistant", "content": "旺季60元。"},
    {"role": "user", "content": "几点开门？"},
]


# --- the prompt and the parser --------------------------------------------------------------------------


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_text_prompt_asks_for_one_line_and_ends_with_the_cue(lang: str) -> None:
    system = system_prompt(lang, answer_format="text")
    assert "JSON" not in system
    assert "rewritten_query" not in system
    assert "{" not in system
    assert NO_QUERY[lang] in system
    assert "空字符串" not in system
    assert "empty query" not in system
    user = build_messages(HISTORY, lang=lang, answer_format="text")[1]["content"]
    assert user.splitlines()[-1] == {"zh": "改写后的查询：", "en": "Rewritten query:"}[lang]
    json_user = build_messages(HISTORY, lang=lang)[1]["content"]
    assert user.startswith(json_user)  # the same inputs, the cue added


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("故宫几点开门", ParsedRewrite("故宫几点开门")),
        ("  查询：“故宫 几点开门” \n\n", ParsedRewrite("故宫 几点开门")),
        ("改写后的查询：\n故宫几点开门", ParsedRewrite("故宫几点开门")),  # the cue repeated on its own line
        ("故宫几点开门\n当前问题：几点关门？", ParsedRewrite("故宫几点开门", trailing=True)),
        ("无需检索", ParsedRewrite("")),
        ("无需检索。", ParsedRewrite("")),
        (' "No search."', ParsedRewrite("")),
        ("无需检索故宫", ParsedRewrite("无需检索故宫")),  # not the marker alone: a query
        ("", None),
        ("\n  \n", None),
        ("故" * 300, None),  # an essay is not a query
        (None, None),
        (42, None),
    ],
)
def test_parse_text_answer(reply: Any, expected: ParsedRewrite | None) -> None:
    assert parse_text_answer(reply) == expected
    assert parse_answer(reply, answer_format="text") == expected


def test_a_json_reply_on_a_text_row_is_its_first_line_and_a_text_reply_on_a_json_row_does_not_parse() -> None:
    assert parse_answer('{"rewritten_query": "故宫几点开门"}', answer_format="json") == ParsedRewrite("故宫几点开门")
    assert parse_answer("故宫几点开门", answer_format="json") is None
    text = parse_answer('{"rewritten_query": "故宫几点开门"}', answer_format="text")
    assert text is not None
    assert text.rewritten_query.startswith("{")


@pytest.mark.parametrize(
    ("fmt", "fields", "problem"),
    [
        ("xml", None, "unknown 'xml'; choose from json, text"),
        ("text", ["rewritten_query", "user_profile"], "'text' answers the query only"),
    ],
)
def test_check_answer_format_names_the_problem(fmt: str, fields: list[str] | None, problem: str) -> None:
    with pytest.raises(ValueError, match="--answer-format") as err:
        check_answer_format(fmt, fields, "--answer-format")
    assert problem in str(err.value)
    assert check_answer_format(None) == "json"


# --- rows and SFT targets -------------------------------------------------------------------------------


def test_text_rows_carry_the_format_and_plain_sft_targets() -> None:
    rows = add_sft_targets(conversations_to_rows([CONVERSATION], "logs", answer_format="text"))
    assert len(rows) == 2
    for row in rows:
        info = row["extra_info"]
        assert (info["answer_format"], info["lang"]) == ("text", "zh")
        assert row["prompt"][1]["content"].endswith("改写后的查询：")
        target = info[SFT_TARGET_KEY]
        assert target
        assert "\n" not in target
        assert not target.startswith("{")
        assert parse_text_answer(target) == ParsedRewrite(target)  # the target parses as itself
    json_rows = add_sft_targets(conversations_to_rows([CONVERSATION], "logs"))
    assert json_rows[0]["extra_info"]["answer_format"] == "json"
    for text_row, json_row in zip(rows, json_rows, strict=True):  # the same reference query, in either format
        query = json.loads(json_row["extra_info"][SFT_TARGET_KEY])["rewritten_query"]
        assert text_row["extra_info"][SFT_TARGET_KEY] == query


def test_a_turn_that_needs_no_retrieval_has_the_no_query_marker_as_its_target() -> None:
    from queryrl.apps.query_rewrite.data.conversations import Conversation, Message

    chat = Conversation("c2", [Message("user", "谢谢", 0, kind="chitchat")])
    (row,) = add_sft_targets(conversations_to_rows([chat], "logs", answer_format="text"))
    assert row["extra_info"][SFT_TARGET_KEY] == "无需检索"
    assert parse_text_answer(row["extra_info"][SFT_TARGET_KEY]) == ParsedRewrite("")


# --- the reward -------------------------------------------------------------------------------------------


def _score(row: dict[str, Any], answer: str, url: str) -> dict[str, Any]:
    gt = row["reward_model"]["ground_truth"]
    info = {**row["extra_info"], "answer_format": "text"}
    kwargs = {"rag_url": url, "weights": {"judge": 0.0}}
    return asyncio.run(compute_score(row["data_source"], answer, gt, info, **kwargs))


def test_a_text_answer_is_retrieved_with_and_text_after_it_costs_the_format_credit(
    recording_rag: tuple[str, list[Any]],
) -> None:
    url, bodies = recording_rag
    row = _row()
    query = _query(row)
    clean = _score(row, query, url)
    assert bodies[-1]["rewritten_query"] == query
    assert (clean["format"], clean["format/trailing"]) == (1.0, 0.0)
    assert clean["retrieval_rank"] > 0  # the gold title finds the gold document
    rambling = _score(row, f"{query}\n当前问题：还有别的颜色吗？\n{query}", url)
    assert bodies[-1]["rewritten_query"] == query  # the first line only
    assert (rambling["format"], rambling["format/trailing"]) == (0.0, 1.0)
    assert rambling["retrieval_rank"] == clean["retrieval_rank"]
    assert rambling["score"] == pytest.approx(clean["score"] - 0.2)  # format weight 0.2
    wrong = _score(row, "今天天气怎么样", url)
    assert wrong["format"] == 1.0
    assert wrong["retrieval_rank"] < clean["retrieval_rank"]
    assert len({clean["score"], rambling["score"], wrong["score"]}) == 3  # a group of these has a signal
    nothing = _score(row, "\n\n", url)  # no line at all: the floor, no service call
    assert nothing["format"] == 0.0
    assert nothing["retrieval_rank"] == 0.0
    no_query = _score(row, "无需检索", url)  # an abstention on a turn with gold: the floor, well-formed
    assert (no_query["format"], no_query["abstained"]) == (1.0, 1.0)
    assert no_query["score"] < wrong["score"] or no_query["retrieval_rank"] == 0.0


# --- eval and the CLI ---------------------------------------------------------------------------------------


def test_eval_parses_each_row_as_its_prompt_asked_and_text_after_the_line_is_not_format_ok(
    tiny_cfg: DictConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import queryrl.trainer.scoring
    from queryrl.apps.query_rewrite.eval.generation import model_answers
    from queryrl.apps.query_rewrite.eval.samples import load_samples
    from queryrl.models.loading import resolve_model_path

    samples = [dataclasses.replace(s, answer_format="text") for s in load_samples("builtin://sales_demo/val")[:3]]
    replies = ["星辰 X3 续航", "星辰 X3 续航\n当前问题：", '{"rewritten_query": "x']
    monkeypatch.setattr(queryrl.trainer.scoring, "decode_responses", lambda tok, chunk: replies[: len(chunk)])
    answers = model_answers(resolve_model_path(tiny_cfg.model), samples, batch_size=3, max_new_tokens=1)
    assert [a.query for a in answers[:2]] == ["星辰 X3 续航"] * 2
    assert [a.trailing for a in answers] == [False, True, False]
    assert answers[2].query == '{"rewritten_query": "x'  # a line: a (bad) query, not a parse failure


def test_prepare_conversations_text_format_and_a_bad_format(tmp_path: Path) -> None:
    log = _log(tmp_path / "log.csv")
    base = ["prepare", "conversations", "--input", str(log), "--val-fraction", "0", "--test-fraction", "0"]
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "t"), "--answer-format", "text"])
    assert result.exit_code == 0, result.output
    rows = load_records(tmp_path / "t" / "train.parquet")
    assert {r["extra_info"]["answer_format"] for r in rows} == {"text"}
    assert all(not r["extra_info"][SFT_TARGET_KEY].startswith("{") for r in rows)
    bad = runner.invoke(app, [*base, "--out", str(tmp_path / "b"), "--answer-format", "yaml"])
    assert bad.exit_code == 2
    assert "--answer-format: unknown 'yaml'" in bad.output
    assert not (tmp_path / "b").exists()
    both = ["--answer-format", "text", "--answer-fields", "rewritten_query,user_profile"]
    bad = runner.invoke(app, [*base, "--out", str(tmp_path / "c"), *both])
    assert bad.exit_code == 2
    assert "answers the query only" in bad.output


@needs_kdconv()
def test_prepare_kdconv_text_format(tmp_path: Path) -> None:
    args = ["prepare", "kdconv", "--input", str(KDCONV / "dev.json"), "--kb", str(KDCONV / "kb_travel.json")]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "a"), "--answer-format", "text"])
    assert result.exit_code == 0, result.output
    rows = load_records(tmp_path / "a" / "dev.parquet")
    assert {r["extra_info"]["answer_format"] for r in rows} == {"text"}
    assert rows[0]["prompt"][1]["content"].endswith("改写后的查询：")
    assert all(parse_text_answer(r["extra_info"][SFT_TARGET_KEY]) is not None for r in rows)
