"""The query-rewrite prompt (Chinese by default, English) and a tolerant parser of the reply.

The policy sees one system message (the task, the domain line and the JSON it must answer with) and
one user message (the user profile and history summary when present, the history, the current user
turn last). By default it answers only ``{"rewritten_query": ...}``; ``answer_fields`` can also ask
for ``user_profile`` and ``history_summary`` (the users' structured output, sent on to
``/rag/chat_8b``; without them the caller sends the row's own profile and summary).

Made for real instruct models as well as the tiny one:

- no placeholder to copy: the schema is one sentence, and the only JSON in the prompt is a worked
  example from an unrelated topic (cooking), labelled 示例 / Example (a template such as
  ``{"rewritten_query": "改写后的查询"}`` was copied verbatim by a 0.5B instruct model);
- a domain line (``domain``: from the data or the config; default neutral, :data:`DEFAULT_DOMAINS`),
  not "sales" everywhere;
- an empty ``rewritten_query`` means "no retrieval needed" (small talk, thanks, goodbyes);
- ``rewritten_query`` comes first, so an answer cut at the token budget still carries a complete query:
  :func:`parse_rewrite` accepts it and marks it ``truncated``.

Two answer formats (``answer_format``, chosen when the data is prepared and carried in each row's
``extra_info.answer_format``, so the reward and eval always parse what the prompt asked for):

- ``json`` (default): ``{"rewritten_query": ...}`` as above;
- ``text``: the query itself on one line, :data:`NO_QUERY` (``无需检索`` / ``no search``) for a turn that
  needs no retrieval, and the user message ends with a cue (``改写后的查询：``) that a base model without a
  chat template continues. A small model that cannot write JSON yet usually can write this
  (:func:`parse_text_answer`); the answer is its first line, and text after it is a format fault
  (``ParsedRewrite.trailing``), not a parse failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from queryrl.rewards.json_extract import json_objects

MAX_QUERY_CHARS = 256  # a longer "query" is an essay, not a search query: a format failure
MAX_FIELD_CHARS = 2000  # cap on user_profile / history_summary
QUERY_FIELD = "rewritten_query"
ANSWER_FIELDS = (QUERY_FIELD, "user_profile", "history_summary")  # every field, in answer order
DEFAULT_ANSWER_FIELDS = (QUERY_FIELD,)
DEFAULT_DOMAINS = {"zh": "客服对话", "en": "customer conversations"}
ANSWER_FORMATS = ("json", "text")
NO_QUERY = {"zh": "无需检索", "en": "no search"}  # the text format's "no retrieval needed"
_CUE = {"zh": "改写后的查询：", "en": "Rewritten query:"}  # the text format's last prompt line

_TASK = {
    "zh": (
        "你是查询改写助手。场景：{domain}。\n"
        "根据对话历史{inputs}，把用户当前的问题改写成一个独立、完整、可直接用于知识库检索的查询："
        "补全代词和省略的名称与属性，保留原意，不编造对话中没有的信息。"
        "{empty_rule}\n"
        "只输出 JSON：{fields}\n"
        "示例（烹饪话题，只示意格式）：历史“红烧肉怎么做？”，当前问题“要炖多久？”→{example}；"
        "当前问题“谢谢”→{empty}。"
    ),
    "en": (
        "You rewrite search queries. Domain: {domain}.\n"
        "Given the conversation history{inputs}, rewrite the user's current turn as one standalone "
        "search query for the knowledge base: resolve pronouns and ellipsis (name the item and the "
        "attribute), keep the user's intent, add nothing the conversation does not say.{empty_rule}\n"
        "Answer with JSON only: {fields}\n"
        'Example (cooking, format only): history "How do I make braised pork?", current turn "How long '
        'does it stew?" -> {example}; current turn "thanks" -> {empty}.'
    ),
}
_EMPTY_RULE = {  # where the JSON prompt says what an empty query means
    "zh": "不需要检索的问题（寒暄、致谢、告别）查询为空字符串。",
    "en": " A turn that needs no retrieval (small talk, thanks, goodbye) gets an empty query.",
}
_INPUTS = {"zh": "（以及用户画像、历史摘要，如有）", "en": " (and the user profile and history summary, if any)"}
_FIELDS = {
    "zh": {
        QUERY_FIELD: "rewritten_query，值为改写后的查询",
        "user_profile": "user_profile，值为更新后的用户画像（身份、偏好、关注点）",
        "history_summary": "history_summary，值为到目前为止对话的要点",
    },
    "en": {
        QUERY_FIELD: "rewritten_query, the rewritten query",
        "user_profile": "user_profile, the updated user profile (who they are, preferences, concerns)",
        "history_summary": "history_summary, the main points of the conversation so far",
    },
}
_TEXT_ANSWER = {
    "zh": (
        "只输出改写后的查询，一行，不加解释；不需要检索时输出“{none}”。\n"
        "示例（烹饪话题，只示意格式）：历史“红烧肉怎么做？”，当前问题“要炖多久？”→{example}；"
        "当前问题“谢谢”→{none}。"
    ),
    "en": (
        'Answer with the query only, one line, no explanation; "{none}" when no retrieval is needed.\n'
        'Example (cooking, format only): history "How do I make braised pork?", current turn "How long '
        'does it stew?" -> {example}; current turn "thanks" -> {none}.'
    ),
}
_ONE_KEY = {"zh": "一个键 {0}。", "en": "one key, {0}."}
_KEYS = {"zh": "键依次为 {0}。", "en": "the keys, in this order: {0}."}
_KEY_SEP = {"zh": "；", "en": "; "}
_EXAMPLE = {
    "zh": {QUERY_FIELD: "红烧肉要炖多久", "user_profile": "在家做饭的新手", "history_summary": "问过红烧肉的做法"},
    "en": {
        QUERY_FIELD: "braised pork stewing time",
        "user_profile": "a beginner home cook",
        "history_summary": "asked how to make braised pork",
    },
}

_LABELS = {
    "zh": {
        "history": "对话历史：",
        "none": "（无）",
        "current": "当前问题：",
        "profile": "用户画像：",
        "summary": "历史摘要：",
        "user": "用户",
        "assistant": "客服",
        "sep": "：",
    },
    "en": {
        "history": "Conversation history:",
        "none": "(none)",
        "current": "Current user turn:",
        "profile": "User profile:",
        "summary": "History summary:",
        "user": "User",
        "assistant": "Assistant",
        "sep": ": ",
    },
}


def check_answer_fields(fields: str | Sequence[str] | None, where: str = "answer fields") -> tuple[str, ...]:
    """The answer fields asked for, in answer order (:data:`ANSWER_FIELDS`); None gives the default.

    Args:
        fields: a sequence of names or a comma-separated string (``"rewritten_query,user_profile"``).
        where: what the error messages name (``"--answer-fields"`` on the command line).

    Raises:
        ValueError: an unknown or repeated field, or no ``rewritten_query``, naming it and the choices.
    """
    if fields is None:
        return DEFAULT_ANSWER_FIELDS
    names = [f.strip() for f in fields.split(",")] if isinstance(fields, str) else [str(f).strip() for f in fields]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in ANSWER_FIELDS]
    if unknown:
        raise ValueError(f"{where}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(ANSWER_FIELDS)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{where}: {', '.join(map(repr, repeated))} given twice")
    if QUERY_FIELD not in names:
        raise ValueError(f"{where}: must include {QUERY_FIELD!r} (got {', '.join(names) or 'none'})")
    return tuple(f for f in ANSWER_FIELDS if f in names)


def check_answer_format(
    answer_format: str | None, answer_fields: Sequence[str] | None = None, where: str = "answer format"
) -> str:
    """`answer_format` checked (None gives ``json``): one of :data:`ANSWER_FORMATS`; ``text`` carries only
    the query, so it refuses other `answer_fields`.

    Raises:
        ValueError: naming `where`, the value and the choices.
    """
    fmt = "json" if answer_format is None else str(answer_format).strip()
    if fmt not in ANSWER_FORMATS:
        raise ValueError(f"{where}: unknown {answer_format!r}; choose from {', '.join(ANSWER_FORMATS)}")
    if fmt == "text" and check_answer_fields(answer_fields) != DEFAULT_ANSWER_FIELDS:
        raise ValueError(f"{where}: 'text' answers the query only; it cannot carry {', '.join(answer_fields or ())}")
    return fmt


def system_prompt(
    lang: str = "zh",
    domain: str | None = None,
    answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS,
    answer_format: str = "json",
) -> str:
    """The system message: the task, ``场景：<domain>`` / ``Domain: <domain>``, the answer's keys in words
    (or, for the ``text`` format, the one-line answer), and a worked example from an unrelated topic (the
    keys of `answer_fields`, in answer order).

    Raises:
        ValueError: unknown `lang`, bad `answer_fields` (:func:`check_answer_fields`) or `answer_format`.
    """
    if lang not in _TASK:
        raise ValueError(f"unknown prompt language {lang!r}; use one of {sorted(_TASK)}")
    fields = check_answer_fields(answer_fields)
    if check_answer_format(answer_format, fields) == "text":
        head = "\n".join(_TASK[lang].split("\n")[:2])  # the task, without the JSON answer and example
        head = head.format(domain=(domain or "").strip() or DEFAULT_DOMAINS[lang], inputs=_INPUTS[lang], empty_rule="")
        return head + "\n" + _TEXT_ANSWER[lang].format(none=NO_QUERY[lang], example=_EXAMPLE[lang][QUERY_FIELD])
    described = [_FIELDS[lang][f] for f in fields]
    keys = (_ONE_KEY if len(fields) == 1 else _KEYS)[lang].format(_KEY_SEP[lang].join(described))
    example = {f: _EXAMPLE[lang][f] for f in fields}
    empty = {f: "" if f == QUERY_FIELD else _EXAMPLE[lang][f] for f in fields}
    return _TASK[lang].format(
        domain=(domain or "").strip() or DEFAULT_DOMAINS[lang],
        inputs=_INPUTS[lang],
        empty_rule=_EMPTY_RULE[lang],
        fields=keys,
        example=json.dumps(example, ensure_ascii=False),
        empty=json.dumps(empty, ensure_ascii=False),
    )


SYSTEM_PROMPTS = {lang: system_prompt(lang) for lang in _TASK}  # the defaults: neutral domain, query only


@dataclass(frozen=True)
class ParsedRewrite:
    """The policy's structured answer; ``truncated``: the reply was cut off after a complete query (a field
    cut off, or never reached, is empty: see :func:`parse_rewrite`); ``trailing``: a text-format reply
    wrote more after its one-line answer (:func:`parse_text_answer`)."""

    rewritten_query: str
    user_profile: str = ""
    history_summary: str = ""
    truncated: bool = False
    trailing: bool = False  # text format: the reply went on after its first line (a format fault)


# a label a model may put before its query ("查询：...", "Rewritten query: ..."), and quotes around it
_LABELS_SEEN = "改写后的查询|改写查询|独立查询|检索查询|查询|rewritten[ _]query|search query|query"
_LABEL = re.compile(rf"^\s*(?:\*\*)?(?:{_LABELS_SEEN})(?:\*\*)?\s*[:：]\s*", re.IGNORECASE)
_QUOTES = "\"'“”‘’「」『』`"


def _first_query_line(text: str) -> tuple[str, int] | None:
    """The first non-empty line of `text` outside code fences, without a leading label or surrounding
    quotes, whitespace-normalised, and the index (in ``text.splitlines()``) of the line it came from."""
    for index, line in enumerate(text.splitlines()):
        line = line.strip()
        if not line or line.startswith("```"):
            continue
        line = _LABEL.sub("", line).strip().strip(_QUOTES).strip()
        if line:
            return " ".join(line.split()), index
    return None


def plain_text_query(text: Any, max_query_chars: int = MAX_QUERY_CHARS) -> str | None:
    """The query in a reply that is not the JSON answer, read as plain text: its first non-empty line
    (outside code fences), without a leading label (``查询：``, ``Query:``) or surrounding quotes,
    whitespace-normalised; None when there is no such line or it is longer than `max_query_chars`
    (an essay is not a query). Never raises.

    What a small model that does not follow the answer format yet writes is often still a query (or
    the current turn copied): read this way it can be retrieved with, so its reward differs from a
    neighbour's and GRPO has something to learn from (``app.query_rewrite.unparsed=retrieve``).
    """
    found = _first_query_line(text) if isinstance(text, str) else None
    if found is None or len(found[0]) > max_query_chars:
        return None
    return found[0]


def parse_text_answer(text: Any, max_query_chars: int = MAX_QUERY_CHARS) -> ParsedRewrite | None:
    """A ``text``-format reply: its first non-empty line is the query (:func:`plain_text_query`: a label or
    quotes around it are dropped); :data:`NO_QUERY` in either language (alone on the line) is the empty
    query, "no retrieval needed". ``trailing`` is set when anything but whitespace follows that line.
    None when there is no such line or it is longer than `max_query_chars`. Never raises.
    """
    found = _first_query_line(text) if isinstance(text, str) else None
    if found is None or len(found[0]) > max_query_chars:
        return None
    assert isinstance(text, str)
    query, index = found
    trailing = any(line.strip() for line in text.splitlines()[index + 1 :])
    if query.strip(" 。.!！").lower() in {v.lower() for v in NO_QUERY.values()}:
        query = ""
    return ParsedRewrite(query, trailing=trailing)


def build_messages(
    history: Sequence[dict[str, Any]],
    user_profile: str = "",
    history_summary: str = "",
    lang: str = "zh",
    *,
    domain: str | None = None,
    answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS,
    answer_format: str = "json",
) -> list[dict[str, str]]:
    """Chat messages asking the policy to rewrite the last user turn of `history`.

    The user message holds, in this order: the user profile and the history summary (when
    non-empty), the earlier turns, and the current turn, last.

    Args:
        history: the conversation so far as ``{"role": "user"|"assistant", "content": str}``
            messages, ending with the current user turn.
        user_profile: shown when non-empty.
        history_summary: shown when non-empty.
        lang: ``"zh"`` (default) or ``"en"``.
        domain: the domain line (e.g. ``"电子产品销售客服"``); default :data:`DEFAULT_DOMAINS`.
        answer_fields: the keys the answer must have (:func:`check_answer_fields`); default
            ``("rewritten_query",)``.
        answer_format: ``json`` (default) or ``text`` (the user message then ends with the cue
            ``改写后的查询：`` / ``Rewritten query:``).

    Raises:
        ValueError: unknown `lang`, bad `answer_fields` or `answer_format`, empty `history`, or a last
            message that is not the user's.
    """
    system = system_prompt(lang, domain, answer_fields, answer_format)
    if not history or history[-1].get("role") != "user":
        raise ValueError("history must end with the current user turn (role 'user')")
    labels = _LABELS[lang]
    earlier = [f"{labels.get(str(m['role']), str(m['role']))}{labels['sep']}{m['content']}" for m in history[:-1]]
    parts: list[str] = []
    if user_profile and user_profile.strip():
        parts += [labels["profile"], user_profile.strip(), ""]
    if history_summary and history_summary.strip():
        parts += [labels["summary"], history_summary.strip(), ""]
    parts += [labels["history"], "\n".join(earlier) if earlier else labels["none"], ""]
    # the current turn last, right before the answer: at a fixed distance from where the model writes
    parts += [labels["current"], str(history[-1]["content"])]
    if answer_format == "text":
        parts += ["", _CUE[lang]]
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(parts)}]


def _checked(
    obj: dict[str, Any], max_query_chars: int, max_field_chars: int, allow_empty: bool, truncated: bool
) -> ParsedRewrite | None:
    """`obj`'s fields as a :class:`ParsedRewrite`, or None when one breaks the rules of :func:`parse_rewrite`."""
    query = obj[QUERY_FIELD]
    if not isinstance(query, str) or len(query.strip()) > max_query_chars or not (allow_empty or query.strip()):
        return None
    fields: dict[str, str] = {}
    for key in ANSWER_FIELDS[1:]:
        value = obj.get(key)
        if value is None:
            value = ""
        if not isinstance(value, str) or len(value.strip()) > max_field_chars:
            return None
        fields[key] = value.strip()
    return ParsedRewrite(query.strip(), fields["user_profile"], fields["history_summary"], truncated)


