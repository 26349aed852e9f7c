"""The query rewriter: conversation data, prompts, the KdConv benchmark and the sales demo data.

The names below are imported on first use (PEP 562), so that finding the plugin
(:mod:`.plugin`, read by every ``queryrl`` command) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Conversation": "conversations",
    "Message": "conversations",
    "conversation_rows": "conversations",
    "conversations_to_rows": "conversations",
    "load_conversations": "conversations",
    "normalise_role": "conversations",
    "parse_doc_ids": "conversations",
    "prepare_conversations": "conversation_splits",
    "split_conversations": "conversation_splits",
    "make_catalogue": "demo_data",
    "make_dialogues": "demo_data",
    "sales_demo_corpus": "demo_data",
    "sales_demo_rows": "demo_data",
    "doc_id": "kdconv",
    "kdconv_corpus": "kdconv",
    "kdconv_rows": "kdconv",
    "load_kdconv_conversations": "kdconv",
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
