"""The knowledge base's names a conversation has mentioned, as the rewriter's history summary.

The policy's prompt shows the last few hundred characters of the conversation; the reference rewriter reads all
of it and knows the knowledge base's names. On KdConv travel most of the policy's losses to the reference are which
place it names: none where the turn leaves the place out, the conversation's earlier topic, or another place added
to a turn that names its own (``experiments/reference_losses.py``). A history summary that lists the names the
conversation has mentioned, latest last, gives the policy what the reference reads, in the field the users' own
rewriter already takes (``history_summary``, shown in the prompt when non-empty; the users' chatbot writes one).

``mentions_summary(contexts, pattern, limit)``: the names `pattern` finds in every message before the current turn
(the whole conversation, not only the prompt's window), each once, ordered by its last mention, the latest
`limit` of them, as one line ("对话中提到过（越靠后越近）：故宫、景山公园"); "" when there is none. Longest names win
where one contains another (:func:`~.kdconv_prep.entity_pattern`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MENTIONS_LABEL = {"zh": "对话中提到过（越靠后越近）：", "en": "Mentioned so far (latest last): "}
MENTIONS_SEPARATOR = {"zh": "、", "en": ", "}
MIN_NAME_CHARS = 2  # a one-character name ("X", "岛") matches inside too many other words


def mention_names(titles: Iterable[str]) -> list[str]:
    """The knowledge base's names a summary may list: those of at least :data:`MIN_NAME_CHARS` characters (the
    callers build the pattern with :func:`~.kdconv_prep.entity_pattern`, which this module cannot import)."""
    return [t for t in titles if len(t) >= MIN_NAME_CHARS]


def mentioned(contexts: Sequence[Mapping[str, Any]], pattern: re.Pattern[str], limit: int) -> list[str]:
    """The names `pattern` finds in `contexts` before its last message, ordered by last mention (latest last),
    at most the latest `limit`."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    last_seen: dict[str, int] = {}
    position = 0
    for message in contexts[:-1]:
        for match in pattern.finditer(str(message.get("content", ""))):
            last_seen[match.group(0)] = position
            position += 1
    ordered = sorted(last_seen, key=last_seen.__getitem__)
    return ordered[-limit:]


def mentions_summary(
    contexts: Sequence[Mapping[str, Any]], pattern: re.Pattern[str], limit: int, lang: str = "zh"
) -> str:
    """One line listing :func:`mentioned`'s names after :data:`MENTIONS_LABEL`; "" when the conversation has
    mentioned none before its current turn."""
    names = mentioned(contexts, pattern, limit)
    if not names:
        return ""
    key = "zh" if lang == "zh" else "en"
    return MENTIONS_LABEL[key] + MENTIONS_SEPARATOR[key].join(names)


def add_mentions(rows: Iterable[dict[str, Any]], pattern: re.Pattern[str], limit: int, lang: str = "zh") -> None:
    """Set each row's ``extra_info.history_summary`` to :func:`mentions_summary` of its ``contexts`` with the names
    `pattern` finds (:func:`~.kdconv_prep.entity_pattern` of :func:`mention_names`;
    in place, before :func:`~.kdconv_prep.windowed_rows` builds the prompts). A row that already has a summary keeps
    it and gets the line after it."""
    for row in rows:
        info = row["extra_info"]
        line = mentions_summary(info["contexts"], pattern, limit, lang)
        own = str(info.get("history_summary") or "").strip()
        info["history_summary"] = "\n".join(part for part in (own, line) if part)