_DECODER = json.JSONDecoder(strict=False)  # raw newlines inside strings, as json_objects allows
_OBJECT_START = re.compile(r"\{\s*\"")  # `{` then a quoted key, as json_objects recognises an object
_OPEN_STRING = re.compile(r'"(?:[^"\\]|\\.)*\\?', re.DOTALL)  # a string with no closing quote: to the end
MAX_TRUNCATED_STARTS = 64  # object starts tried for a cut-off answer (bounds the work on garbage)


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _cut_here(text: str, pos: int) -> bool:
    """True when the reply ends at `pos`, or inside a string opened at `pos` (a cut, not a malformed pair)."""
    if pos >= len(text):
        return True
    m = _OPEN_STRING.match(text, pos)
    return m is not None and m.end() == len(text)


def _truncated_object(text: str, start: int) -> dict[str, Any] | None:
    """The complete ``"key": value`` pairs of an object opened at ``text[start]`` and cut before its ``}``;
    None when it closes (a whole object is not truncated) or a pair before the cut is malformed."""
    obj: dict[str, Any] = {}
    pos = start + 1
    while True:
        pos = _skip_ws(text, pos)
        if _cut_here(text, pos):
            return obj  # cut before or inside a key
        key, pos = _DECODER.raw_decode(text, pos)  # a ValueError (malformed) is the caller's None
        pos = _skip_ws(text, pos)
        if pos >= len(text):
            return obj
        if not isinstance(key, str) or text[pos] != ":":
            return None
        pos = _skip_ws(text, pos + 1)
        if _cut_here(text, pos):
            return obj  # cut before or inside this value: the pairs before it are complete
        obj[key], pos = _DECODER.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        if pos >= len(text):
            return obj
        if text[pos] != ",":
            return None  # "}" closes it (then it is not truncated) or garbage follows the value
        pos += 1


