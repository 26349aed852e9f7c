"""Self-driven warm-up data (``queryrl warmup``): the few-shot prompt, which candidate becomes a turn's
target, what is dropped, the report, the written files and the command's failures."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig
from typer.testing import CliRunner

import queryrl.apps.query_rewrite.eval.generation as eval_generation
from queryrl.apps.query_rewrite.config import QueryRewriteRAGConfig
from queryrl.apps.query_rewrite.data.conversations import conversations_to_rows, write_parquet
from queryrl.apps.query_rewrite.data.sft_targets import HEURISTIC_SOURCE, SFT_TARGET_KEY, add_sft_targets
from queryrl.apps.query_rewrite.demo.data import DOMAIN, make_catalogue, make_dialogues
from queryrl.apps.query_rewrite.prompts import parse_text_answer
from queryrl.apps.query_rewrite.reward.rag import rag_client
from queryrl.apps.query_rewrite.warmup import WARMUP_KEY, WarmupSettings, build_warmup, few_shot_messages
from queryrl.cli import app
from queryrl.data.records import load_records

runner = CliRunner()
NOTHING = "今天天气怎么样"  # retrieves no product document
vocabs: list[Any] = []  # the kept ids each scripted generate_replies call got


@cache
def _rows() -> tuple[dict[str, Any], ...]:
    """Text-format rows of a few demo dialogues (retrieval turns with gold, and no-retrieval turns)."""
    dialogues = make_dialogues(make_catalogue(), 6, seed=11, prefix="wu")
    return tuple(add_sft_targets(conversations_to_rows(dialogues, "t", domain=DOMAIN, answer_format="text")))


def _titles() -> dict[str, str]:
    return {d["doc_id"]: d["title"] for d in make_catalogue()}


def _gold(row: dict[str, Any]) -> list[str]:
    return list(row["reward_model"]["ground_truth"]["gold_doc_ids"])


def test_few_shot_messages_put_the_examples_between_the_system_and_the_question() -> None:
    prompt = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    got = few_shot_messages(prompt, [("q1", "a1"), ("q2", "a2")])
    assert [m["role"] for m in got] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in got] == ["S", "q1", "a1", "q2", "a2", "Q"]
    assert few_shot_messages(prompt, []) == prompt


def _scripted(monkeypatch: pytest.MonkeyPatch, reply: Any) -> list[Any]:
    """Replace the model's sampling with `reply(prompt messages, sample index)`; returns the prompts seen (and
    records each call's restricted vocabulary, None for the full head, in :data:`vocabs`)."""
    seen: list[Any] = []
    vocabs.clear()

    def generate(
        path: Path, prompts: Any, params: Any, batch_size: int, device: Any, dtype: Any, **kw: Any
    ) -> list[list[str]]:
        seen.extend(prompts)
        vocabs.append(kw.get("vocab"))
        return [[reply(p, k) for k in range(params.n)] for p in prompts]

    monkeypatch.setattr(eval_generation, "generate_replies", generate)
    return seen


def _warmup(monkeypatch: pytest.MonkeyPatch, reply: Any, **settings: Any) -> tuple[Any, list[Any]]:
    seen = _scripted(monkeypatch, reply)
    client = rag_client(QueryRewriteRAGConfig(max_retries=0))
    data = build_warmup(Path("unused"), list(_rows()), client, WarmupSettings(**settings), say=lambda _: None)
    return data, seen


