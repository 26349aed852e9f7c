"""The run page (``queryrl.report``): one self-contained file, the chosen steps, escaped text, a bounded size."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.report import MAX_STEPS, MAX_TEXT, conversation, ordinal, transcript_parts, write_report
from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg
from tests.report_helpers import fake_run

# a synthetic 1,000-step run, 8 samples a step of ~1.4 kB each (200 steps embedded): 2.42 MB measured
SIZE_BOUND = 3_000_000


def embedded(page: str, tag: str) -> Any:
    match = re.search(rf'<script type="application/json" id="data-{tag}">(.*?)</script>', page, re.S)
    assert match is not None
    return json.loads(match.group(1))


def test_one_file_without_urls(tmp_path: Path) -> None:
    path = write_report(fake_run(tmp_path / "run", steps=3))
    page = path.read_text(encoding="utf-8")
    assert path == tmp_path / "run" / "report.html"
    assert not re.search(r"https?://", page)
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=", page)  # nothing loaded from anywhere
    assert [c["title"] for c in embedded(page, "curves")] == ["Score", "Entropy", "Response length", "Step time (s)"]
    assert embedded(page, "eval")["systems"]["sft"]["recall@5"] == 0.5
    assert list(embedded(page, "curves")[0]["series"]) == ["critic/rewards/mean = critic/score/mean"]
    samples = embedded(page, "samples")["steps"]
    assert sorted(samples, key=int) == ["1", "2", "3"]
    first = samples["3"][0]
    # every sample of the fake run has one prompt: its conversation is embedded once
    conversations = embedded(page, "samples")["conversations"]
    assert len(conversations) == 1
    assert {s["conversation"] for step in samples.values() for s in step} == {0}
    assert [t["role"] for t in conversations[first["conversation"]]] == ["system", "user"]
    assert first["reward_info"]["candidate_documents"][0] == {
        "doc_id": "d0",
        "title": "云帆 S0 手机的颜色",
        "score": 9.5,
        "gold": True,
    }
    assert samples["3"][-1]["score"] is None
    assert samples["3"][-1]["failed"] is True


def test_a_nan_score_of_an_older_samples_file_is_a_failed_sample(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", steps=1)
    path = run / "samples" / "step_1.jsonl"
    path.write_text('{"step": 1, "group": 0, "prompt": "p", "response": "r", "score": NaN}\n')
    assert embedded(write_report(run).read_text(encoding="utf-8"), "samples")["steps"]["1"][0]["score"] is None


def test_at_most_max_steps_embedded_last_included(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", steps=450, per_step=1)
    page = write_report(run).read_text(encoding="utf-8")
    steps = [int(s) for s in embedded(page, "samples")["steps"]]
    info = embedded(page, "info")
    # 450 steps / 200 -> every 3rd, counted back from 450: 450, 447, ..., 3 (150 steps)
    assert info["every"] == 3
    assert info["sample_steps"] == 450
    assert sorted(steps) == list(range(3, 451, 3)) == info["embedded"]
    assert len(steps) <= MAX_STEPS


def test_html_in_data_is_escaped(tmp_path: Path) -> None:
    attack = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    page = write_report(fake_run(tmp_path / "run", steps=1, response=attack)).read_text(encoding="utf-8")
    assert "</script><script>alert(1)" not in page
    assert "<img" not in page
    assert embedded(page, "samples")["steps"]["1"][0]["response"] == attack  # the data is intact, shown as text


def test_conversation_forms() -> None:
    turns = conversation({"prompt": "no template " * 10})
    assert turns == [{"role": "prompt", "content": "no template " * 10}]
    assert conversation({"messages": [{"role": "user", "content": "hi"}]}) == [{"role": "user", "content": "hi"}]


def test_transcript_parts() -> None:
    text = 'x <tool_call>{"name": "calc"}</tool_call><|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<tool_response>7'
    assert transcript_parts(text) == [
        {"kind": "model", "text": "x "},
        {"kind": "tool_call", "text": '<tool_call>{"name": "calc"}</tool_call>'},
        {"kind": "model", "text": "<|im_end|>\n"},
        {"kind": "tool_result", "text": "<|im_start|>tool\n42<|im_end|>"},
        {"kind": "model", "text": "\n"},
        {"kind": "tool_result", "text": "<tool_response>7"},  # cut off at the length limit
    ]
    assert "".join(p["text"] for p in transcript_parts(text)) == text


def test_size_of_a_1000_step_run(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", steps=1000, per_step=8, response='{"rewritten_query": "云帆 S9 手机的颜色"}')
    size = write_report(run).stat().st_size
    assert size < SIZE_BOUND, size
    page = (run / "report.html").read_text(encoding="utf-8")
    assert len(embedded(page, "samples")["steps"]) == 200  # every 5th step
    assert embedded(page, "info")["every_ordinal"] == "5th"


def test_ordinals_read_as_english() -> None:
    """The run page says "every 3rd step", not "every 3th step"."""
    assert [ordinal(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th", "112th"
    ]  # fmt: skip


def test_long_text_is_cut(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", steps=1, response="x" * 10 * MAX_TEXT)
    page = write_report(run).read_text(encoding="utf-8")
    response = embedded(page, "samples")["steps"]["1"][0]["response"]
    assert response.startswith("x" * MAX_TEXT)
    assert response.endswith(f"[... {9 * MAX_TEXT} characters cut]")


def test_cli_report(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", steps=2)
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert f"wrote {run / 'report.html'}" in result.output
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert missing.exit_code != 0


def test_trainer_writes_the_page(tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.plot=true")).fit()
    page = (tmp_path / "toy_grpo" / "report.html").read_text(encoding="utf-8")
    assert sorted(embedded(page, "samples")["steps"], key=int) == ["1", "2"]
    assert any(c["title"] == "Score" for c in embedded(page, "curves"))


def test_a_family_of_many_curves_becomes_small_multiples(tmp_path: Path) -> None:
    """No chart draws more than MAX_SERIES curves; the reward's parts (different scales) are always apart."""
    from queryrl.report import MAX_SERIES

    run = tmp_path / "run"
    run.mkdir()
    phases = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor"]
    with (run / "metrics.jsonl").open("w", encoding="utf-8") as f:
        for step in (1, 2, 3):
            row = {"step": step, "critic/score/mean": 0.1 * step, "reward/judge/mean": 0.5, "reward/format/mean": 1.0}
            row |= {f"timing_s/{name}": 0.1 * step + i for i, name in enumerate(phases)} | {"timing_s/step": 1.0}
            f.write(json.dumps(row) + "\n")
    curves = embedded(write_report(run).read_text(encoding="utf-8"), "curves")
    assert all(len(c["series"]) <= MAX_SERIES for c in curves)
    parts = [c for c in curves if c.get("group") == "Reward parts"]
    assert [c["title"] for c in parts] == ["reward/format/mean", "reward/judge/mean"]
    assert sorted(c["title"] for c in curves if c.get("group") == "Phase times (s)") == sorted(
        f"timing_s/{name}" for name in phases
    )
    assert [c["title"] for c in curves if "group" not in c] == ["Score", "Step time (s)"]


