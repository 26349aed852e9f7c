"""The offline intent check: does a rewritten query still ask what the customer asked?

    verdict = check_intent(contexts, "朗月Max8 保修政策")   # contexts end with the customer's turn
    verdict.kept, verdict.code, verdict.reason               # True, "kept", "keeps the question (warranty)"

Retrieval metrics against gold documents do not see a rewrite that changes the question ("保修政策是什么"
-> "能七天无理由退吗" finds the same document), that answers it ("电话是多少" -> "电话是1234567890"), or
that is garbled. This check reads the conversation and the rewrite only (no model, no network), so the
demo, the benchmarks, the reward and ``queryrl eval`` all run it. It is a word-level check, precise
rather than clever: it says "changed" when it can name why, and otherwise "kept".

A rewrite keeps the intent unless (each a ``code``, checked in this order; the reason lists every one found):

- ``garbled``: U+FFFD, a lone surrogate, a control character, a noncharacter, an escape such as ``\\xe4``
  or UTF-8 read as Latin-1 (``"ä½ å¥½"``) anywhere in it, or a decoding loop (a piece of 1-4 characters
  :data:`LOOP_REPEATS` or more times in a row, ``赶快赶快赶快赶快``) the conversation does not have;
- ``answered``: it states an answer -- a question word followed by 是/为/： and a value that asks nothing
  (``"电话是1234567890"``, ``"地址是北京的海野鸭岛"``), or 位于 + a place -- that the customer's turn
  did not state itself;
- ``invented``: a digit run, or a model name with a digit (``pro7``), that occurs nowhere in the
  conversation (history, last turn, and the `sources` given: the CRM summary and profile); or a content
  word beside the question, in a clause that asks nothing, that occurs nowhere in it
  (``"知道排云殿吗？红烧肉"``: words added to the question are not read, a paraphrase is no invention);
- ``question_changed`` / ``question_dropped`` / ``question_added``: the question types
  (:data:`~.intent.words.QUESTION_CUES`: price, warranty, return, shipping, stock, phone, address,
  opening hours, ticket, ...) of the last turn are not all asked by the rewrite, or the rewrite asks a type
  the turn does not. A cue with two types (便宜: price or promotion) is kept by either. When the last turn
  names no type ("极光Pro7的话呢?"), the rewrite may take its types from the history, not from nowhere. A
  clause that tells a value (a cue, 是/为/： and a value that asks nothing, or 位于 and a place) beside a
  clause that asks is not asked ("电话是010-…，你知道这里的开放时间吗？" asks the hours only: KdConv's
  speakers answer the last question and ask the next in one turn), so a rewrite may leave it out;
- ``words_dropped``: a name of the last turn (a token with a latin letter: ``max8``, ``pro2``) is
  missing, more than half of the content words of its question clauses are missing (function words,
  pronouns, small talk, quantities, generic nouns and the question cues themselves do not count; a
  one-character slip of an unknown word, 云凡 for 云帆, counts as kept), or a kind of product/place
  (手机, 耳机, 景点) is replaced by another kind the conversation never named;
- ``question_dropped`` also: a rewrite that asks nothing and shares no name, question type or content
  word with the conversation (``"答复："`` for ``"能玩多久呢？"``);
- ``empty``: an empty rewrite of a turn that asks something; ``question_added`` for a turn that asks
  nothing (small talk: :func:`~queryrl.rag.rewriters.is_chitchat`, or no question word, type or content
  word) whose rewrite asks something.

Pronouns and ellipsis (这个, 它, 那): the rewrite may replace them with names from the history, and
those are not invented. Known slips of the demo's customers (:data:`~.intent.slips.HOMOPHONES`: 续行 for
续航, 包修 for 保修) are read as the word they stand for, in every text.

Limits. Chinese words come from jieba's precise mode (the tokenizer of the BM25 index), so a name that
jieba cuts into common words is only as safe as the half-of-the-words rule; a name written in Chinese
and replaced by another (故宫 -> 天坛) is caught when it was the question's only content word, not
always otherwise; numbers in Chinese characters (六千五) are not checked for invention; paraphrases of
the question words outside :data:`~.intent.words.QUESTION_CUES` are not known. An LLM judge
(:mod:`.intent.judge`) is the check to trust where one is configured.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jieba

from queryrl.apps.query_rewrite.intent.reading import (
    BREAKS,
    CJK,
    DIGITS,
    LINKS,
    Reading,
    alternation,
    bounded,
    normalise,
    read_text,
    without_told_clauses,
    x_not_x,
)
from queryrl.apps.query_rewrite.intent.words import ANSWER_VERBS, QUESTION_MARKERS
from queryrl.rag.rewriters import is_chitchat, last_user_turn

__all__ = [  # the reading's names the callers import from here
    "CODES",
    "KEPT",
    "NO_QUERY",
    "IntentVerdict",
    "check_intent",
    "garbled",
    "normalise",
    "read_text",
    "without_told_clauses",
]

KEPT = "kept"
CODES = (
    KEPT,
    "garbled",
    "answered",
    "invented",
    "question_changed",
    "question_dropped",
    "question_added",
    "words_dropped",
    "empty",
    "no_query",
)

# a list number before the query ("1. ", "2、", "(3) ", "①"): layout, not a number the rewrite states
_ENUMERATOR = re.compile(r"^\s*(?:[(（]?[0-9]{1,2}[)）.、](?![0-9])|[①-⑩])\s*")
LOOP_REPEATS = 4
_LOOP = re.compile(rf"(.{{1,4}}?)\1{{{LOOP_REPEATS - 1},}}")
# garbled text: replacement character, surrogates, C0/C1 controls but tab/newline, noncharacters, escaped
# bytes or code points written out, UTF-8 read as Latin-1 (a lead byte then a continuation byte)
_GARBLED = re.compile(
    r"[\ufffd\ud800-\udfff\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff]"
    r"|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|[\u00c2-\u00f4][\u0080-\u00bf]"
)


@dataclass(frozen=True)
class IntentVerdict:
    """Whether a rewrite keeps the customer's intent: ``kept``, a ``code`` (:data:`CODES`) and a ``reason``."""

    kept: bool
    code: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"kept": self.kept, "code": self.code, "reason": self.reason}