def test_the_candidate_that_ranks_gold_highest_becomes_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    titles = _titles()
    by_prompt = {r["prompt"][-1]["content"]: r for r in _rows()}

    def reply(prompt: list[dict[str, str]], k: int) -> str:
        row = by_prompt[prompt[-1]["content"]]
        # sample 0 finds nothing; sample 1 names the gold product and its attribute and stops; 2 rambles
        gold = titles[_gold(row)[0]] if _gold(row) else NOTHING
        return [NOTHING, f"{gold}\n", f"改写后的查询：{NOTHING}\n还有别的吗"][k]

    data, seen = _warmup(monkeypatch, reply, samples=3, shots=2)
    report = data.report()
    retrieval = [r for r in _rows() if _gold(r)]
    assert len(seen) == len(retrieval) - 2  # the two example turns are not sampled
    for prompt in seen:  # two solved turns between the system message and the question
        assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user", "assistant", "user"]
        assert prompt[2]["content"] == parse_text_answer(prompt[2]["content"]).rewritten_query  # a text answer
    assert report["model_samples"] == 3 * len(seen)
    assert report["model_format_ok"] == 1.0
    assert report["model_clean_format"] == pytest.approx(2 / 3, abs=1e-4)
    kept = {r["extra_info"]["message_id"] or r["prompt"][-1]["content"]: r for r in data.rows}
    assert len(kept) == report["kept"]
    for row in data.rows:
        info = row["extra_info"]
        source = info[WARMUP_KEY]["source"]
        if source == "no_retrieval":
            assert not _gold(row)
            assert info[SFT_TARGET_KEY] == "无需检索"
            continue
        assert info[WARMUP_KEY]["rank_reward"] > 0
        if source == "model":  # the gold title: the only candidate that can beat the reference
            assert info[SFT_TARGET_KEY] == titles[_gold(row)[0]]
            assert info["sft_target_source"] == "warmup: the model's own rewrite"  # what queryrl sft prints
        else:  # the reference answered at least as well (a tie goes to it)
            assert source == "reference"
            assert info["sft_target_source"] == f"warmup: {HEURISTIC_SOURCE}"
    assert sum(report["target_source"].values()) == report["kept_retrieval_turns"]
    assert report["target_source"].get("model", 0) > 0
    assert report["kept_no_retrieval_turns"] == sum(1 for r in _rows() if not _gold(r))


def test_without_the_reference_a_turn_no_sample_solves_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    data, _ = _warmup(monkeypatch, lambda prompt, k: NOTHING, samples=2, shots=0, reference=False)
    report = data.report()
    assert report["kept_retrieval_turns"] == 0
    assert report["dropped_no_gold_found"] == sum(1 for r in _rows() if _gold(r))
    assert report["turns_a_model_sample_found_gold"] == 0
    # with the reference, the turns it solves are kept, with its answer
    data, _ = _warmup(monkeypatch, lambda prompt, k: NOTHING, samples=2, shots=0)
    assert data.report()["target_source"] == {"reference": data.report()["kept_retrieval_turns"]}
    assert data.report()["kept_retrieval_turns"] > 0


@pytest.mark.parametrize(("name", "value"), [("samples", -1), ("batch_size", 0), ("shots", -1)])
def test_bad_settings_name_the_setting(name: str, value: int) -> None:
    with pytest.raises(ValueError, match=f"warmup: {name} must be"):
        WarmupSettings(**{name: value})
    with pytest.raises(ValueError, match="samples 0 without the reference"):
        WarmupSettings(samples=0, reference=False)


def test_samples_0_keeps_the_reference_answers_that_retrieve_gold_and_samples_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data, seen = _warmup(monkeypatch, lambda prompt, k: NOTHING, samples=0, shots=2)
    assert seen == []  # the model is never asked
    report = data.report()
    retrieval = sum(1 for r in _rows() if _gold(r))
    assert report["model_samples"] == 0
    assert report["model_format_ok"] is None
    assert report["target_source"] == {"reference": report["kept_retrieval_turns"]}
    # no turn is taken as a worked example: every retrieval turn is kept or dropped on its reference
    assert report["kept_retrieval_turns"] + report["dropped_no_gold_found"] == retrieval
    assert report["kept_retrieval_turns"] > 0
    with_samples, _ = _warmup(monkeypatch, lambda prompt, k: NOTHING, samples=1, shots=0)
    assert with_samples.report()["kept_retrieval_turns"] == report["kept_retrieval_turns"]


