"""The query-rewrite application as a queryrl plugin (entry point ``queryrl.apps: query_rewrite``).

It brings the ``app.query_rewrite`` config node (:mod:`.config`), the users' launch-script keys
(``algorithm.hybrid_grpo_gpt5.*``), its reward (:func:`~.reward.score.compute_score` under the ``async``
manager, see :mod:`.training`), seed_hybrid's candidate selector, the services preflight and ``--dry-run``
check, the ``sales_demo`` built-in dataset, the ``sales_demo`` and ``kdconv:KB_PATH`` corpora
(:mod:`.corpora`) and the ``policy`` reference rewriter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig

from queryrl.application import Application, AppReward, CommandLine
from queryrl.apps.query_rewrite.config import (
    QueryRewriteConfig,
    move_reward_kwargs,
    resolve_seed_keys,
    settings_of,
    validate_settings,
)
from queryrl.apps.query_rewrite.corpora import BuiltinCorpus, register_corpus
from queryrl.config import ConfigError

DEMO_PREFIX = "builtin://sales_demo"
DEMO_DATA_SOURCE = "query_rewrite/sales_demo"


class QueryRewriteApp(Application):
    """``app.query_rewrite``: train a RAG chatbot's query rewriter against a judge and retrieval."""

    name = "query_rewrite"
    config = QueryRewriteConfig
    aliases: ClassVar[Mapping[str, str]] = {"algorithm.hybrid_grpo_gpt5.*": "app.query_rewrite.seed_hybrid.*"}
    free_form = ("judge.extra_body", "rag.document_fields")
    # where the services live and how patiently they are called (a restarted server gets a new port);
    # which judge model, rubric and retriever answer is not in this list
    resume_may_differ = (
        "app.query_rewrite.judge.base_url",
        "app.query_rewrite.judge.api_key_env",
        "app.query_rewrite.judge.timeout_s",
        "app.query_rewrite.judge.max_retries",
        "app.query_rewrite.rag.url",
        "app.query_rewrite.rag.token_env",
        "app.query_rewrite.rag.timeout_s",
        "app.query_rewrite.rag.max_retries",
        "app.query_rewrite.rag.reference_base_url",
        "app.query_rewrite.rag.reference_api_key_env",
    )

    def setup(self) -> None:
        from queryrl.data.builtin import register_builtin_dataset
        from queryrl.rag.rewriters import REWRITERS

        register_builtin_dataset("sales_demo", _sales_demo_rows, version=8)  # builtin://sales_demo/{train,val,test}
        # app.query_rewrite.rag.corpus: the demo's catalogue (its own entities), a KdConv knowledge base
        register_corpus("sales_demo", BuiltinCorpus(_sales_demo_corpus, title_entities=False))
        register_corpus("kdconv", BuiltinCorpus(_kdconv_corpus, argument="KB_PATH", latin_entities=False))
        REWRITERS.register("policy")(_policy_rewriter)  # the reference rewriter "policy": a model folder

    def resolve(self, cfg: DictConfig) -> None:
        qr = cfg.app.query_rewrite
        if qr.seed_hybrid.enable:  # the users' launch-script keys select seed_hybrid
            qr.enable = True
            qr.reward_mode = "seed_hybrid"
        resolve_seed_keys(cfg)
        move_reward_kwargs(cfg)

    def validate(self, cfg: DictConfig) -> None:
        validate_settings(cfg)
        if cfg.app.query_rewrite.enable:
            check_no_other_reward(cfg)

    def reward(self, cfg: DictConfig) -> AppReward:
        from queryrl.apps.query_rewrite.reward.score import QueryRewriteReward

        check_no_other_reward(cfg)
        label, manager = self.reward_plan(cfg)
        return AppReward(QueryRewriteReward.from_config(cfg), manager=manager, label=label)

    def reward_plan(self, cfg: DictConfig) -> tuple[str, str]:
        # RAG and judge calls are I/O: concurrently under the async manager
        return f"query_rewrite app, reward_mode {cfg.app.query_rewrite.reward_mode}", "async"

    def selector(self, cfg: DictConfig) -> Any:
        from queryrl.apps.query_rewrite.training import make_selector

        return make_selector(cfg)

    def preflight(self, cfg: DictConfig) -> tuple[list[Any], Any]:
        from queryrl.apps.query_rewrite.preflight import reward_spec, service_checks

        return service_checks(cfg), reward_spec(cfg)

    def sft_targets(
        self, cfg: DictConfig, source: str, rows: Sequence[tuple[int, Mapping[str, Any]]]
    ) -> Sequence[tuple[str, str] | None] | None:
        """With ``app.query_rewrite.sft_target=rag_chat``: each row's ``/rag/chat`` rewrite as its answer
        (:func:`~queryrl.apps.query_rewrite.data.sft_rag.rag_chat_targets`); otherwise the rows' own."""
        if cfg.app.query_rewrite.sft_target != "rag_chat":
            return None
        from queryrl.apps.query_rewrite.data.sft_rag import rag_chat_targets

        qr = settings_of(cfg)
        return rag_chat_targets(source, rows, qr.rag, max(1, int(cfg.reward.max_concurrency)))

    def vocab_texts(self, cfg: DictConfig) -> Iterable[str]:
        """``model.vocab.restrict``: the embedded RAG service's corpus (titles and contents), whose names a
        rewrite copies; nothing when the service is external (``rag.url``) or has no corpus."""
        rag = cfg.app.query_rewrite.rag
        if rag.url or not rag.corpus:
            return ()
        from queryrl.apps.query_rewrite.reward.rag import corpus_documents

        return (text for doc in corpus_documents(str(rag.corpus)) for text in (doc.title, doc.content))

    def learning_problem(self, cfg: DictConfig, metrics: Mapping[str, float]) -> str | None:
        """No reply of the step parsed (``reward/parsed/mean`` 0), or every reply was an empty query where
        retrieval was needed (``reward/empty_query/mean`` 1): RAG and judge saw nothing to compare."""
        parsed, empty = metrics.get("reward/parsed/mean"), metrics.get("reward/empty_query/mean")
        if parsed == 0.0:
            fmt = "JSON with rewritten_query" if cfg.app.query_rewrite.unparsed == "floor" else "a usable line"
            return (
                f"no answer of the step parsed ({fmt}): no RAG or judge request was made. Prepare the data "
                "with --answer-format text, set app.query_rewrite.unparsed=retrieve, or warm the model up "
                "first (queryrl warmup, then queryrl sft)"
            )
        if empty == 1.0:
            return (
                "every rewrite of the step was an empty query on a turn that needs retrieval: nothing was "
                "searched (see the samples files; an empty query means 'no retrieval needed')"
            )
        return None

    def commands(self, cli: CommandLine) -> None:
        from queryrl.apps.query_rewrite.commands import add_commands

        add_commands(cli)

    def plan(self, cfg: DictConfig, add: Callable[..., None], problem: Callable[[str], None]) -> None:
        qr = cfg.app.query_rewrite
        j = qr.judge
        if j.backend == "openai":
            key = "no key (api_key_env=null)"
            if j.api_key_env:
                given = bool(os.environ.get(j.api_key_env))
                key = f"key from ${j.api_key_env}: {'set' if given else 'NOT SET'}"
                if not given:
                    problem(
                        f"app.query_rewrite.judge: the key variable {j.api_key_env} is not set "
                        "(export it, or judge.api_key_env=null for a server without key)"
                    )
            limit = f"max_tokens {j.max_tokens}" if j.max_tokens is not None else "max_tokens unset (the server's)"
            effort = f"reasoning_effort {j.reasoning_effort or 'unset'}"
            prices = (j.price_per_million_input, j.price_per_million_output)
            cost = (
                f"prices per million tokens {prices[0]} in / {prices[1]} out: an estimated cost is shown"
                if prices[0] is not None
                else "no prices set: its tokens are shown, no cost"
            )
            head = f"openai-compatible, model {j.model!r} at {j.base_url}, {key}, timeout {j.timeout_s} s"
            add("judge", head, f"{limit}, {effort}; {cost}")
        else:
            add("judge", "offline (gold documents of the data, no LLM)")
        if qr.rag.url:
            from queryrl.rag.client import endpoint_url

            chat_8b, chat = endpoint_url(qr.rag.url, "chat_8b"), endpoint_url(qr.rag.url, "chat")
            add("rag", f"chat_8b: {chat_8b}", f"chat:    {chat}")
        else:
            add("rag", f"embedded in-process service over corpus {qr.rag.corpus!r} ({qr.rag.retriever})")
        fallback = demo_fallback_problem(cfg)
        if fallback:
            problem(fallback)


