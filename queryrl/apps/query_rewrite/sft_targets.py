"""SFT targets for the warm start: the reference pipeline's rewrite in the policy's JSON format.

Before RL the policy must first answer in the JSON format at all (a random or generic model
rarely does). The usual warm start distils the reference pipeline: each prompt's target is the
reference rewriter's query (by default :class:`~queryrl.rag.HeuristicRewriter`, the rewriter the
embedded ``/rag/chat`` uses) with the profile and summary carried over from the input, as
``{"rewritten_query": ..., "user_profile": ..., "history_summary": ...}``. ``queryrl sft`` reads it
from ``extra_info.sft_target``. RL then has to beat the reference, not copy it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from queryrl.rag import HeuristicRewriter

SFT_TARGET_KEY = "sft_target"  # in extra_info


def reference_target(extra_info: Mapping[str, Any], rewriter: HeuristicRewriter | None = None) -> str:
    """The JSON answer the reference rewriter gives for one row's ``extra_info``."""
    rewriter = rewriter or HeuristicRewriter()
    contexts = list(extra_info.get("contexts") or [])
    summary = str(extra_info.get("history_summary") or "")
    query = rewriter.rewrite_sync(contexts, summary)
    profile = str(extra_info.get("user_profile") or "")
    answer = {"rewritten_query": query, "user_profile": profile, "history_summary": summary}
    return json.dumps(answer, ensure_ascii=False)


def add_sft_targets(rows: list[dict[str, Any]], rewriter: HeuristicRewriter | None = None) -> list[dict[str, Any]]:
    """`rows` with ``extra_info.sft_target`` set by :func:`reference_target` (rows are changed in place)."""
    rewriter = rewriter or HeuristicRewriter()
    for row in rows:
        info = row.setdefault("extra_info", {})
        info[SFT_TARGET_KEY] = reference_target(info, rewriter)
    return rows
