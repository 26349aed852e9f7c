"""The agent rollout with a scripted policy: every path, masks and log-probs token by token."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from queryrl.agent import (
    AGENT_LOOPS,
    AgentRollout,
    AgentSettings,
    Episode,
    Tool,
    ToolSet,
    episode_metrics,
    tool_from_entry,
)
from queryrl.rollout import RolloutOutput, SamplingParams
from tests.agent.helpers import NOEOS, ScriptedPolicy, call, fake_logprob


def tool_turn(tok: Any, *contents: str) -> list[int]:
    """The tokens the loop must insert after a turn: ChatML written out by hand, independently."""
    text = "\n" + "".join(f"<|im_start|>tool\n{c}<|im_end|>\n" for c in contents) + "<|im_start|>assistant\n"
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _slow(arguments: dict[str, Any]) -> str:
    time.sleep(1.0)
    return "late"


def _long(arguments: dict[str, Any]) -> str:
    return "0123456789" * 10


@pytest.fixture
def tok(tiny_bundle: Any) -> Any:
    return tiny_bundle.tokenizer


def make_tools(timeout_s: float = 2.0, max_chars: int = 0, side: str = "left") -> ToolSet:
    return ToolSet(
        [
            tool_from_entry({"name": "calculator"}),
            Tool("slow", "", {"type": "object"}, _slow),
            Tool("long", "", {"type": "object"}, _long),
        ],
        timeout_s=timeout_s,
        max_response_chars=max_chars,
        truncate_side=side,
    )


def run(
    tok: Any,
    turns: list[str],
    rows: list[dict[str, Any]] | None = None,
    budget: int = 400,
    tools: ToolSet | None = None,
    **settings: Any,
) -> tuple[RolloutOutput, ScriptedPolicy]:
    """One episode of `turns` (or one per row, all with the same script)."""
    n = len(rows) if rows is not None else 1
    policy = ScriptedPolicy(tok, {10 + i: list(turns) for i in range(n)})
    rollout = AgentRollout(policy, tok, AgentSettings(**settings), tools or make_tools(), micro_batch_size=8)
    prompts = [[10 + i, 11, 12] for i in range(n)]
    out = rollout.generate(prompts, SamplingParams(max_new_tokens=budget), rows)
    rollout.tools.close()
    return out, policy


def check_segments(out: RolloutOutput, row: int, segments: list[tuple[list[int], int]]) -> None:
    """The response of `row` is exactly `segments` (ids, mask), then padding; log-probs match the mask."""
    ids = [t for seg, _ in segments for t in seg]
    mask = [float(m) for seg, m in segments for _ in seg]
    n = len(ids)
    assert out.response_ids[row, :n].tolist() == ids
    assert out.response_mask[row, :n].tolist() == mask
    assert out.response_mask[row, n:].sum() == 0
    assert out.attention_mask()[row].tolist() == [1] * n + [0] * (out.response_ids.shape[1] - n)
    expected_lp = [fake_logprob(t) if m else 0.0 for t, m in zip(ids, mask, strict=True)]
    assert out.rollout_logprobs[row, :n].tolist() == pytest.approx(expected_lp)
    assert out.rollout_logprobs[row, n:].abs().sum() == 0


def test_a_good_call_then_an_answer(tok: Any) -> None:
    turns = [call("calculator", expression="17 * 23"), "It is 391."]
    out, policy = run(tok, turns)
    first, answer = policy.ids(turns[0]), policy.ids(turns[1])
    inserted = tool_turn(tok, "391")
    check_segments(out, 0, [(first, 1), (inserted, 0), (answer, 1)])
    assert first[-1] == tok.eos_token_id
    assert answer[-1] == tok.eos_token_id
    assert out.extras == [
        {"agent_name": "tool_agent", "num_turns": 2, "num_tool_calls": 1, "tool_errors": 0,
         "forced_tool_calls": 0, "stop_reason": "done"}
    ]  # fmt: skip
    assert not out.truncated.any()
    # the second turn was generated on the whole context, tool output included
    assert policy.contexts[1] == [[10, 11, 12, *first, *inserted]]


@pytest.mark.parametrize(
    ("turn", "message"),
    [
        ('<tool_call>{"name": "calculator", "arguments": {</tool_call>', "Error: the tool call is not valid JSON"),
        (call("search_web", query="x"), "Error: unknown tool 'search_web'; available tools: calculator, long, slow"),
        (call("calculator", expr="1+1"), "Error: invalid arguments for 'calculator'"),
        (call("calculator", expression="1/0"), "Error: division by zero"),
        (call("calculator", expression="__import__('os')"), "Error: unsupported syntax"),
    ],
)
def test_a_bad_call_is_an_error_message_and_the_episode_goes_on(tok: Any, turn: str, message: str) -> None:
    out, policy = run(tok, [turn, "sorry"])
    episode = policy.contexts[1][0][3:]  # the context of turn 2, after the prompt
    inserted = episode[len(policy.ids(turn)) :]
    text = tok.decode(inserted, skip_special_tokens=False)
    assert text.startswith("\n<|im_start|>tool\n" + message), text
    check_segments(out, 0, [(policy.ids(turn), 1), (inserted, 0), (policy.ids("sorry"), 1)])
    assert out.extras is not None
    assert (out.extras[0]["num_tool_calls"], out.extras[0]["tool_errors"], out.extras[0]["stop_reason"]) == (
        1,
        1,
        "done",
    )


def test_a_tool_timeout_is_an_error_message(tok: Any) -> None:
    start = time.monotonic()
    out, policy = run(tok, [call("slow"), "ok"], tools=make_tools(timeout_s=0.2))
    assert time.monotonic() - start < 0.9
    inserted = tool_turn(tok, "Error: the tool call timed out after 0.2 s")
    check_segments(out, 0, [(policy.ids(call("slow")), 1), (inserted, 0), (policy.ids("ok"), 1)])
    assert out.extras is not None
    assert out.extras[0]["tool_errors"] == 1


def test_too_many_turns_end_the_episode(tok: Any) -> None:
    c = call("calculator", expression="1+1")
    out, policy = run(tok, [c, c, c, c], max_turns=2)
    check_segments(out, 0, [(policy.ids(c), 1), (tool_turn(tok, "2"), 0), (policy.ids(c), 1)])
    assert out.extras is not None
    assert {k: out.extras[0][k] for k in ("num_turns", "num_tool_calls", "stop_reason")} == {
        "num_turns": 2,
        "num_tool_calls": 1,  # the call of the last allowed turn is not run
        "stop_reason": "max_turns",
    }


def test_too_many_tool_calls_get_a_limit_message(tok: Any) -> None:
    two = call("calculator", expression="1+1") + call("calculator", expression="2+2")
    out, policy = run(tok, [two, "done"], max_tool_calls=1)
    limit = "Error: the tool-call limit (1 per episode) is reached"
    check_segments(out, 0, [(policy.ids(two), 1), (tool_turn(tok, "2", limit), 0), (policy.ids("done"), 1)])
    assert out.extras is not None
    assert (out.extras[0]["num_tool_calls"], out.extras[0]["tool_errors"]) == (2, 1)


@pytest.mark.parametrize(
    ("side", "shown"),
    [
        ("left", "0123456789...(truncated)"),
        ("right", "(truncated)...0123456789"),
        ("middle", "01234...(truncated)...56789"),
    ],
)
def test_tool_responses_are_truncated(tok: Any, side: str, shown: str) -> None:
    out, policy = run(tok, [call("long"), "ok"], tools=make_tools(max_chars=10, side=side))
    check_segments(out, 0, [(policy.ids(call("long")), 1), (tool_turn(tok, shown), 0), (policy.ids("ok"), 1)])


def test_the_response_budget_bounds_the_whole_episode(tok: Any) -> None:
    c = call("calculator", expression="1+1")
    first = len(ScriptedPolicy(tok, {}).ids(c))
    budget = first + len(tool_turn(tok, "2")) + 2
    out, policy = run(tok, [c, "a long answer that does not fit"], budget=budget)
    assert out.response_ids.shape[1] == budget
    assert out.truncated.tolist() == [True]
    assert out.extras is not None
    assert out.extras[0]["stop_reason"] == "length"
    answer = policy.ids("a long answer that does not fit")[:2]
    check_segments(out, 0, [(policy.ids(c), 1), (tool_turn(tok, "2"), 0), (answer, 1)])
    # a turn cut before its EOS ends the episode too
    out, _ = run(tok, ["no end" + NOEOS, "never"])
    assert out.truncated.tolist() == [True]
    assert out.extras is not None
    assert out.extras[0]["num_turns"] == 1


def test_the_agent_is_chosen_per_row(tok: Any) -> None:
    c = call("calculator", expression="3*3")
    rows = [{"agent_name": "single_turn"}, {"agent_name": "tool_agent"}, {}]
    out, policy = run(tok, [c, "9"], rows=rows, default_agent="tool_agent")
    assert out.extras is not None
    assert [(e["agent_name"], e["num_turns"], e["num_tool_calls"]) for e in out.extras] == [
        ("single_turn", 1, 0),
        ("tool_agent", 2, 1),
        ("tool_agent", 2, 1),
    ]
    check_segments(out, 0, [(policy.ids(c), 1)])
    check_segments(out, 1, [(policy.ids(c), 1), (tool_turn(tok, "9"), 0), (policy.ids("9"), 1)])
    with pytest.raises(ValueError, match="unknown agent loop 'nope'"):
        run(tok, ["x"], rows=[{"agent_name": "nope"}])


def test_a_forced_prefix_is_in_the_response_with_mask_zero(tok: Any) -> None:
    c = call("calculator", expression="5+6")
    forced_turn = [*tok(c, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    out, policy = run(tok, ["11"], rows=[{"assistant_prefix": c + "<|im_end|>"}])
    check_segments(out, 0, [(forced_turn, 0), (tool_turn(tok, "11"), 0), (policy.ids("11"), 1)])
    assert out.extras is not None
    assert {k: out.extras[0][k] for k in ("num_turns", "num_tool_calls", "forced_tool_calls")} == {
        "num_turns": 1,
        "num_tool_calls": 1,
        "forced_tool_calls": 1,
    }
    # an open prefix: the policy finishes the turn, and the call it completes is run
    prefix = '<tool_call>{"name": "calculator", "arguments": '
    rest = '{"expression": "2*4"}}</tool_call>'
    out, policy = run(tok, [rest, "8"], rows=[{"assistant_prefix": prefix}])
    prefix_ids = list(tok(prefix, add_special_tokens=False)["input_ids"])
    check_segments(out, 0, [(prefix_ids, 0), (policy.ids(rest), 1), (tool_turn(tok, "8"), 0), (policy.ids("8"), 1)])
    assert out.extras is not None
    assert out.extras[0]["forced_tool_calls"] == 0


def test_openai_style_calls_are_run(tok: Any) -> None:
    function = {"name": "calculator", "arguments": json.dumps({"expression": "6*7"})}
    turn = json.dumps({"tool_calls": [{"type": "function", "function": function}]})
    out, policy = run(tok, [turn, "42"])
    check_segments(out, 0, [(policy.ids(turn), 1), (tool_turn(tok, "42"), 0), (policy.ids("42"), 1)])


class EchoAgent:
    """A custom loop: answers the first turn with a user message, then stops."""

    def respond(self, episode: Episode, turn_text: str, forced: bool) -> list[dict[str, str]] | None:
        if episode.num_turns >= 2:
            episode.stop_reason = "done"
            return None
        return [{"role": "user", "content": f"you said {turn_text}"}]


def test_a_custom_agent_loop_registered_by_name(tok: Any) -> None:
    AGENT_LOOPS.register("echo_test")(_echo_factory)
    out, policy = run(tok, ["hi", "bye"], rows=[{"agent_name": "echo_test"}])
    inserted = list(
        tok("\n<|im_start|>user\nyou said hi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    )
    check_segments(out, 0, [(policy.ids("hi"), 1), (inserted, 0), (policy.ids("bye"), 1)])


def _echo_factory(settings: AgentSettings, tools: ToolSet) -> EchoAgent:
    return EchoAgent()


def test_episode_metrics() -> None:
    extras = [
        {"num_turns": 2, "num_tool_calls": 1, "tool_errors": 0, "forced_tool_calls": 1, "stop_reason": "done"},
        {"num_turns": 1, "num_tool_calls": 3, "tool_errors": 2, "forced_tool_calls": 0, "stop_reason": "length"},
        {},
    ]
    m = episode_metrics(extras)
    assert m["num_turns/mean"] == 1.5
    assert m["tool_calls/mean"] == 2.0
    assert m["tool_errors/mean"] == 1.0
    assert m["tool_calls_forced/mean"] == 0.5
    assert m["agent/stop/done"] == 0.5
    assert m["tool_calls/max"] == 3
    assert episode_metrics([{}, {}]) == {}


def test_training_log_probs_match_the_rollout_with_tool_tokens_attended(tmp_path: Path, tiny_bundle: Any) -> None:
    """Real tiny model: rollout log-probs of the policy's tokens equal the trainer's recomputation,
    which attends to the inserted tool tokens (response_attention_mask) as the sampler did."""
    from queryrl.engine.batch import Batch
    from queryrl.engine.policy import compute_logprobs
    from queryrl.rollout import HFRollout

    tok, model = tiny_bundle.tokenizer, tiny_bundle.model
    prompt = tok(
        tok.apply_chat_template(
            [{"role": "user", "content": "What is 5 + 6?"}], add_generation_prompt=True, tokenize=False
        ),
        add_special_tokens=False,
    )["input_ids"]
    torch.manual_seed(0)
    tools = make_tools()
    rollout = AgentRollout(HFRollout(model, tok, micro_batch_size=8), tok, AgentSettings(), tools, micro_batch_size=8)
    rows = [{"assistant_prefix": call("calculator", expression="5 + 6") + "<|im_end|>"}]
    out = rollout.generate([prompt], SamplingParams(n=3, max_new_tokens=160, temperature=1.0), rows)
    tools.close()
    assert out.extras is not None
    assert all(e["forced_tool_calls"] == 1 for e in out.extras)
    batch = Batch.from_rollout(out)
    trained = out.response_mask.bool()
    assert trained.any()
    assert (~trained & out.attention_mask().bool()).any()
    logprobs, _ = compute_logprobs(model, batch, micro_batch_size=8, temperature=1.0)
    assert torch.allclose(logprobs[trained], out.rollout_logprobs[trained], atol=1e-4)
    assert (out.rollout_logprobs[~trained] == 0).all()
