"""The run page (``queryrl.report``): one self-contained file, the chosen steps, escaped text, a bounded size."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.report import MAX_STEPS, MAX_TEXT, conversation, transcript_parts, write_report
from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg

# a synthetic 1,000-step run, 8 samples a step of ~1.4 kB each (200 steps embedded): 2.42 MB measured
SIZE_BOUND = 3_000_000


def fake_run(run_dir: Path, steps: int, per_step: int = 4, response: str = "ok", transcript: str = "") -> Path:
    """A run folder with metrics.jsonl, samples/step_N.jsonl for every step and an eval.json."""
    (run_dir / "samples").mkdir(parents=True)
    with (run_dir / "metrics.jsonl").open("w", encoding="utf-8") as f:
        for step in range(1, steps + 1):
            row = {"step": step, "critic/score/mean": step / steps, "actor/entropy": 1.0 - step / (2 * steps)}
            row["critic/rewards/mean"] = row["critic/score/mean"]  # no KL in the reward: the same curve
            f.write(json.dumps(row | {"timing_s/step": 0.5, "response_length/mean": 12.0}) + "\n")
    for step in range(1, steps + 1):
        samples = [
            {
                "step": step,
                "group": i // 2,
                "prompt": "<|im_start|>system\nrewrite<|im_end|>\n<|im_start|>user\n" + "历史" * 200 + "<|im_end|>\n"
                "<|im_start|>assistant\n",
                "response": response,
                "score": float(i % 2) if i < per_step - 1 else float("nan"),
                "recall_at_5": 0.5,
                "retrieved": [{"doc_id": "d1", "gold": True}],
            }
            | ({"transcript": transcript} if transcript else {})
            for i in range(per_step)
        ]
        (run_dir / "samples" / f"step_{step}.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    systems = {"sft": {"recall@5": 0.5, "recall@5_low": 0.4, "recall@5_high": 0.6}}
    comparisons = {"grpo-sft": {"a": "grpo", "b": "sft", "recall@5": {"diff": 0.1, "low": 0.0, "high": 0.2}}}
    (run_dir / "eval.json").write_text(json.dumps({"systems": systems, "comparisons": comparisons}))
    return run_dir


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
    assert [c["title"] for c in embedded(page, "curves")] == ["Reward", "Entropy", "Response length", "Timing (s)"]
    assert embedded(page, "eval")["systems"]["sft"]["recall@5"] == 0.5
    assert list(embedded(page, "curves")[0]["series"]) == ["critic/rewards/mean = critic/score/mean"]
    samples = embedded(page, "samples")
    assert sorted(samples, key=int) == ["1", "2", "3"]
    first = samples["3"][0]
    assert [t["role"] for t in first["conversation"]] == ["system", "user"]
    assert first["retrieved"] == [{"doc_id": "d1", "gold": True}]
    assert samples["3"][-1]["score"] is None  # NaN: a failed sample, valid JSON


def test_at_most_max_steps_embedded_last_included(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", steps=450, per_step=1)
    page = write_report(run).read_text(encoding="utf-8")
    steps = [int(s) for s in embedded(page, "samples")]
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
    assert embedded(page, "samples")["1"][0]["response"] == attack  # the data is intact, shown as text


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
    assert len(embedded(page, "samples")) == 200  # every 5th step


def test_long_text_is_cut(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", steps=1, response="x" * 10 * MAX_TEXT)
    page = write_report(run).read_text(encoding="utf-8")
    response = embedded(page, "samples")["1"][0]["response"]
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
    assert sorted(embedded(page, "samples"), key=int) == ["1", "2"]
    assert any(c["title"] == "Reward" for c in embedded(page, "curves"))