def check_no_other_reward(cfg: DictConfig) -> None:
    """The application scores with its own reward: a ``reward.function.path`` (other than the application's
    function) or ``reward.functions`` would be ignored, so either is a config error (``--dry-run`` says it too).

    Raises:
        ConfigError: naming the key to remove.
    """
    from queryrl.apps.query_rewrite.training import REWARD_FUNCTION

    function = cfg.reward.function.path
    if function and function != REWARD_FUNCTION:
        raise ConfigError(
            f"app.query_rewrite.enable=true brings its own reward; reward.function.path={function!r} "
            "would replace it: remove one of the two"
        )
    if cfg.reward.functions:
        named = ", ".join(f"{f.path}:{f.name}" for f in cfg.reward.functions)
        raise ConfigError(
            f"app.query_rewrite.enable=true brings its own reward; reward.functions ({named}) would replace it: "
            "remove one of the two"
        )


# imported when used: finding the plugin (every queryrl command) must not import torch
def _sales_demo_rows(split: str) -> list[dict[str, Any]]:
    from queryrl.apps.query_rewrite.demo.data import sales_demo_rows

    return sales_demo_rows(split)


def _sales_demo_corpus(_: str) -> list[dict[str, Any]]:
    from queryrl.apps.query_rewrite.demo.data import sales_demo_corpus

    return sales_demo_corpus()


