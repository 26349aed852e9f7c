"""What the run-page tests share: a fake run folder."""

from __future__ import annotations

import json
from pathlib import Path


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