NO_QUERY = IntentVerdict(False, "no_query", "no query: the reply did not parse")


def garbled(text: str) -> str | None:
    """What makes `text` garbled (``"U+FFFD"``, ``"control U+0007"``, ``"escaped byte '\\\\xe4'"``, ...), or None."""
    match = _GARBLED.search(text)
    if match is None:
        return None
    piece = match.group(0)
    if len(piece) > 1:
        what = "escaped or mis-decoded bytes" if piece.startswith("\\") else "UTF-8 read as Latin-1"
        return f"{what} {piece!r}"
    code = ord(piece)
    if piece == "\ufffd":
        return "replacement character U+FFFD"
    if 0xD800 <= code <= 0xDFFF:
        return f"lone surrogate U+{code:04X}"
    if piece in "\ufffe\uffff":
        return f"noncharacter U+{code:04X}"
    return f"control character U+{code:04X}"


def _loop(text: str, conversation: str) -> str | None:
    """A piece of 1-4 characters that `text` repeats :data:`LOOP_REPEATS` or more times in a row (a decoding
    loop, ``赶快赶快赶快赶快``) where `conversation` does not, or None."""
    compact = normalise(text).replace(" ", "")
    for match in _LOOP.finditer(compact):
        if match.group(0) not in conversation:
            unit = match.group(1)
            return f"a loop: {unit!r} {len(match.group(0)) // len(unit)} times in a row"
    return None


# --- the check -----------------------------------------------------------------------------------