def _parse_truncated(text: str, max_query_chars: int, max_field_chars: int, allow_empty: bool) -> ParsedRewrite | None:
    """The first object cut off at the end of `text` whose complete pairs include ``rewritten_query``, checked
    like a whole object (:func:`_checked`) on those pairs: a field cut off is absent (empty)."""
    for n, m in enumerate(_OBJECT_START.finditer(text)):
        if n == MAX_TRUNCATED_STARTS:
            break
        try:
            obj = _truncated_object(text, m.start())
        except ValueError:  # a malformed pair before the cut: not this object
            continue
        if obj is not None and QUERY_FIELD in obj:
            return _checked(obj, max_query_chars, max_field_chars, allow_empty, truncated=True)
    return None


def parse_rewrite(
    text: Any,
    max_query_chars: int = MAX_QUERY_CHARS,
    max_field_chars: int = MAX_FIELD_CHARS,
    *,
    allow_empty: bool = False,
) -> ParsedRewrite | None:
    """The first JSON object in `text` with a ``rewritten_query`` key, checked; None otherwise.

    Code fences and prose around the object are tolerated. Format failures (None): no such
    object; ``rewritten_query`` not a string, blank (unless `allow_empty`: the reward and eval read an
    empty query as "no retrieval needed"), or longer than `max_query_chars` after stripping;
    ``user_profile`` / ``history_summary`` present but not a string (null counts as absent) or longer
    than `max_field_chars`.

    A reply cut off at the end (the token budget) inside the object still parses when the
    ``rewritten_query`` string before the cut is closed and every pair before the cut is well-formed
    (and passes the checks above): ``{"rewritten_query": "星辰X3手机续航", "user_profile": "学生, 预算``
    gives ``ParsedRewrite("星辰X3手机续航", truncated=True)``; the field that was cut (and any never
    reached) is empty, so the caller sends the row's own profile / summary. A cut inside the query
    string (``{"rewritten_query": "星辰X3``) is a failure. Never raises.
    """
    try:
        obj = next((o for o in json_objects(text) if QUERY_FIELD in o), None)
        if obj is not None:
            return _checked(obj, max_query_chars, max_field_chars, allow_empty, False)
        if not isinstance(text, str):
            return None
        return _parse_truncated(text, max_query_chars, max_field_chars, allow_empty)
    except Exception:  # a parser of model output must never take the reward loop down
        return None
