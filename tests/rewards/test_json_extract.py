"""JSON extraction from model replies (fuzzed: nothing raises, embedded objects come back) and the mini-schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queryrl.apps.query_rewrite.reward.judging import PAIRWISE_VERDICT_SCHEMA
from queryrl.rewards.json_extract import MAX_STARTS, extract_json, json_objects, validate

VERDICT = {"better": "8b", "score": {"8b": {"quality": 9, "sum": 31}, "32b": {"quality": 7, "sum": 25}}}

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**9), 10**9)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12,
)
json_dicts = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
prose = st.text(alphabet=st.characters(blacklist_characters="{}`"), max_size=60)


# --- hand-written cases ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(VERDICT),
        f"```json\n{json.dumps(VERDICT, indent=2)}\n```",
        f"```\n{json.dumps(VERDICT)}\n```",
        f"Here is my verdict:\n{json.dumps(VERDICT)}\nHope this helps!",
        f"思考过程：8b 更好。\n```JSON\n{json.dumps(VERDICT, ensure_ascii=False)}\n```\n以上。",
        # trailing commas, single quotes, Python literals (repairs, outside strings only)
        "{'better': '8b', 'score': {'8b': {'quality': 9, 'sum': 31,}, '32b': {'quality': 7, 'sum': 25},},}",
    ],
)
def test_extracts_the_verdict(text: str) -> None:
    assert extract_json(text) == VERDICT


def test_braces_and_quotes_inside_strings() -> None:
    obj = {"reason": 'the user wrote "{not json}" and \\ a } brace', "better": "same"}
    assert extract_json(f"prose {{ here, then {json.dumps(obj)} done") == obj
    # the same through the repair path (trailing comma forces it)
    text = '{"reason": "a } and a { and it\'s fine", "ok": true,}'
    assert extract_json(text) == {"reason": "a } and a { and it's fine", "ok": True}


def test_single_quote_repairs_never_touch_strings() -> None:
    assert extract_json("{'a': 'say \"hi\"', 'b': 'it\\'s', 'c': None, 'd': True}") == {
        "a": 'say "hi"',
        "b": "it's",
        "c": None,
        "d": True,
    }
    # "True" and ",}" inside a string stay as they are
    assert extract_json('{"a": "True ,}", "b": [1, 2,],}') == {"a": "True ,}", "b": [1, 2]}


def test_raw_newlines_inside_strings() -> None:
    assert extract_json('{"reason": "line one\nline two"}') == {"reason": "line one\nline two"}


def test_fenced_object_wins_over_an_earlier_example() -> None:
    text = 'The format is {"better": "..."}. My answer:\n```json\n{"better": "32b"}\n```'
    assert extract_json(text) == {"better": "32b"}
    assert json_objects(text) == [{"better": "32b"}, {"better": "..."}]


def test_schema_picks_the_first_valid_object() -> None:
    text = f'Example: {{"better": "maybe"}}. Verdict: {json.dumps(VERDICT)}'
    assert extract_json(text) == {"better": "maybe"}
    assert extract_json(text, PAIRWISE_VERDICT_SCHEMA) == VERDICT
    assert extract_json('{"better": "maybe"}', PAIRWISE_VERDICT_SCHEMA) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no json at all",
        "{",
        "}{",
        '{"better": "8b", "score": {"8b": {"sum": 31}, "32b": {"su',  # cut off: the inner {"sum": 31} is no answer
        '```json\n{"better": "8b", "score": {"8b": {"sum": 31}}\n```',  # one brace short
        "[1, 2, 3]",
        '"just a string"',
        "{'a': 'it's broken'}",
        "use {name} and {other} here",
    ],
)
def test_nothing_to_extract(text: str) -> None:
    assert extract_json(text) is None


@pytest.mark.parametrize("bad", [None, b'{"a": 1}', 42, ["{}"], {"a": 1}])
def test_non_string_input(bad: Any) -> None:
    assert extract_json(bad) is None
    assert json_objects(bad) == []


def test_pathological_inputs_are_bounded() -> None:
    assert extract_json("[" * 100_000 + "]" * 100_000) is None
    assert extract_json('{"a":' * 500 + "1" + "}" * 500) is not None
    assert extract_json('{"a":' * 5_000 + "1" + "}" * 5_000) is None  # deeper than json's recursion limit
    assert extract_json("{" * 200_000) is None
    many = "{x} " * (MAX_STARTS + 10) + '{"late": 1}'  # past the scan budget: give up, don't hang
    assert extract_json(many) is None
    assert extract_json('{"n": ' + "9" * 10_000 + "}") is None  # int too long for Python's int() limit


# --- fuzzing ---------------------------------------------------------------------------------------


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_never_raises_on_arbitrary_text(text: str) -> None:
    out = extract_json(text)
    assert out is None or isinstance(out, dict)
    assert all(isinstance(o, dict) for o in json_objects(text))


@given(st.text(alphabet="{}[]\"',:\\ \nabc01tTrueFalseNn-.", max_size=200))
@settings(max_examples=300, deadline=None)
def test_never_raises_on_json_like_noise(text: str) -> None:
    out = extract_json(text)
    assert out is None or isinstance(out, dict)


@given(prose, json_dicts, prose, st.sampled_from([None, 2]), st.booleans(), st.booleans())
@settings(max_examples=200, deadline=None)
def test_embedded_object_is_recovered(
    before: str, obj: dict[str, Any], after: str, indent: int | None, ascii_only: bool, fenced: bool
) -> None:
    blob = json.dumps(obj, indent=indent, ensure_ascii=ascii_only)
    if fenced:
        blob = f"```json\n{blob}\n```"
    assert extract_json(f"{before}{blob}{after}") == obj


@given(prose, json_dicts.filter(bool), st.data())
@settings(max_examples=200, deadline=None)
def test_truncated_object_is_not_recovered(before: str, obj: dict[str, Any], data: st.DataObject) -> None:
    blob = json.dumps(obj)
    cut = data.draw(st.integers(1, len(blob) - 1))
    assert extract_json(before + blob[:cut]) is None


# --- schema ----------------------------------------------------------------------------------------


def test_pairwise_verdict_schema() -> None:
    assert validate(VERDICT, PAIRWISE_VERDICT_SCHEMA) == []
    assert (
        validate({"better": "same", "score": {"8b": {"sum": 20.5}, "32b": {"sum": 0}}}, PAIRWISE_VERDICT_SCHEMA) == []
    )
    bad = {"better": "maybe", "score": {"8b": {"sum": "31"}, "32b": {"sum": 41}}}
    assert validate(bad, PAIRWISE_VERDICT_SCHEMA) == [
        "$.better: 'maybe' is not one of ['8b', '32b', 'same']",
        "$.score.8b.sum: expected number, got str",
        "$.score.32b.sum: 41 > maximum 40",
    ]
    assert validate({"score": {"8b": {}}}, PAIRWISE_VERDICT_SCHEMA) == [
        "$: missing required key 'better'",
        "$.score: missing required key '32b'",
        "$.score.8b: missing required key 'sum'",
    ]
    assert validate([], PAIRWISE_VERDICT_SCHEMA) == ["$: expected object, got list"]


def test_schema_types_arrays_and_extras() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 2},
            "x": {"type": ["number", "null"]},
            "flag": {"const": True},
        },
        "additionalProperties": False,
    }
    assert validate({"n": 2.0, "tags": ["a"], "x": None, "flag": True}, schema) == []
    assert validate({"n": True, "tags": ["", "b", "c"], "x": "1", "flag": 1, "y": 0}, schema) == [
        "$.n: expected integer, got bool",  # JSON: true is not a number
        "$.tags: more than 2 items",
        "$.tags[0]: shorter than 1 characters",
        "$.x: expected number or null, got str",
        "$.flag: 1 is not True",
        "$: unexpected key 'y'",
    ]
    assert validate({"k": 1}, {"type": "object", "additionalProperties": {"type": "string"}}) == [
        "$.k: expected string, got int"
    ]


def test_schema_typos_fail_loudly() -> None:
    with pytest.raises(ValueError, match="unsupported keyword"):
        validate({}, {"type": "object", "requird": ["a"]})
    with pytest.raises(ValueError, match="unknown type"):
        validate({}, {"type": "dict"})
    assert validate({}, {"type": "object", "title": "t", "description": "annotations are fine"}) == []


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_number_fails_the_schema_where_the_verdict_is_read(value: str) -> None:
    """NaN < 0 and NaN > 40 are both false: without the check a NaN sum passed the rubric's bounds."""
    from queryrl.apps.query_rewrite.reward.judging import PAIRWISE_VERDICT_SCHEMA
    from queryrl.rewards.json_extract import parse_verdict

    reply = f'{{"better": "8b", "score": {{"8b": {{"sum": {value}}}, "32b": {{"sum": 20}}}}}}'
    verdict, error = parse_verdict(reply, PAIRWISE_VERDICT_SCHEMA)
    assert verdict is None
    assert error is not None
    assert "is not a finite number" in error
    assert validate(30.0, {"type": "number", "minimum": 0, "maximum": 40}) == []