def _kept_word(word: str, rewrite: str) -> bool:
    """`word` occurs in the compact `rewrite`, or (a word jieba does not know: a name or a slip) a string of
    the same length that differs from it in one character does (云凡 for 云帆)."""
    if word in rewrite:
        return True
    if jieba.get_FREQ(word):
        return False
    n = len(word)
    for i in range(len(rewrite) - n + 1):
        piece = rewrite[i : i + n]
        if sum(a != b for a, b in zip(piece, word, strict=True)) == 1 and all(CJK.match(c) for c in piece):
            return True
    return False


def _kept_name(name: str, rewrite: Reading) -> bool:
    return name in rewrite.names or bounded(name, rewrite.compact)


def _answer(rewrite: Reading, last: Reading) -> str | None:
    """The answer `rewrite` states (a cue, a link and a value that asks nothing), unless the turn says it."""
    text = rewrite.compact
    heads = alternation({*rewrite.cues, *ANSWER_VERBS})
    for match in re.finditer(rf"(?:{heads})(?:的)?(?:{LINKS})?([^{BREAKS}]+)", text):
        head_only = match.group(0)[: len(match.group(0)) - len(match.group(1))]
        verb = any(head_only.startswith(v) for v in ANSWER_VERBS)
        if not verb and not re.search(rf"(?:{LINKS})$", head_only):
            continue  # a cue with no 是/为/： after it: part of a query ("价格 max8"), not a statement
        value = match.group(1)
        if any(m in value for m in QUESTION_MARKERS) or x_not_x(value) or match.group(0) in last.compact:
            continue
        return match.group(0)
    return None


def _type_problems(last: Reading, rewrite: Reading, history_types: frozenset[str]) -> list[tuple[str, str]]:
    """The question-type problems: a slot of the turn the rewrite does not ask, a slot it asks from nowhere."""
    asked = rewrite.types
    dropped = [slot for slot in last.slots if not slot & asked]
    allowed = (last.types if last.slots else history_types) | last.hinted
    added = [slot for slot in rewrite.slots if not slot & allowed]
    if dropped and added:
        return [("question_changed", f"asks {_type_names(added)} instead of {_type_names(dropped)}")]
    if dropped:
        return [("question_dropped", f"no longer asks {_type_names(dropped)}")]
    if added:
        where = "the turn" if last.slots else "the turn or its history"
        return [("question_added", f"asks {_type_names(added)}, which {where} does not")]
    return []


def _type_names(slots: Iterable[frozenset[str]]) -> str:
    return ", ".join(sorted({"/".join(sorted(slot)) for slot in slots}))


def _shares_words(rewrite: Reading, conversation: Reading) -> bool:
    """`rewrite` has a name, a question type or a content word the conversation has."""
    if rewrite.slots or any(_kept_name(n, conversation) for n in rewrite.names):
        return True
    return any(_kept_word(w, conversation.compact) for w in (*rewrite.words, *rewrite.aside))


def _word_problems(last: Reading, rewrite: Reading, conversation: str) -> list[tuple[str, str]]:
    problems = []
    lost_names = [n for n in last.names if not _kept_name(n, rewrite)]
    if lost_names:
        problems.append(("words_dropped", f"drops the name(s) {', '.join(lost_names)}"))
    lost = [w for w in last.words if not _kept_word(w, rewrite.compact)]
    if last.words and len(lost) * 2 > len(last.words):
        problems.append(("words_dropped", f"drops {len(lost)} of {len(last.words)} content words ({', '.join(lost)})"))
    new_kinds = sorted(c for c in rewrite.categories if c not in conversation)
    kept_kind = any(a in b or b in a for a in last.categories for b in rewrite.categories)  # 笔记本 ~ 笔记本电脑
    if last.categories and new_kinds and not kept_kind:
        was = ", ".join(sorted(last.categories))
        problems.append(("words_dropped", f"asks about {', '.join(new_kinds)} instead of {was}"))
    return problems


