"""What the run-page tests share: a fake run folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _reward_info() -> dict[str, Any]:
    """What the query-rewrite reward returns for a person: both sides' documents (gold marked), a verdict."""
    side = {"quality": 12.0, "relevance": 6.0, "completeness": 5.0, "retrieval": 4.0, "sum": 27.0}

    def docs(first_gold: int) -> list[dict[str, Any]]:
        return [
            {"doc_id": f"d{k}", "title": f"云帆 S{k} 手机的颜色", "score": 9.5 - k, "gold": k == first_gold}
            for k in range(5)
        ]

    return {
        "candidate_query": "云帆 S9 手机的颜色",
        "reference_query": "云帆 S9 颜色",
        "candidate_documents": docs(0),
        "reference_documents": docs(3),
        "judge_verdict": {"better": "candidate", "candidate": side, "reference": side | {"sum": 20.0}},
    }


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
                "score": float(i % 2) if i < per_step - 1 else None,
                "reward_parts": {"recall_at_5": 0.5, "judge": 1.0},
                "reward_info": _reward_info(),
            }
            | ({"transcript": transcript} if transcript else {})
            | ({"failed": True, "error": "RAG /rag/chat_8b failed: timed out"} if i == per_step - 1 else {})
            for i in range(per_step)
        ]
        (run_dir / "samples" / f"step_{step}.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    systems = {"sft": {"recall@5": 0.5, "recall@5_low": 0.4, "recall@5_high": 0.6}}
    comparisons = {"grpo-sft": {"a": "grpo", "b": "sft", "recall@5": {"diff": 0.1, "low": 0.0, "high": 0.2}}}
    (run_dir / "eval.json").write_text(json.dumps({"systems": systems, "comparisons": comparisons}))
    return run_dir
