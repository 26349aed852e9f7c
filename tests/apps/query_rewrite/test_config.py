"""The application's settings are one typed node: flat (verl-style) names lead into it, one judge-client builder
serves training, preflight and eval, and the defaults are written once, in the dataclasses."""

from __future__ import annotations

import asyncio
import json

import pytest

from queryrl.apps.query_rewrite.config import (
    FLAT_KEYS,
    MODE_WEIGHTS,
    QueryRewriteConfig,
    reward_weights,
    settings_from_flat,
    settings_of,
)
from queryrl.apps.query_rewrite.eval.run import _judge_client
from queryrl.apps.query_rewrite.preflight import reward_spec, uses_judge
from queryrl.apps.query_rewrite.reward.judge import judge_client
from queryrl.apps.query_rewrite.reward.score import compute_score
from queryrl.config import ConfigError, load_config

JUDGE = ["app.query_rewrite.judge.backend=openai", "app.query_rewrite.judge.base_url=http://127.0.0.1:9/v1"]


def test_every_flat_name_leads_to_a_key_of_the_node() -> None:
    node = QueryRewriteConfig()
    for name, key in FLAT_KEYS.items():
        target = node
        for part in key.split("."):
            assert hasattr(target, part), f"{name} -> {key}: no such key"
            target = getattr(target, part)


def test_reward_kwargs_with_the_app_on_are_written_to_the_node() -> None:
    cfg = load_config(
        None,
        [
            "app.query_rewrite.enable=true",
            "+reward.kwargs.judge_model=gpt-5-mini",
            "+reward.kwargs.top_k=7",
            "+reward.kwargs.weights.format=0.5",
        ],
    )
    qr = cfg.app.query_rewrite
    assert (qr.judge.model, qr.rag.top_k, qr.weights.format) == ("gpt-5-mini", 7, 0.5)
    assert dict(cfg.reward.kwargs) == {}  # one place holds the settings
    assert reward_weights(settings_of(cfg)) == MODE_WEIGHTS["group_judge"] | {"format": 0.5}
    with pytest.raises(ConfigError, match=r"reward\.kwargs: the query-rewrite reward takes no setting 'judge_modle'"):
        load_config(None, ["app.query_rewrite.enable=true", "+reward.kwargs.judge_modle=gpt-5"])
    off = load_config(None, ["+reward.kwargs.judge_modle=anything"])  # the app off: reward.kwargs is the user's
    assert off.reward.kwargs.judge_modle == "anything"


def test_flat_names_of_a_verl_call_are_checked_like_the_config() -> None:
    assert settings_from_flat({}).reward_mode == "mix"  # verl's function: mix's weights unless told
    assert settings_from_flat({"judge_model": "m", "rank_depth": 20}).rag.rank_depth == 20
    for bad, match in [
        ({"weights": {"bogus": 1.0}}, r"reward\.kwargs\.weights"),
        ({"top_k": "many"}, r"reward\.kwargs\.top_k='many'"),
        ({"intent_penalty": -1.0}, r"intent_penalty must be >= 0"),
        ({"judge_temperature": 3.0}, r"judge\.temperature must be in \[0, 2\]"),
    ]:
        with pytest.raises(ConfigError, match=match):
            settings_from_flat(bad)
    with pytest.raises(ConfigError, match=r"no setting 'judge_modle'"):
        asyncio.run(compute_score("s", json.dumps({"rewritten_query": "q"}), [], {}, judge_modle="m"))


def test_training_preflight_and_eval_share_one_judge_client() -> None:
    cfg = load_config(None, ["app.query_rewrite.enable=true", *JUDGE, "app.query_rewrite.judge.max_tokens=300"])
    settings = settings_of(cfg)
    assert uses_judge(settings)
    client = judge_client(settings.judge)
    assert _judge_client(cfg.app.query_rewrite.judge) is client  # queryrl eval
    assert reward_spec(cfg).load().settings == settings  # preflight scores with the run's own reward object
    assert (client.model, client.max_tokens) == ("gpt-5", 300)
    assert not uses_judge(settings_of(load_config(None, [*JUDGE, "app.query_rewrite.reward_mode=retrieval_rank"])))