def _invented(rewrite: Reading, conversation: Reading) -> list[str]:
    """The model names with a digit, the digit runs, and the content words beside its question (``aside``) of
    `rewrite` that `conversation` never has (a word counts as had with a one-character slip,
    :func:`_kept_word`)."""
    names = [n for n in rewrite.names if DIGITS.search(n) and not _kept_name(n, conversation)]
    numbers = [x for x in sorted(rewrite.numbers - conversation.numbers) if not any(x in n for n in names)]
    words = [w for w in rewrite.aside if not _kept_word(w, conversation.compact)]
    return names + numbers + words


def check_intent(
    contexts: Sequence[Mapping[str, Any]],
    rewrite: str | None,
    sources: Iterable[str] = (),
    small_talk: bool | None = None,
) -> IntentVerdict:
    """Whether `rewrite` keeps the intent of the conversation's last user turn (see the module doc).

    Args:
        contexts: the conversation, ``[{"role", "content"}, ...]``, with a user turn (the last one is asked).
        rewrite: the rewritten query; None: the reply did not parse (:data:`NO_QUERY`); "" abstains.
        sources: more text the conversation holds (the CRM summary, the profile): names and numbers found
            there are not invented, question types there resolve an ellipsis.
        small_talk: the turn is labelled as needing no retrieval (an empty rewrite keeps it); None: decided
            from the text (:func:`~queryrl.rag.rewriters.is_chitchat`, or nothing asked).

    Raises:
        ValueError: `contexts` has no user turn, or a message or `rewrite` is not text.
    """
    if rewrite is None:
        return NO_QUERY
    if not isinstance(rewrite, str):
        raise ValueError(f"rewrite must be a string or None, got {type(rewrite).__name__}")
    index, last_text = last_user_turn(contexts)
    if index < 0:
        raise ValueError("contexts has no user turn: the intent check needs the customer's last turn")
    history = [_text(m, i) for i, m in enumerate(contexts[:index])] + [str(s) for s in sources if s]
    last = read_text(last_text)
    whole = read_text("\n".join([*history, last_text]))
    asks_nothing = small_talk if small_talk is not None else is_chitchat(last_text) or not _asks(last)
    query = rewrite.strip()
    if not query:
        if asks_nothing:
            return IntentVerdict(True, KEPT, "an empty query for a turn that asks nothing")
        return IntentVerdict(False, "empty", "an empty query, but the turn asks something")
    broken = garbled(query) or _loop(query, whole.compact)
    if broken:
        return IntentVerdict(False, "garbled", f"garbled: {broken}")
    mine = read_text(_ENUMERATOR.sub("", query, count=1) or query)
    problems: list[tuple[str, str]] = []
    answer = _answer(mine, last)
    if answer:
        problems.append(("answered", f"states an answer ({answer}) instead of asking"))
    facts = _invented(mine, whole)
    if facts:
        problems.append(("invented", f"{', '.join(facts)} occur(s) nowhere in the conversation"))
    if asks_nothing:  # names from the history may be added; a question may not
        if (mine.asks and not last.asks) or mine.types - last.types:
            problems.append(("question_added", "asks something, but the turn asks nothing (small talk)"))
    else:
        history_types = read_text("\n".join(history)).types if history else frozenset()
        problems += _type_problems(last, mine, history_types)
        problems += _word_problems(last, mine, whole.compact)
        if not problems and not mine.asks and not _shares_words(mine, whole):  # "1. 答复：" for "能玩多久呢？"
            problems.append(("question_dropped", "asks nothing, and none of its words is in the conversation"))
    if problems:
        return IntentVerdict(False, problems[0][0], "; ".join(reason for _, reason in problems))
    if asks_nothing:
        return IntentVerdict(True, KEPT, "asks nothing, as the turn")
    types = ", ".join(sorted(last.types or mine.types)) or "no question type"
    return IntentVerdict(True, KEPT, f"keeps the question ({types})")


def _asks(reading: Reading) -> bool:
    """The text asks something: a question word, a question type (or a character of one), a name or a word."""
    return reading.asks or bool(reading.slots or reading.hinted or reading.names or reading.words)


def _text(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, str):
        raise ValueError(f"contexts[{index}] must be a message with a string 'content', got {message!r:.80}")
    return content
