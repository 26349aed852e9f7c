"""Untrusted text fenced for an LLM judge: the ``<data>`` block both judges of the application put it in.

The pairwise rubric (:mod:`.reward.judging`) and the LLM intent check (:mod:`.intent.judge`) show a judge the
conversation, the policy's rewrite and documents only as strings of ONE JSON object between
:data:`DATA_OPEN` and :data:`DATA_CLOSE`. Each string is cleaned first (:func:`clean_data`): the delimiters
are removed, in any case and spacing, so no string can close the block, and it is truncated. ``json.dumps``
then escapes quotes and newlines, so no string can end its field.

A leaf of the application (only the standard library): both judges import it, neither imports the other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

DATA_OPEN, DATA_CLOSE = "<data>", "</data>"
_DELIMITER = re.compile(r"</?\s*data\s*>", re.IGNORECASE)


def clean_data(text: Any, max_chars: int) -> str:
    """A data string: delimiters removed, truncated to `max_chars` (with an ellipsis)."""
    s = _DELIMITER.sub("", str(text if text is not None else ""))
    return s if len(s) <= max_chars else s[:max_chars] + "…"


def clean_conversation(contexts: Sequence[Mapping[str, Any]], max_turn_chars: int) -> list[dict[str, str]]:
    """The conversation as a judge sees it: each message's role and content, cleaned and truncated."""
    return [
        {"role": clean_data(m.get("role"), 20), "content": clean_data(m.get("content"), max_turn_chars)}
        for m in contexts
    ]
