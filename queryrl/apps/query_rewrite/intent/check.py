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
  (:data:`~.intent_words.QUESTION_CUES`: price, warranty, return, shipping, stock, phone, address,
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
those are not invented. Known slips of the demo's customers (:data:`~.demo_phrases.HOMOPHONES`: 续行 for
续航, 包修 for 保修) are read as the word they stand for, in every text.

Limits. Chinese words come from jieba's precise mode (the tokenizer of the BM25 index), so a name that
jieba cuts into common words is only as safe as the half-of-the-words rule; a name written in Chinese
and replaced by another (故宫 -> 天坛) is caught when it was the question's only content word, not
always otherwise; numbers in Chinese characters (六千五) are not checked for invention; paraphrases of
the question words outside :data:`~.intent_words.QUESTION_CUES` are not known. An LLM judge
(:mod:`.intent_judge`) is the check to trust where one is configured.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jieba

from queryrl.apps.query_rewrite.demo.phrases import BRAND_HOMOPHONES, HOMOPHONES
from queryrl.apps.query_rewrite.intent.words import (
    ANSWER_LINKS,
    ANSWER_VERBS,
    CATEGORY_WORDS,
    CLAUSE_BREAKS,
    GENERIC_WORDS,
    QUESTION_CUES,
    QUESTION_MARKERS,
    STOP_CHARS,
    STOPWORDS,
)
from queryrl.rag.rewriters import CHITCHAT_WORDS, is_chitchat, last_user_turn

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

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[a-z]")
_DIGITS = re.compile(r"[0-9]+")
# a list number before the query ("1. ", "2、", "(3) ", "①"): layout, not a number the rewrite states
_ENUMERATOR = re.compile(r"^\s*(?:[(（]?[0-9]{1,2}[)）.、](?![0-9])|[①-⑩])\s*")
_SPACE = re.compile(r"\s+")
LOOP_REPEATS = 4
_LOOP = re.compile(rf"(.{{1,4}}?)\1{{{LOOP_REPEATS - 1},}}")
# garbled text: replacement character, surrogates, C0/C1 controls but tab/newline, noncharacters, escaped
# bytes or code points written out, UTF-8 read as Latin-1 (a lead byte then a continuation byte)
_GARBLED = re.compile(
    r"[\ufffd\ud800-\udfff\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff]"
    r"|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|[\u00c2-\u00f4][\u0080-\u00bf]"
)
_CUES = sorted(QUESTION_CUES, key=lambda c: (-len(c), c))  # longest first: a longer cue wins its span


# a character of a cue -> the types of the cues it is in: a lone 扣 ("说说扣", 折扣 with a character lost)
# may mean promotion; such hints only excuse a type the rewrite adds, they never demand one
def _cue_characters() -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for cue, types in QUESTION_CUES.items():
        for ch in cue if len(cue) > 1 else ():
            if ch not in STOP_CHARS:
                out[ch] = out.get(ch, frozenset()) | types
    return out