def test_two_runs_side_by_side(tmp_path: Path) -> None:
    """queryrl report A B: each metric's curves of both runs on one chart, both eval tables; --out names the page."""
    a, b = fake_run(tmp_path / "a" / "grpo", steps=3), fake_run(tmp_path / "b" / "grpo", steps=4)
    result = CliRunner().invoke(app, ["report", str(a), str(b), "--out", str(tmp_path / "ab.html")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "ab.html").read_text(encoding="utf-8")
    assert not re.search(r"https?://", page)
    curves = embedded(page, "curves")
    entropy = next(c for c in curves if c["title"] == "actor/entropy")
    assert entropy["group"] == "Entropy"
    assert list(entropy["series"]) == ["a/grpo", "b/grpo"]  # same folder names: told apart by their parents
    assert [len(entropy["series"][k]) for k in entropy["series"]] == [3, 4]
    assert [r["run"] for r in embedded(page, "eval")] == ["a/grpo", "b/grpo"]
    assert embedded(page, "info")["compare"] == ["a/grpo", "b/grpo"]
    default = CliRunner().invoke(app, ["report", str(a), str(b)])
    assert default.exit_code == 0
    assert (a / "compare.html").is_file()
    missing = CliRunner().invoke(app, ["report", str(a), str(tmp_path / "nowhere")])
    assert missing.exit_code != 0
    assert "nowhere" in missing.output
