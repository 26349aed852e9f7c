"""How the offline intent check reads one text (:mod:`.check`): normalised, cut into clauses, its question
types, names, numbers and content words (:func:`read_text`), and which of its clauses only tell a value
(:func:`without_told_clauses`).

A clause asks when it has a question cue (:data:`~.intent.words.QUESTION_CUES`), a question word
(:data:`~.intent.words.QUESTION_MARKERS`) or an "X不X"; a clause that tells a value (a cue, 是/为/： and a
value that asks nothing, or 位于 and a place) beside a clause that asks is not asked: KdConv's speakers
answer the last question and ask the next in one turn ("电话是010-…，你知道这里的开放时间吗？").
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import jieba

from queryrl.apps.query_rewrite.intent.slips import BRAND_HOMOPHONES, HOMOPHONES
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
from queryrl.rag.rewriters import CHITCHAT_WORDS

CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[a-z]")
DIGITS = re.compile(r"[0-9]+")
_SPACE = re.compile(r"\s+")
BREAKS = re.escape(CLAUSE_BREAKS)  # inside a character class: what ends a clause
LINKS = "|".join(re.escape(x) for x in ANSWER_LINKS)  # 是/为/： between a cue and the value it states
_TOLD_BY_VERB = re.compile(rf"(?:{'|'.join(re.escape(x) for x in ANSWER_VERBS)})[^{BREAKS}]+")  # 位于朝阳区
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
# the known slips (typo -> the word meant, :mod:`.slips`), longest first
_SLIPS = sorted(
    [(typo, word) for word, typos in HOMOPHONES.items() for typo in typos]
    + [(typo, word) for word, typo in BRAND_HOMOPHONES.items()],
    key=lambda p: -len(p[0]),
)


def normalise(text: str) -> str:
    """NFKC (full-width letters and digits become ASCII), lowercase, whitespace runs as one space, and the
    known slips (:data:`~.intent.slips.HOMOPHONES`) replaced by the word they stand for."""
    out = _SPACE.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()
    for typo, word in _SLIPS:
        out = out.replace(typo, word)
    return out


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


def bounded(pattern: str, text: str) -> bool:
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
            latin_ok = not _LATIN.search(cue) or bounded(cue, compact[max(0, start - 1) : end + 1])
            if latin_ok and not any(taken[start:end]):
                taken[start:end] = [True] * len(cue)
                spans.append((start, end, cue))
            start = compact.find(cue, start + 1)
    return sorted(spans)


def _clauses(compact: str) -> list[tuple[int, int]]:
    """(start, end) of the clauses of `compact`, cut at :data:`~.intent.words.CLAUSE_BREAKS` (kept in the
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
    same pattern as a rewrite's invented answer (:func:`~.intent.check._answer`)."""
    if any(m in clause for m in QUESTION_MARKERS) or x_not_x(clause):
        return False
    heads = alternation(cues)
    stated_cue = bool(heads) and re.search(rf"(?:{heads})(?:的)?(?:{LINKS})[^{BREAKS}]+", clause)
    return bool(stated_cue) or _TOLD_BY_VERB.search(clause) is not None


def alternation(words: Iterable[str]) -> str:
    """A regex alternation of `words`, longest first (a longer word wins where a shorter one is its start)."""
    return "|".join(re.escape(x) for x in sorted(set(words), key=len, reverse=True))


def without_told_clauses(text: str) -> str:
    """`text` without its clauses that tell a value beside a clause that asks (:func:`_states_answer`; the
    module doc), in its own characters; `text` itself when it has no such clause or nothing else asks."""
    pieces = [p for p in re.split(rf"(?<=[{BREAKS}])", text) if p.strip()]
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
    return has_cue or any(m in clause for m in QUESTION_MARKERS) or x_not_x(clause)


def x_not_x(clause: str) -> bool:
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
        if len(token) == 1 and CJK.match(token) and token not in STOP_CHARS:
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
    reading.numbers = set(DIGITS.findall(spaced))  # "max8 200": 8 and 200, not 8200
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
            or not CJK.search(token)
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