def test_the_command_writes_the_sft_data_with_the_tiny_model(tiny_cfg: DictConfig, tmp_path: Path) -> None:
    from queryrl.models.loading import resolve_model_path

    data = write_parquet(list(_rows())[:12], tmp_path / "train.parquet")
    model = resolve_model_path(tiny_cfg.model)
    args = ["warmup", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "wu"), "--corpus"]
    args += ["sales_demo", "--samples", "2", "--shots", "1", "--max-new-tokens", "8", "--batch-size", "4"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "kept" in result.output
    rows = load_records(tmp_path / "wu" / "warmup.parquet")
    assert rows
    assert all(parse_text_answer(r["extra_info"][SFT_TARGET_KEY]) is not None for r in rows)
    report = (tmp_path / "wu" / "warmup.json").read_text(encoding="utf-8")
    assert '"model_samples"' in report


def test_the_command_refuses_a_folder_that_is_no_model_and_fails_when_nothing_is_kept(
    tiny_cfg: DictConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_parquet(list(_rows())[:6], tmp_path / "train.parquet")
    base = ["warmup", "--data", str(data), "--out", str(tmp_path / "wu"), "--corpus", "sales_demo"]
    result = runner.invoke(app, [*base, "--model", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a Hugging Face model folder" in result.output
    from queryrl.models.loading import resolve_model_path

    _scripted(monkeypatch, lambda prompt, k: NOTHING)
    model = str(resolve_model_path(tiny_cfg.model))
    result = runner.invoke(app, [*base, "--model", model, "--no-reference", "--samples", "1", "--shots", "0"])
    assert result.exit_code == 2
    assert "nothing to warm up on" in result.output


def test_a_sample_that_retrieves_but_invents_facts_is_never_a_target(monkeypatch: pytest.MonkeyPatch) -> None:
    titles = _titles()
    by_prompt = {r["prompt"][-1]["content"]: r for r in _rows()}

    def reply(prompt: list[dict[str, str]], k: int) -> str:
        row = by_prompt[prompt[-1]["content"]]
        return f"{titles[_gold(row)[0]]}，电话是13800138000" if _gold(row) else NOTHING  # an answer, invented

    data, _ = _warmup(monkeypatch, reply, samples=1, shots=0)
    report = data.report()
    assert report["candidates_refused_intent_changed"].get("model", 0) == sum(1 for r in _rows() if _gold(r))
    assert "model" not in report["target_source"]
    assert all("13800138000" not in r["extra_info"][SFT_TARGET_KEY] for r in data.rows)


def test_rows_without_retrieval_turns_keep_their_abstentions_and_sample_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _scripted(monkeypatch, lambda prompt, k: NOTHING)
    rows = [r for r in _rows() if not _gold(r)]
    assert rows
    client = rag_client(QueryRewriteRAGConfig(max_retries=0))
    data = build_warmup(Path("unused"), rows, client, WarmupSettings(samples=2), say=lambda _: None)
    assert seen == []  # nothing sampled, nothing retrieved (an empty retrieve used to fail)
    assert data.report()["kept_no_retrieval_turns"] == len(rows)
    assert data.report()["kept_retrieval_turns"] == 0


def test_a_model_trained_with_a_restricted_head_samples_with_it(
    tiny_cfg: DictConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queryrl.models.loading import resolve_model_path
    from queryrl.models.vocab import write_vocab_ids

    _warmup(monkeypatch, lambda prompt, k: NOTHING, samples=1, shots=0)
    assert vocabs == [None]  # no vocab_ids: the full head
    kept = write_vocab_ids(tmp_path / "vocab_ids.json", [0, 1, 2, 5, 9])
    _warmup(monkeypatch, lambda prompt, k: NOTHING, samples=1, shots=0, vocab_ids=str(kept))
    assert vocabs == [[0, 1, 2, 5, 9]]

    data = write_parquet(list(_rows())[:6], tmp_path / "train.parquet")
    model = str(resolve_model_path(tiny_cfg.model))
    base = ["warmup", "--model", model, "--data", str(data), "--out", str(tmp_path / "wu"), "--corpus", "sales_demo"]
    base += ["--samples", "1", "--shots", "0"]
    result = runner.invoke(app, [*base, "--vocab-ids", str(tmp_path / "absent.json")])
    assert result.exit_code == 2
    assert "absent.json: no such file" in result.output
    (tmp_path / "bad.json").write_text("{}", encoding="utf-8")
    result = runner.invoke(app, [*base, "--vocab-ids", str(tmp_path / "bad.json")])
    assert result.exit_code == 2
    assert "bad.json" in result.output
    assert not (tmp_path / "wu").exists()
    vocabs.clear()
    result = runner.invoke(app, [*base, "--vocab-ids", str(tmp_path)])  # a folder holding vocab_ids.json
    assert result.exit_code == 0, result.output
    assert vocabs == [[0, 1, 2, 5, 9]]
    report = (tmp_path / "wu" / "warmup.json").read_text(encoding="utf-8")
    assert f'"vocab_ids": "{kept}"' in report
