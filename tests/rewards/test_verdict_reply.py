"""A judge's reply is a verdict only when it is one: the JSON object alone, or one fenced block that is the
whole reply. A refusal that shows an example verdict inside prose was scored from the example (issue 49)."""

from __future__ import annotations

import asyncio
import json

import pytest

from queryrl.apps.query_rewrite.intent.judge import INTENT_SCHEMA
from queryrl.apps.query_rewrite.reward.judging import PAIRWISE_VERDICT_SCHEMA, RUBRIC_VERDICT_SCHEMA
from queryrl.rewards.json_extract import parse_verdict, reply_object
from queryrl.rewards.judge import JudgeClient
from queryrl.testing.judge_server import CONSTANT_VERDICT, make_app, running_server

EXAMPLE = json.dumps(CONSTANT_VERDICT)
INTENT = json.dumps({"same_intent": "yes", "reason": "the same question"})

REFUSALS = [
    f"I cannot evaluate these results. For reference, a verdict would look like {EXAMPLE}",
    f"I'm sorry, but I can't compare them. An answer in the requested format:\n{EXAMPLE}\n(this is only an example)",
    f"I can't help with that. Example:\n```json\n{EXAMPLE}\n```",
    f"```json\n{EXAMPLE}\n```\nThe above is just the format; I cannot judge this conversation.",
    f"{EXAMPLE}\nNote: the scores above are placeholders, I could not read the results.",
    f"抱歉，我无法评估这两个结果。格式示例如下：{EXAMPLE}",
    f"```json\n{EXAMPLE}\n```\n```json\n{EXAMPLE}\n```",
    f"I cannot decide. {INTENT}",
]


@pytest.mark.parametrize("reply", REFUSALS)
@pytest.mark.parametrize("schema", [PAIRWISE_VERDICT_SCHEMA, RUBRIC_VERDICT_SCHEMA, INTENT_SCHEMA, None])
def test_a_refusal_with_an_example_verdict_is_no_verdict(reply: str, schema: dict | None) -> None:
    verdict, error = parse_verdict(reply, schema)
    assert verdict is None
    assert error is not None
    assert error.startswith("unparseable verdict: a JSON object inside other text is not a verdict")


@pytest.mark.parametrize(
    "reply",
    [
        EXAMPLE,
        f"  \n{EXAMPLE}\n\n",
        f"```json\n{json.dumps(CONSTANT_VERDICT, indent=2)}\n```",
        f"\n```\n{EXAMPLE}\n```  \n",
        f"```JSON\n{EXAMPLE}```",
        f"```{EXAMPLE}```",  # one line
        f'<think>\nThe first is better... maybe {{"better": "8b"}}\n</think>\n\n{EXAMPLE}',
        EXAMPLE.replace('"', "'").replace("}}}", "},},}"),  # single quotes, trailing commas: still repaired
    ],
)
def test_the_whole_reply_or_its_one_fenced_block_is_the_verdict(reply: str) -> None:
    verdict, error = parse_verdict(reply, RUBRIC_VERDICT_SCHEMA)
    assert error is None
    assert verdict == CONSTANT_VERDICT


def test_no_object_and_a_schema_invalid_object_keep_their_errors() -> None:
    assert parse_verdict("Both look fine.", PAIRWISE_VERDICT_SCHEMA)[1] == (
        "unparseable verdict: no JSON object in the reply ('Both look fine.')"
    )
    verdict, error = parse_verdict('{"better": "maybe", "score": {}}', PAIRWISE_VERDICT_SCHEMA)
    assert verdict is None
    assert error is not None
    assert error.startswith("schema-invalid verdict: $.better: 'maybe' is not one of")
    assert reply_object(None)[0] is None  # type: ignore[arg-type]
    assert reply_object('{"a": 1')[0] is None  # cut off: not completed


@pytest.mark.parametrize("schema", [RUBRIC_VERDICT_SCHEMA, INTENT_SCHEMA])
def test_the_judge_client_fails_a_refusal_where_it_scored_the_example(schema: dict) -> None:
    """Through the client (the pairwise judge and the intent judge both read verdicts there)."""
    refusal = (
        f"I cannot evaluate this. A verdict would look like {EXAMPLE if schema is RUBRIC_VERDICT_SCHEMA else INTENT}"
    )
    app = make_app(lambda messages: refusal)
    with running_server(app) as url:
        client = JudgeClient(url, "judge", api_key_env=None, timeout_s=5.0)

        async def main() -> object:
            try:
                return await client.judge([{"role": "user", "content": "compare"}], schema)
            finally:
                await client.aclose()

        result = asyncio.run(main())
    assert result.verdict is None  # type: ignore[attr-defined]
    assert "inside other text is not a verdict" in result.error  # type: ignore[attr-defined]
    assert client.pop_stats()["judge/invalid"] == 1
