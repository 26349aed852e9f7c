"""The judge's spend in plain sight (issue 49): its tokens (reasoning among them) and, at the user's prices,
an estimated cost, per step on the console, per run on the run page and per evaluation in eval.json
(tests/apps/query_rewrite/eval/test_run.py); they were only in metrics.jsonl. Never an invented price."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queryrl.config import ConfigError, load_config
from queryrl.report import write_report
from queryrl.rewards.judge import JudgeClient, collect_judge_metrics
from queryrl.testing.judge_server import constant_judge, make_app, running_server
from queryrl.tracking import Tracker

STEP = {
    "judge/prompt_tokens": 123456.0,
    "judge/completion_tokens": 2048.0,
    "judge/reasoning_tokens": 1536.0,
    "judge/cost": 0.1748,
    "judge/failed": 2.0,
    "judge/cut_off": 1.0,
}


def test_the_console_shows_the_judges_tokens_cost_and_failures_each_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Tracker(tmp_path, ["console"], "p", "e", {}, total_steps=2) as tracker:
        tracker.log({"critic/score/mean": 0.5, **STEP}, step=1)
        tracker.log({"critic/score/mean": 0.5}, step=2)  # no LLM judge: nothing of it shown
    first, second = capsys.readouterr().out.splitlines()
    assert "judge_in=123456 judge_out=2048 judge_reasoning=1536 judge_cost=0.1748 judge_failed=2" in first
    assert "judge" not in second


def _run(folder: Path, steps: list[dict[str, float]]) -> Path:
    folder.mkdir()
    lines = [json.dumps({"step": k + 1, "critic/score/mean": 0.5, **m}) for k, m in enumerate(steps)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_the_run_page_shows_the_whole_runs_spend_and_charts_it_per_step(tmp_path: Path) -> None:
    page = write_report(_run(tmp_path / "priced", [STEP, STEP])).read_text(encoding="utf-8")
    assert (
        '<p id="judgespend">Judge, whole run: 246,912 prompt tokens, 4,096 completion tokens (3,072 of them '
        "reasoning, billed as output), estimated cost 0.3496 at the configured prices; 4 failed judgments, "
        "2 cut off at the token limit.</p>"
    ) in page
    assert "Judge tokens per step" in page
    assert "Judge cost per step (estimated)" in page

    unpriced = {k: v for k, v in STEP.items() if k != "judge/cost"}
    page = write_report(_run(tmp_path / "unpriced", [unpriced])).read_text(encoding="utf-8")
    assert "123,456 prompt tokens" in page
    assert "cost" not in page.split('<p id="judgespend">')[1].split("</p>")[0]  # no prices: no cost

    page = write_report(_run(tmp_path / "offline", [{}])).read_text(encoding="utf-8")
    assert "judgespend" not in page
    assert "@JUDGE@" not in page


def test_the_client_counts_a_cost_only_at_the_users_prices() -> None:
    messages = [{"role": "user", "content": "compare these two"}]
    app = make_app(constant_judge, reasoning_tokens=30)
    with running_server(app) as url:
        collect_judge_metrics()  # drain counters of earlier tests
        priced = JudgeClient(url, "m", api_key_env=None, price_per_million_input=1.25, price_per_million_output=10)
        plain = JudgeClient(url, "m", api_key_env=None)
        assert priced.judge_sync(messages).ok
        stats = priced.pop_stats()
        assert plain.judge_sync(messages).ok
        assert "judge/cost" not in plain.pop_stats()
        assert priced.judge_sync(messages).ok
        assert plain.judge_sync(messages).ok
        both = collect_judge_metrics()
    assert stats["judge/reasoning_tokens"] == 30
    expected = (stats["judge/prompt_tokens"] * 1.25 + stats["judge/completion_tokens"] * 10) / 1e6
    assert stats["judge/cost"] == pytest.approx(expected)
    assert both["judge/cost"] == pytest.approx(expected)  # the priced client's cost only, tokens of both
    assert both["judge/prompt_tokens"] == 2 * stats["judge/prompt_tokens"]
    with pytest.raises(ValueError, match="set both price_per_million_input and price_per_million_output"):
        JudgeClient(url, "m", api_key_env=None, price_per_million_input=1.25)


@pytest.mark.parametrize(
    "overrides",
    [
        ["app.query_rewrite.judge.price_per_million_input=1.25"],
        ["app.query_rewrite.judge.price_per_million_output=10"],
        ["app.query_rewrite.judge.price_per_million_input=-1", "app.query_rewrite.judge.price_per_million_output=10"],
    ],
)
def test_prices_are_both_set_or_neither(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"app\.query_rewrite\.judge\.price_per_million_input and"):
        load_config(None, overrides)
    assert load_config(None, []).app.query_rewrite.judge.price_per_million_input is None  # no built-in price
