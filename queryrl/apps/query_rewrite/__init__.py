"""The query rewriter, in parts stacked like the library's layers: a part imports only the library and the
parts above it in this list (``tests/test_layering.py`` reads every import, lazy ones too, and fails on one
that goes down):

1. the leaves: ``config`` (the ``app.query_rewrite`` node), ``prompts`` (the prompt and the answer's parser),
   ``metrics`` (retrieval and judge metrics, the bootstrap), ``corpora`` (the embedded service's corpora by
   name), ``fencing`` (the ``<data>`` block a judge is shown untrusted text in);
2. ``intent/``: whether a rewrite keeps the customer's question (its word lists and its table of known
   slips are its own);
3. ``reward/``: the reward (RAG requests and clients, the pairwise judge, the modes, the score);
4. ``policy_rewriter``, ``training``: a model folder as the reference rewriter; the trainer's hooks;
5. ``data/``: your conversations, KdConv, the splits, the SFT targets (made by the reward's parser or the
   RAG service's ``/rag/chat``, so below ``reward/``);
6. ``demo/``: the synthetic sales chat, made into rows as ``data/`` makes them;
7. ``eval/``: ``queryrl eval``, which reads any data ``data/`` reads (a KdConv file prepared on the fly)
   and scores with the reward's parts;
8. ``warmup``: the warm-up set of ``queryrl warmup``, a model's own rewrites scored as ``eval/`` scores;
9. ``preflight``, ``commands``: the services check before training, the CLI commands;
10. ``plugin``: the entry point, which wires all of it and registers the ``sales_demo`` dataset, the
    ``sales_demo`` and ``kdconv:KB_PATH`` corpora and the ``policy`` rewriter by name.

Why ``data/`` sits below ``reward/`` and above ``eval/``: preparing data uses the reward's parser and RAG
client, and evaluating reads every data format; the one job of ``data/`` that needs the evaluation (sampling
and scoring a model's rewrites) is ``warmup``, below ``eval/``. The corpora are looked up by name
(:func:`~queryrl.apps.query_rewrite.corpora.find_corpus`) so that the reward retrieves from the demo's
catalogue or a KdConv knowledge base without importing either.

The names below are imported on first use (PEP 562), so that finding the plugin
(:mod:`.plugin`, read by every ``queryrl`` command) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Conversation": "data.conversations",
    "Message": "data.conversations",
    "conversation_rows": "data.conversations",
    "conversations_to_rows": "data.conversations",
    "load_conversations": "data.conversations",
    "normalise_role": "data.conversations",
    "parse_doc_ids": "data.conversations",
    "prepare_conversations": "data.splits",
    "split_conversations": "data.splits",
    "make_catalogue": "demo.data",
    "make_dialogues": "demo.data",
    "sales_demo_corpus": "demo.data",
    "sales_demo_rows": "demo.data",
    "doc_id": "data.kdconv",
    "kdconv_corpus": "data.kdconv",
    "kdconv_rows": "data.kdconv",
    "load_kdconv_conversations": "data.kdconv",
    "SYSTEM_PROMPTS": "prompts",
    "ParsedRewrite": "prompts",
    "build_messages": "prompts",
    "parse_rewrite": "prompts",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return __all__
