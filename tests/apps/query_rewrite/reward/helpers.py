"""Shared by the judge-settings tests: a GPT-5-like config of the app's judge, a demo row with gold, its score."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.demo.data import sales_demo_rows
from queryrl.apps.query_rewrite.reward.score import QueryRewriteReward
from queryrl.config import load_config

KEY = "sk-gpt5-reward-secret-42424242"


def rubric_judge(messages: list[dict[str, Any]]) -> str:
    """A full rubric verdict (the candidate wins), whatever the data."""
    side = {"quality": 12, "relevance": 6, "completeness": 6, "retrieval": 6, "sum": 30}
    return json.dumps({"better": "8b", "score": {"8b": side, "32b": {**side, "sum": 30}}})


def _row() -> dict[str, Any]:
    rows = [r for r in sales_demo_rows("val") if (r["reward_model"]["ground_truth"] or {}).get("gold_doc_ids")]
    return rows[0]


def _score(cfg: Any, row: dict[str, Any]) -> dict[str, float]:
    """The reward the trainer builds for `cfg`, on `row`."""
    answer = json.dumps({"rewritten_query": "手机 价格", "user_profile": "", "history_summary": ""})
    truth, info = row["reward_model"]["ground_truth"], row["extra_info"]
    return asyncio.run(QueryRewriteReward.from_config(cfg)(row["data_source"], answer, truth, info))


def _config(url: str, tmp_path: Path, yaml_judge: str, *overrides: str) -> Any:
    path = tmp_path / "judge.yaml"
    path.write_text(
        "app:\n  query_rewrite:\n    enable: true\n    judge:\n      backend: openai\n"
        f"      base_url: {url}\n      model: gpt-5\n      api_key_env: QUERYRL_TEST_JUDGE_KEY\n"
        "      max_retries: 3\n" + yaml_judge,
        encoding="utf-8",
    )
    return load_config(path, list(overrides))
