"""``queryrl eval``'s settings: the application's config, loaded exactly like ``queryrl train``'s.

The RAG service and the judge are the app's config nodes, ``app.query_rewrite.rag``
(:class:`~queryrl.apps.query_rewrite.config.QueryRewriteRAGConfig`) and ``app.query_rewrite.judge``
(:class:`~queryrl.apps.query_rewrite.config.QueryRewriteJudgeConfig`), read from
``load_config(--config or the defaults, overrides)`` (:func:`load_eval_config`): the same settings the
reward trains with. Dotted overrides work as for ``train`` (``app.query_rewrite.rag.top_k=10``,
``app.query_rewrite.judge.backend=openai``, verl aliases included); an unknown key is one error naming it.

The service options of ``queryrl eval`` are shorthands for dotted keys (:data:`SHORTHANDS`):
``--rag-url`` -> ``rag.url``, ``--corpus`` -> ``rag.corpus`` (and ``rag.url=null``: the embedded service,
unless ``--rag-url`` is given too), ``--top-k`` -> ``rag.top_k``, ``--judge`` -> ``judge.backend``,
``--judge-*`` / ``--position-swap`` -> ``judge.*`` (``--judge-api-key-env ''`` -> ``null``: a server
without key; ``--judge-extra-body JSON`` replaces ``judge.extra_body``). A shorthand and a dotted override
of the same key are an error.

Two eval-only rules keep the command's defaults:

- judging: ``--judge none`` judges nothing; otherwise the app's judge is used when ``--judge`` names a
  backend, when ``--config`` is given, or when the overrides set ``app.query_rewrite.judge.backend`` (or
  the launch script's ``gpt5_model``); without any of these nothing is judged;
- the reply budget of a model: ``data.max_response_length`` when ``--config`` is given or the overrides set
  it, else 64 (``--max-new-tokens`` wins over both).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from queryrl.apps.query_rewrite.config import FLAT_KEYS
from queryrl.apps.query_rewrite.eval.samples import EvalError

JUDGES = ("none", "offline", "openai")
DEFAULT_MAX_NEW_TOKENS = 64
_RAG, _JUDGE = "app.query_rewrite.rag", "app.query_rewrite.judge"
# eval option (its parameter name, a flat name of the app's settings) -> the dotted key it sets
_OPTIONS = "rag_url corpus top_k judge judge_base_url judge_model judge_api_key_env position_swap judge_temperature"
_OPTIONS += " judge_max_tokens judge_token_limit_param judge_reasoning_effort judge_extra_body"
SHORTHANDS = {name: f"app.query_rewrite.{FLAT_KEYS[name]}" for name in _OPTIONS.split()}


@dataclass(frozen=True)
class EvalConfig:
    """What ``queryrl eval`` runs with: the loaded config, whether to judge, and a model's default reply budget."""

    cfg: DictConfig
    judge: bool
    max_new_tokens: int


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _value(value: Any) -> str:
    """An override's value as YAML reads it back: strings double-quoted (JSON's quoting is YAML's)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)


def _extra_body(text: str) -> dict[str, Any]:
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvalError(f"--judge-extra-body: not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(extra, dict):
        raise EvalError(f'--judge-extra-body: expected a JSON object like \'{{"verbosity": "low"}}\', got {extra!r}')
    return extra


def _named(overrides: Sequence[str]) -> dict[str, str]:
    """The queryrl key each override sets (verl aliases translated) -> the override as given."""
    from queryrl.config import ConfigError
    from queryrl.config.aliases import translate_key

    named: dict[str, str] = {}
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        try:
            named[translate_key(key)] = item
        except ConfigError:  # a verl key without meaning here: load_config says so
            named[key] = item
    return named


def shorthand_overrides(options: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """The dotted key -> (the option that set it, its value) of the shorthand `options` that were given
    (None = not given); ``judge="none"`` sets nothing (see the module doc)."""
    given = {name: value for name, value in options.items() if value is not None}
    unknown = sorted(set(given) - set(SHORTHANDS))
    if unknown:
        raise TypeError(f"not an eval shorthand: {unknown}")
    if given.get("judge") == "none":
        del given["judge"]
    if given.get("judge_api_key_env") == "":  # a server that needs no key
        given["judge_api_key_env"] = None
    out = {SHORTHANDS[name]: (_option(name), value) for name, value in given.items()}
    if "corpus" in given and "rag_url" not in given:  # a corpus means the embedded service
        out[f"{_RAG}.url"] = ("--corpus", None)
    return out


def load_eval_config(config: str | Path | None = None, overrides: Sequence[str] = (), **options: Any) -> EvalConfig:
    """``queryrl eval``'s settings: `config` (None: the schema's defaults), the shorthand `options`
    (:data:`SHORTHANDS`, None = not given), then the dotted `overrides` (see the module doc).

    Raises:
        EvalError: a bad key or value (naming it), a shorthand and an override of the same key, an unknown
            ``--judge``, ``--judge-extra-body`` that is not a JSON object, or a ``???`` the eval needs.
    """
    from queryrl.config import ConfigError, load_config
    from queryrl.redaction import register_config_secrets

    backend = options.get("judge")
    if backend is not None and backend not in JUDGES:
        raise EvalError(f"unknown judge {backend!r}; use one of {', '.join(JUDGES)}")
    extra_text = options.pop("judge_extra_body", None)
    extra = _extra_body(extra_text) if extra_text is not None else None
    shorthands = shorthand_overrides(options)
    named = _named(overrides)
    for key, (option, _) in sorted(shorthands.items()) + (
        [(f"{_JUDGE}.extra_body", ("--judge-extra-body", 0))] if extra is not None else []
    ):
        clash = [item for k, item in named.items() if k == key or k.startswith(key + ".")]
        if clash:
            raise EvalError(f"{option} and the override {clash[0]!r} both set {key}: give one of the two")
    items = [f"{key}={_value(value)}" for key, (_, value) in shorthands.items()]
    try:  # eval reads the app's RAG and judge settings and the reply budget: a ??? model or data is fine
        cfg = load_config(config, [*items, *overrides], allow_missing=True)
    except ConfigError as exc:
        raise EvalError(str(exc)) from None
    register_config_secrets(cfg)
    qr = cfg.app.query_rewrite
    if extra is not None:
        qr.judge.extra_body = extra
    where = config if config is not None else "the config"
    if OmegaConf.is_missing(qr.rag, "url"):
        raise EvalError(f"{where} leaves app.query_rewrite.rag.url to you (???): give --rag-url URL")
    if OmegaConf.is_missing(cfg.model, "path") and qr.rag.reference_rewriter == "policy":
        raise EvalError(
            f"{where}: rag.reference_rewriter=policy reads model.path, which the preset leaves to you (???)"
        )
    judge = backend != "none" and (
        backend is not None
        or config is not None
        or f"{_JUDGE}.backend" in named
        or qr.seed_hybrid.gpt5_model is not None
    )
    budget_given = config is not None or "data.max_response_length" in named
    max_new_tokens = int(cfg.data.max_response_length) if budget_given else DEFAULT_MAX_NEW_TOKENS
    return EvalConfig(cfg, judge, max_new_tokens)