def _kdconv_corpus(kb_path: str) -> list[dict[str, Any]]:
    from queryrl.apps.query_rewrite.data.kdconv import kdconv_corpus

    return kdconv_corpus(kb_path)


def _policy_rewriter(model_path: str, **kwargs: Any) -> Any:
    from queryrl.apps.query_rewrite.policy_rewriter import PolicyRewriter

    return PolicyRewriter(model_path, **kwargs)


def demo_fallback_problem(cfg: DictConfig) -> str | None:
    """A message when the user's own data would be scored by the embedded demo's RAG and judge.

    The demo's services (``rag.url`` unset, ``rag.corpus=sales_demo``, the offline judge) retrieve from
    a synthetic phone catalogue; on anyone else's conversations that trains on noise without a sign.
    Data counts as the demo's when it is ``builtin://sales_demo/...`` or a file whose rows all come from
    it (``data_source`` ``query_rewrite/sales_demo``).
    """
    qr = cfg.app.query_rewrite
    if not qr.enable or qr.rag.url or qr.rag.corpus != "sales_demo" or qr.judge.backend != "offline":
        return None
    own = [str(f) for f in cfg.data.train_files if not _is_demo_data(str(f))]
    if not own:
        return None
    return (
        f"data.train_files {', '.join(own)} is your data, but the RAG service and the judge are the embedded "
        "demo's (a synthetic phone catalogue, an offline judge): give your RAG service "
        "(app.query_rewrite.rag.url=http://HOST:PORT, or +algorithm.hybrid_grpo_gpt5.rag_endpoint=URL "
        "+algorithm.hybrid_grpo_gpt5.reference_endpoint=URL) or your corpus (app.query_rewrite.rag.corpus=FILE), "
        "and your judge (app.query_rewrite.judge.backend=openai app.query_rewrite.judge.base_url=URL "
        "app.query_rewrite.judge.model=NAME, or +algorithm.hybrid_grpo_gpt5.gpt5_model=NAME)"
    )


def _is_demo_data(f: str) -> bool:
    if f.startswith(DEMO_PREFIX):
        return True
    path = Path(f).expanduser()
    if not path.is_file():
        return False
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            sources = pq.read_table(path, columns=["data_source"]).column("data_source").to_pylist()
        elif path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as fh:
                sources = [json.loads(line).get("data_source") for line in fh if line.strip()]
        else:
            return False
    except (OSError, ValueError, KeyError):  # unreadable here: the loader reports it; not the demo's
        return False
    return bool(sources) and all(s == DEMO_DATA_SOURCE for s in sources)