_CHAR_TYPES = _cue_characters()
_CHITCHAT = frozenset(CHITCHAT_WORDS)
# 一天, 两年, 半个月: a quantity is a detail of the question, not what it asks (十三陵, 八达岭 are names)
_QUANTITY = re.compile(
    r"^[一二两三四五六七八九十百千万几半每]+(?:个|天|年|月|周|日|小时|分钟|次|块|元|台|只|件|寸|斤|公里|米|岁|星期|倍|折)"
)
# the demo customers' slips (typo -> the word meant), longest first
_SLIPS = sorted(
    [(typo, word) for word, typos in HOMOPHONES.items() for typo in typos]
    + [(typo, word) for word, typo in BRAND_HOMOPHONES.items()],
    key=lambda p: -len(p[0]),
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


def normalise(text: str) -> str:
    """NFKC (full-width letters and digits become ASCII), lowercase, whitespace runs as one space, and the
    known slips (:data:`~.demo_phrases.HOMOPHONES`) replaced by the word they stand for."""
    out = _SPACE.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()
    for typo, word in _SLIPS:
        out = out.replace(typo, word)
    return out


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


# --- reading one text ----------------------------------------------------------------------------


@dataclass
class Reading:
    """What the check reads of one text (normalised): its question types, names, numbers and words.

    ``slots``: one set of question types per cue found (either type keeps it); ``hinted``: the types a lone
    character may stand for (:data:`_CHAR_TYPES`); ``names``: tokens with a latin letter; ``numbers``: digit
    runs; ``words``: the content words of its question clauses (see the module doc); ``aside``: those of its
    other clauses when it has a question clause (``知道排云殿吗？红烧肉``: 红烧肉); ``categories``: kinds of
    thing it names; ``asks``: it has a question word or a cue.
    """

    compact: str  # normalised, spaces removed
    slots: list[frozenset[str]] = field(default_factory=list)
    hinted: frozenset[str] = frozenset()
    cues: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    numbers: set[str] = field(default_factory=set)
    words: list[str] = field(default_factory=list)
    aside: list[str] = field(default_factory=list)
    categories: set[str] = field(default_factory=set)
    asks: bool = False

    @property
    def types(self) -> frozenset[str]:
        return frozenset().union(*self.slots) if self.slots else frozenset()


def _bounded(pattern: str, text: str) -> bool:
    """`pattern` occurs in `text` not inside a longer latin/digit run (``x3`` is not in ``x30``)."""
    return re.search(rf"(?<![a-z0-9]){re.escape(pattern)}(?![a-z0-9])", text) is not None


def _cue_spans(compact: str) -> list[tuple[int, int, str]]:
    """(start, end, cue) of the question cues in `compact`, longest first, spans never shared; in order."""
    taken = [False] * len(compact)
    spans = []
    for cue in _CUES:
        start = compact.find(cue)
        while start >= 0:
            end = start + len(cue)
            latin_ok = not _LATIN.search(cue) or _bounded(cue, compact[max(0, start - 1) : end + 1])
            if latin_ok and not any(taken[start:end]):
                taken[start:end] = [True] * len(cue)
                spans.append((start, end, cue))
            start = compact.find(cue, start + 1)
    return sorted(spans)


def _clauses(compact: str) -> list[tuple[int, int]]:
    """(start, end) of the clauses of `compact`, cut at :data:`~.intent_words.CLAUSE_BREAKS` (kept in the
    clause they end, so a clause ending in ？ is a question)."""
    out, start = [], 0
    for i, ch in enumerate(compact):
        if ch in CLAUSE_BREAKS:
            if i + 1 > start:
                out.append((start, i + 1))
            start = i + 1
    if start < len(compact):
        out.append((start, len(compact)))
    return out


def _states_answer(clause: str, cues: Sequence[str]) -> bool:
    """`clause` states a value of a question type and asks nothing: a cue, a link and a value (``电话是010-…``,
    ``门票为20元``), or an answer verb and its object (``位于朝阳区``); the turn's own statement, read by the
    same pattern as a rewrite's invented answer (:func:`_answer`)."""
    if any(m in clause for m in QUESTION_MARKERS) or _x_not_x(clause):
        return False
    links = "|".join(re.escape(x) for x in ANSWER_LINKS)
    verbs = "|".join(re.escape(x) for x in ANSWER_VERBS)
    heads = "|".join(re.escape(x) for x in sorted(set(cues), key=len, reverse=True))
    stated_cue = bool(heads) and re.search(rf"(?:{heads})(?:的)?(?:{links})[^{re.escape(CLAUSE_BREAKS)}]+", clause)
    return bool(stated_cue) or re.search(rf"(?:{verbs})[^{re.escape(CLAUSE_BREAKS)}]+", clause) is not None


def without_told_clauses(text: str) -> str:
    """`text` without its clauses that tell a value beside a clause that asks (:func:`_states_answer`; the
    module doc), in its own characters; `text` itself when it has no such clause or nothing else asks."""
    pieces = [p for p in re.split(rf"(?<=[{re.escape(CLAUSE_BREAKS)}])", text) if p.strip()]
    told, asks = [], []
    for piece in pieces:
        compact = normalise(piece).replace(" ", "")
        cues = [cue for _, _, cue in _cue_spans(compact)]
        told.append(_states_answer(compact, cues))
        asks.append(_is_question(compact, bool(cues)) and not told[-1])
    if not any(told) or not any(asks):
        return text
    return "".join(p for p, t in zip(pieces, told, strict=True) if not t).strip()


def _is_question(clause: str, has_cue: bool) -> bool:
    return has_cue or any(m in clause for m in QUESTION_MARKERS) or _x_not_x(clause)


def _x_not_x(clause: str) -> bool:
    """A "卖不卖" / "好不好" question."""
    return re.search(r"(.)不\1", clause) is not None


def _tokens(compact: str) -> list[tuple[str, int, int]]:
    """jieba's precise-mode tokens of `compact` (no HMM: depends on the text and the dictionary only), with
    runs of single unknown characters joined (朗 月 -> 朗月: a name jieba does not know)."""
    out: list[tuple[str, int, int]] = []
    run: list[tuple[str, int, int]] = []

    def flush() -> None:
        if len(run) >= 2:
            out.append(("".join(t for t, _, _ in run), run[0][1], run[-1][2]))
        elif run:
            out.append(run[0])
        run.clear()

    for token, start, end in jieba.tokenize(compact, HMM=False):
        if len(token) == 1 and _CJK.match(token) and token not in STOP_CHARS:
            run.append((token, start, end))
            continue
        flush()
        out.append((token, start, end))
    flush()
    return out


@functools.lru_cache(maxsize=4096)
def read_text(text: str) -> Reading:
    """The :class:`Reading` of `text` (cached, so shared and not to be changed: the history of a prompt is
    read once for all its rewrites)."""
    spaced = normalise(text)
    compact = spaced.replace(" ", "")
    reading = Reading(compact)
    spans = _cue_spans(compact)
    reading.slots = [QUESTION_CUES[cue] for _, _, cue in spans]
    reading.cues = [cue for _, _, cue in spans]
    reading.numbers = set(_DIGITS.findall(spaced))  # "max8 200": 8 and 200, not 8200
    for token in jieba.lcut(spaced, HMM=False):  # names from the spaced text: "max8 pro" is two names
        if _LATIN.search(token) and token not in STOPWORDS and token not in reading.names:
            reading.names.append(token)
    covered = [False] * len(compact)
    for start, end, _ in spans:
        covered[start:end] = [True] * (end - start)
    clauses = _clauses(compact)
    questions = [(s, e) for s, e in clauses if _is_question(compact[s:e], any(covered[s:e]))]
    stated = [(s, e) for s, e in questions if _states_answer(compact[s:e], [c for a, _, c in spans if s <= a < e])]
    if stated and len(stated) < len(questions):  # "电话是010-…，开放时间呢？": the first clause tells, the second asks
        questions = [q for q in questions if q not in stated]
        reading.slots = [QUESTION_CUES[c] for a, _, c in spans if not any(s <= a < e for s, e in stated)]
    reading.asks = bool(questions)
    chosen = questions or clauses  # a turn without a question word ("发我看看"): every clause counts
    hinted: set[str] = set()
    for token, start, end in _tokens(compact):
        if not any(covered[start:end]) and (len(token) == 1 or token not in jieba.dt.FREQ):
            hinted.update(*(_CHAR_TYPES.get(ch, ()) for ch in token))
        if token in CATEGORY_WORDS:
            reading.categories.add(token)
        in_question = any(s <= start and end <= e for s, e in chosen)
        skip = (
            len(token) < 2
            or not _CJK.search(token)
            or token in STOPWORDS
            or token in _CHITCHAT
            or token in GENERIC_WORDS
            or token in CATEGORY_WORDS
            or _QUANTITY.match(token) is not None
            or any(covered[start:end])
        )
        if questions and not in_question and not skip and token not in reading.aside:
            reading.aside.append(token)
        if in_question and not skip and token not in reading.words:
            reading.words.append(token)
    reading.hinted = frozenset(hinted)
    return reading


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
        if sum(a != b for a, b in zip(piece, word, strict=True)) == 1 and all(_CJK.match(c) for c in piece):
            return True
    return False


def _kept_name(name: str, rewrite: Reading) -> bool:
    return name in rewrite.names or _bounded(name, rewrite.compact)


def _answer(rewrite: Reading, last: Reading) -> str | None:
    """The answer `rewrite` states (a cue, a link and a value that asks nothing), unless the turn says it."""
    text = rewrite.compact
    links = "|".join(re.escape(x) for x in ANSWER_LINKS)
    heads = "|".join(re.escape(x) for x in sorted({*rewrite.cues, *ANSWER_VERBS}, key=len, reverse=True))
    if not heads:
        return None
    breaks = re.escape(CLAUSE_BREAKS)
    for match in re.finditer(rf"(?:{heads})(?:的)?(?:{links})?([^{breaks}]+)", text):
        head_only = match.group(0)[: len(match.group(0)) - len(match.group(1))]
        verb = any(head_only.startswith(v) for v in ANSWER_VERBS)
        if not verb and not re.search(rf"(?:{links})$", head_only):
            continue  # a cue with no 是/为/： after it: part of a query ("价格 max8"), not a statement
        value = match.group(1)
        if any(m in value for m in QUESTION_MARKERS) or _x_not_x(value) or match.group(0) in last.compact:
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
    names = [n for n in rewrite.names if _DIGITS.search(n) and not _kept_name(n, conversation)]
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
