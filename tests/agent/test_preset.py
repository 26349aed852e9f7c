"""The calculator-agent preset from the CLI, its reward and data, the multi-turn config, and scoring."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.config import ConfigError, load_config
from queryrl.data.builtin import arithmetic_tool
from queryrl.rewards import default_compute_score

REPO = Path(__file__).resolve().parents[2]


def test_the_calculator_preset_trains_from_the_cli_and_its_rollouts_call_the_tool(
    tmp_path: Path, model_cache: Path
) -> None:
    args = [
        "train",
        "--config",
        str(REPO / "configs" / "agent_calculator.yaml"),
        f"trainer.output_dir={tmp_path}",
        f"model.cache_dir={model_cache}",
        "trainer.logger=[jsonl]",
        "trainer.plot=false",
        "trainer.total_steps=2",
        "data.val_files=[]",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "agent_calculator" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["tool_calls/mean"] > 0
        assert r["tool_errors/mean"] == 0  # the forced calls are well-formed and the calculator answers them
        assert r["num_turns/mean"] >= 1  # the policy wrote a turn after the tool's answer
        assert r["reward/num_tool_calls/mean"] == r["tool_calls/mean"]  # the reward saw the count
        assert "critic/score/mean" in r
    sample = json.loads((tmp_path / "agent_calculator" / "samples" / "step_2.jsonl").read_text().splitlines()[0])
    assert sample["data_source"] == "arithmetic/tool"
    assert sample["rollout"]["num_tool_calls"] == 1
    transcript = sample["transcript"]  # the forced call, the calculator's answer, then the policy's turn
    assert transcript.startswith("<tool_call>")
    assert "<|im_start|>tool\n" in transcript
    assert "<tool_call>" not in sample["response"]  # the reward's text: the policy's tokens only


def test_arithmetic_reward_reads_the_answer_and_the_tool_calls() -> None:
    def score(text: str, calls: int | None, **kwargs: Any) -> float:
        extra = {} if calls is None else {"num_tool_calls": calls}
        result = default_compute_score("arithmetic/tool", text, "391", extra, **kwargs)
        assert isinstance(result, dict)
        return float(result["score"])

    assert score("The answer is 391.", 1) == 1.0
    assert score("391", 3) == pytest.approx(0.8)  # two calls beyond the free one
    assert score("391", 0) == 0.0  # no tool, no credit
    assert score("391", None, require_tool=False) == 1.0
    assert 0 < score("390", 1) < 0.5  # partial credit for a near miss
    assert score("no number", 1) == 0.0


def test_arithmetic_dataset_rows_are_consistent() -> None:
    from queryrl.agent import evaluate, parse_tool_calls

    rows = arithmetic_tool("val")
    assert len(rows) == 32
    for row in rows:
        prefix = row["assistant_prefix"]
        assert prefix.endswith("<|im_end|>")
        (call,) = parse_tool_calls(prefix)
        assert call.arguments["expression"] == row["extra_info"]["expression"]
        assert evaluate(call.arguments["expression"]) == row["reward_model"]["ground_truth"]
        assert row["agent_name"] == "tool_agent"
    with pytest.raises(ValueError, match="splits train and val"):
        arithmetic_tool("test")


@pytest.mark.parametrize(
    "override",
    [
        "rollout.multi_turn.truncate_side=top",
        "rollout.multi_turn.max_turns=0",
        "rollout.multi_turn.tool_timeout_s=0",
        "rollout.multi_turn.max_tool_calls=-1",
    ],
)
def test_multi_turn_config_is_validated(override: str) -> None:
    with pytest.raises(ConfigError, match=r"rollout\.multi_turn"):
        load_config(None, [override])


def test_scoring_passes_rows_and_merges_the_rollout_extras(tiny_bundle: Any) -> None:
    """generate_and_score gives the agent rollout the rows and the reward function num_tool_calls."""
    from queryrl.agent import AgentRollout, AgentSettings, ToolSet, tool_from_entry
    from queryrl.data.prompts import PromptItem
    from queryrl.rewards import make_reward_manager
    from queryrl.rollout import SamplingParams
    from queryrl.trainer.metrics import PhaseTimer
    from queryrl.trainer.scoring import generate_and_score
    from tests.agent.helpers import ScriptedPolicy, call

    tok = tiny_bundle.tokenizer
    seen: list[dict[str, Any]] = []

    def reward(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any]) -> float:
        seen.append({"text": solution_str, **extra_info})
        return 1.0

    policy = ScriptedPolicy(tok, {10: [call("calculator", expression="2+2"), "4"], 20: ["4"]})
    tools = ToolSet([tool_from_entry({"name": "calculator"})])
    rollout = AgentRollout(policy, tok, AgentSettings(), tools, micro_batch_size=1)
    items = [
        PromptItem([10, 11], {"data_source": "x", "extra_info": {"index": 0}}, "mem", 0),
        PromptItem([20, 21], {"data_source": "x", "agent_name": "single_turn"}, "mem", 1),
    ]
    manager = make_reward_manager("naive", reward)
    batch, results = generate_and_score(
        rollout, manager, tok, items, SamplingParams(max_new_tokens=200), PhaseTimer(), torch.device("cpu")
    )
    tools.close()
    assert [r.score for r in results] == [1.0, 1.0]
    assert [(s.get("index", None), s["num_tool_calls"], s["num_turns"]) for s in seen] == [
        (0, 1, 2),
        (None, 0, 1),
    ]
    # the reward reads the policy's tokens only: its answer "4", not the tool's output "4" too
    assert seen[0]["text"].endswith("</tool_call>4")
    assert seen[0]["text"].count("4") == 1
    assert batch.response_attention_mask.sum() > batch.response_mask.sum()
    assert batch.non_tensor["rollout_extras"][0]["num_tool_calls"] == 1
