"""Format rewards: regex, <think>/<answer>, JSON shape, and their verl-contract form."""

from __future__ import annotations

import re

import pytest

from queryrl.rewards.scorers.format import (
    compute_score,
    extract_tag,
    json_shape_score,
    regex_format_score,
    think_answer_score,
)


def test_regex_full_match_and_search() -> None:
    pattern = r"Answer: \d+"
    assert regex_format_score("Answer: 42\n", pattern) == 1.0  # stripped first
    assert regex_format_score("Answer: 42\n", pattern, strip=False) == 0.0
    assert regex_format_score("I think... Answer: 42", pattern) == 0.0  # the whole text must match
    assert regex_format_score("I think... Answer: 42", pattern, full_match=False) == 1.0
    assert regex_format_score("line one\nAnswer: 7", r".*Answer: \d+") == 1.0  # DOTALL: . crosses lines
    assert regex_format_score("line one\nAnswer: 7", r".*Answer: \d+", flags=0) == 0.0
    assert regex_format_score("ANSWER: 7", pattern, flags=re.IGNORECASE) == 1.0


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<think>2+2 is 4</think><answer>4</answer>", 1.0),
        ("\n<think>\nreasoning\n</think>\n\n<answer>\n4\n</answer>\n", 1.0),  # whitespace around blocks
        ("<answer>4</answer><think>why</think>", 0.0),  # wrong order
        ("<think>why</think>", 0.0),  # no answer
        ("<think>why</think><answer>4</answer> and more", 0.0),  # text after the answer
        ("preamble <think>why</think><answer>4</answer>", 0.0),  # text before the thinking
        ("<think> </think><answer>4</answer>", 0.0),  # empty thinking
        ("<think>why</think><answer></answer>", 0.0),  # empty answer
        ("<think>a <answer>3</answer></think><answer>4</answer>", 0.0),  # a tag twice
        ("<think>a</think><think>b</think><answer>4</answer>", 0.0),
    ],
)
def test_think_answer(text: str, score: float) -> None:
    assert think_answer_score(text) == score


def test_think_answer_options() -> None:
    # the chat template opened <think> in the prompt: the response starts inside it
    assert think_answer_score("reasoning</think><answer>4</answer>", think_prefilled=True) == 1.0
    assert think_answer_score("<think>r</think><answer>4</answer>", think_prefilled=True) == 0.0
    assert think_answer_score("<reason>r</reason><final>4</final>", think_tag="reason", answer_tag="final") == 1.0
    assert extract_tag("<think>r</think><answer> 4 </answer>") == "4"
    assert extract_tag("<answer>1</answer><answer>2</answer>") == "2"
    assert extract_tag("no tags") is None


PROSE_AND_FENCE = 'Sure, here it is:\n```json\n{"query": "red phone price", "n": 3}\n```\nHope that helps!'


@pytest.mark.parametrize(
    ("text", "keys", "types", "score"),
    [
        ('{"query": "x", "n": 3}', ["query", "n"], None, 1.0),
        (PROSE_AND_FENCE, ["query", "n"], {"query": str, "n": int}, 1.0),
        ('The result: {"query": "x", "n": 3} -- done.', ["query"], None, 1.0),  # prose, no fence
        ('{"query": "x", "n": 3,}', ["query", "n"], None, 1.0),  # a trailing comma is repaired
        ('{"query": "x"}', ["query", "n"], None, 0.0),  # a key missing
        ('{"query": "x", "n": "3"}', ["query", "n"], {"n": "integer"}, 0.0),  # wrong type
        ('{"query": "x", "n": true}', ["n"], {"n": "number"}, 0.0),  # true is not a number
        ('{"query": "x", "n": 2.5}', ["n"], {"n": ["integer", "number"]}, 1.0),
        ('{"query": null}', ["query"], {"query": [str, type(None)]}, 1.0),
        ('{"query": "x", "extra": 1}', ["query"], {"extra": "string"}, 0.0),  # a typed optional key, wrong
        ('{"query": "x"}', ["query"], {"extra": "string"}, 1.0),  # ... absent: fine
        ('{"query": "x"', ["query"], None, 0.0),  # truncated
        ("no json at all", ["query"], None, 0.0),
        ('{"anything": 1}', [], None, 1.0),  # no required keys: any object
    ],
)
def test_json_shape(text: str, keys: list[str], types: dict[str, object] | None, score: float) -> None:
    assert json_shape_score(text, keys, types) == score  # type: ignore[arg-type]


def test_json_partial_credit() -> None:
    text = '{"a": 1, "b": "two", "c": 3}'
    assert json_shape_score(text, ["a", "b", "d"], partial=True) == pytest.approx(2 / 3)
    assert json_shape_score(text, ["a", "b", "c", "d"], {"b": int}, partial=True) == pytest.approx(2 / 4)
    assert json_shape_score("nothing", ["a"], partial=True) == 0.0


def test_json_never_raises_on_responses_but_does_on_bad_config() -> None:
    for text in ["", "{" * 10_000, '{"a": ' * 500, "```json\n```", "\x00\xff{}"]:
        assert json_shape_score(text, ["a"]) in (0.0, 1.0)
    with pytest.raises(ValueError, match="unknown type"):
        json_shape_score('{"a": 1}', ["a"], {"a": "int"})  # JSON Schema says "integer"
    with pytest.raises(ValueError, match="no JSON type"):
        json_shape_score('{"a": 1}', ["a"], {"a": set})


def test_verl_contract_kinds_and_options() -> None:
    assert compute_score("src", "<think>a</think><answer>b</answer>", None) == 1.0  # think_answer by default
    assert compute_score("src", "Answer: 5", None, kind="regex", pattern=r"Answer: \d") == 1.0
    assert compute_score("src", '{"a": 1}', None, kind="json", required_keys=["a"]) == 1.0
    assert compute_score("src", '{"a": 1}', None, kind="json", required_keys=["a", "b"], partial=True) == 0.5


def test_verl_contract_extra_info_wins_over_kwargs() -> None:
    info = {"kind": "json", "required_keys": ["b"], "index": 3}  # unrelated keys are ignored
    assert compute_score("src", '{"b": 1}', None, info, kind="regex") == 1.0
    assert compute_score("src", '{"b": 1}', None, {"required_keys": ["b"]}, kind="json", required_keys=["a"]) == 1.0


def test_verl_contract_rejects_unknown_options() -> None:
    with pytest.raises(TypeError, match="pattern"):
        compute_score("src", "x", None, kind="json", pattern="x")
    with pytest.raises(ValueError, match="unknown format reward kind"):
        compute_score("src", "x", None, kind="yaml")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        compute_score("src", "x", None, kind="regex")  # no pattern
