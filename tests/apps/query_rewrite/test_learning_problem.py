"""Quiet failures made loud: answers that never parse and empty queries are counted per step
(``reward/parsed``, ``reward/empty_query``), said on the console and stop the run with exit 3 after
``trainer.max_no_signal_steps`` steps; an empty query is never sent to ``/rag/chat_8b``."""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from queryrl.apps.query_rewrite.demo.data import sales_demo_rows
from queryrl.apps.query_rewrite.plugin import QueryRewriteApp
from queryrl.apps.query_rewrite.reward.score import compute_score
from queryrl.config import load_config
from queryrl.errors import user_error
from queryrl.trainer.loop import Trainer
from queryrl.trainer.skips import NoSignalWatch, NothingToLearn
from tests.apps.query_rewrite.helpers import demo_row as _row
from tests.helpers import small_run

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "query_rewrite_demo.yaml"


def _problem(**metrics: float) -> str | None:
    cfg = load_config(DEMO, [])
    return QueryRewriteApp().learning_problem(cfg, {f"reward/{k}/mean": v for k, v in metrics.items()})


def test_the_app_names_a_step_where_nothing_parsed_or_every_query_was_empty() -> None:
    assert "no answer of the step parsed" in str(_problem(parsed=0.0))
    assert "--answer-format text" in str(_problem(parsed=0.0))
    assert "every rewrite of the step was an empty query" in str(_problem(parsed=1.0, empty_query=1.0))
    assert _problem(parsed=0.25, empty_query=0.5) is None
    assert _problem() is None  # a step without these metrics (every sample failed): not this hook's business


def test_a_problem_counts_as_a_step_without_signal_and_is_named_when_the_run_stops() -> None:
    watch = NoSignalWatch(
        limit=2, problem_of=lambda m: "no answer parsed" if m.get("reward/parsed/mean") == 0 else None
    )
    parsed_none = {"reward/parsed/mean": 0.0}
    with pytest.warns(UserWarning, match="no learning signal: no answer parsed"):
        assert watch.observe(1, True, parsed_none) == {"training/no_signal_steps": 1.0}
    assert watch.stop_message() is None
    with pytest.warns(UserWarning, match="no answer parsed"):
        watch.observe(2, True, {**parsed_none, "reward/format/mean": 0.0})
    message = watch.stop_message()
    assert message is not None
    assert (
        "nothing to learn in 2 steps in a row (steps 1-2; trainer.max_no_signal_steps=2): no answer parsed" in message
    )
    assert "format 0" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good step says nothing
        assert watch.observe(3, True, {}) == {"training/no_signal_steps": 0.0}
    assert watch.stop_message() is None


def _score(row: dict[str, Any], answer: str, url: str, **info: Any) -> dict[str, Any]:
    gt = info.pop("ground_truth", row["reward_model"]["ground_truth"])
    kwargs = {"rag_url": url, "weights": {"judge": 0.0}}
    return asyncio.run(compute_score(row["data_source"], answer, gt, {**row["extra_info"], **info}, **kwargs))


def test_an_empty_query_is_counted_and_never_sent(recording_rag: tuple[str, list[Any]]) -> None:
    url, bodies = recording_rag
    row = _row()
    sent = len(bodies)
    on_gold = _score(row, '{"rewritten_query": ""}', url)  # a retrieval turn answered with no query
    assert (on_gold["parsed"], on_gold["empty_query"]) == (1.0, 1.0)
    # an unlabelled turn (no gold, not a no-retrieval kind): the reference is asked, the candidate is not
    unlabelled = _score(row, '{"rewritten_query": ""}', url, ground_truth={"gold_doc_ids": []}, turn_type="pronoun")
    assert unlabelled["empty_query"] == 1.0
    assert unlabelled["candidate_documents"] == []
    assert len(bodies) == sent  # no /rag/chat_8b request carried an empty rewritten_query
    normal = _score(row, json.dumps({"rewritten_query": "星辰 X3 续航"}, ensure_ascii=False), url)
    assert (normal["parsed"], normal["empty_query"]) == (1.0, 0.0)
    assert len(bodies) == sent + 1
    garbage = _score(row, "我不知道", url)
    assert garbage["parsed"] == 0.0


@pytest.mark.slow
def test_a_policy_whose_answers_never_parse_stops_with_exit_3(tmp_path: Path, model_cache: Path) -> None:
    """The untrained tiny model writes no JSON: no RAG or judge request, nothing to learn, and it is said."""
    rows = [r for r in sales_demo_rows("val") if r["reward_model"]["ground_truth"]["gold_doc_ids"]][:8]
    data = tmp_path / "few.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    overrides = [*small_run(tmp_path, model_cache), "trainer.total_steps=4", f"data.train_files=[{data}]"]
    overrides += ["trainer.max_no_signal_steps=2", "data.max_response_length=8", "trainer.save_every=0"]
    cfg = load_config(DEMO, overrides)
    with Trainer(cfg) as trainer, pytest.raises(NothingToLearn) as stopped:
        trainer.fit()
    message = str(stopped.value)
    assert "nothing to learn in 2 steps in a row" in message
    assert "no answer of the step parsed" in message
    metrics = [
        json.loads(x) for x in (tmp_path / cfg.trainer.experiment_name / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["reward/parsed/mean"] for m in metrics] == [0.0, 0.0]
    assert user_error(stopped.value) == (message, 3)
