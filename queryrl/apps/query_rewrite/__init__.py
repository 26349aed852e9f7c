"""The query rewriter, in folders by job: ``data/`` (your conversations, KdConv, the splits, the warm-up set),
``demo/`` (the synthetic sales chat), ``reward/`` (the reward and the judge), ``intent/`` (whether a rewrite
keeps the question), ``eval/`` (``queryrl eval``); beside them the prompts, the config node, the plugin,
its commands, training and preflight wiring.

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
