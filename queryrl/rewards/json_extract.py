"""Pull a JSON object out of a model reply, and check it against a small schema.

:func:`json_objects` / :func:`extract_json` never raise: any input (``None``, bytes, a megabyte of
braces, a reply cut off mid-object) gives a list / ``None``. What they recover:

- an object anywhere in the text, with prose before and after; objects inside Markdown code fences
  (```` ```json ```` or bare ```` ``` ````) come first, then the others in reading order;
- braces and quotes inside strings (the scan knows where strings start and end);
- raw newlines inside strings (``json.loads(strict=False)``);
- three repairs, applied only to a span whose braces balance and only outside strings, so they can
  never change a string's contents: trailing commas before ``}`` / ``]`` are dropped; single-quoted
  strings become double-quoted (``'it\\'s'`` -> ``"it's"``); the bare words ``True`` / ``False`` /
  ``None`` become ``true`` / ``false`` / ``null``. A span that still fails ``json.loads`` is skipped.

What they refuse: a truncated object (``{"better": "8b", "score": {"8b": {"sum": 3`` ...) is not
completed, and the complete objects nested inside it (``{"sum": 3}`` above) are not returned as if
they were the answer -- completing or salvaging would invent a verdict. An object start is
recognised as ``{`` followed by a quote; a ``{`` in prose (``use {name} here``) is skipped.
Top-level arrays are not returned, only objects (an object inside an array is).

Work is bounded: the first ``MAX_CHARS`` characters are scanned, from at most ``MAX_STARTS``
object starts.

A judge's verdict is stricter (:func:`reply_object`, :func:`parse_verdict`): the reply must BE the
object -- the object alone, or one fenced block that is the whole reply apart from whitespace (a leading
``<think>...</think>`` block is dropped first). An object found inside prose is never a verdict.

:func:`validate` checks an object against a subset of JSON Schema (so the same dict can be sent
as an API's ``response_format`` schema):

- ``type``: ``"object" | "array" | "string" | "number" | "integer" | "boolean" | "null"`` or a list
  of them (``true`` is not a number; ``2.0`` is an integer, as in JSON Schema);
- ``enum``, ``const``;
- objects: ``properties`` (a schema per key, checked when the key is present), ``required``,
  ``additionalProperties`` (``false`` or a schema);
- arrays: ``items`` (one schema for every element), ``minItems``, ``maxItems``;
- strings: ``minLength``, ``maxLength``; numbers: ``minimum``, ``maximum``;
- annotations ``title``, ``description``, ``default``, ``examples``, ``$schema``, ``$id`` are ignored.

Any other keyword raises ``ValueError`` (a typo in a schema must not silently accept everything).
Problems read ``"$.score.8b.sum: expected number, got str"``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from queryrl.redaction import redact

MAX_CHARS = 1_000_000
MAX_STARTS = 1_000

_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\r?\n?(.*?)```", re.DOTALL)
_OBJECT_START = re.compile(r"\{\s*[\"']")  # `{` then a quoted key: the start of a JSON object, not prose
_SPAN_TOKEN = re.compile(r"[{}\"'\\]")
_DECODER = json.JSONDecoder(strict=False)
_TRUNCATED = -1


def extract_json(text: Any, schema: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The first JSON object in `text` (fenced objects first), or None; never raises.

    With `schema`, the first object that passes :func:`validate` (None when none does).
    """
    try:
        for obj in json_objects(text):
            if schema is None or not validate(obj, schema):
                return obj
    except ValueError:  # a malformed schema is the caller's bug: it is the one thing that raises
        raise
    except Exception:
        return None
    return None


def json_objects(text: Any) -> list[dict[str, Any]]:
    """Every top-level JSON object in `text`: those inside code fences first, then the rest in order."""
    if not isinstance(text, str):
        return []
    found: list[tuple[int, dict[str, Any]]] = []
    s = text[:MAX_CHARS]
    try:
        fences = [(m.start(1), m.end(1)) for m in _FENCE.finditer(s)]
        _scan(s, found)
    except Exception:  # RecursionError, MemoryError in a pathological reply: keep what was found
        fences = []
    found.sort(key=lambda item: (not any(a <= item[0] < b for a, b in fences), item[0]))
    return [obj for _, obj in found]


def _scan(s: str, found: list[tuple[int, dict[str, Any]]]) -> None:
    i = s.find("{")
    starts = 0
    while i != -1 and starts < MAX_STARTS:
        starts += 1
        obj, end = _parse_at(s, i)
        if obj is not None:
            found.append((i, obj))
        elif end == _TRUNCATED:
            return  # everything after is inside an unfinished object
        i = s.find("{", end)


def _parse_at(s: str, i: int) -> tuple[dict[str, Any] | None, int]:
    """(the object starting at s[i], where to continue), or (None, _TRUNCATED) for an unfinished one."""
    try:
        obj, end = _DECODER.raw_decode(s, i)
        if isinstance(obj, dict):
            return obj, end
    except (ValueError, RecursionError):
        pass
    if not _OBJECT_START.match(s, i):
        return None, i + 1  # a brace in prose
    close = _match_brace(s, i)
    if close is None:
        return None, _TRUNCATED
    end = close
    repaired = _repair(s[i:end])
    try:
        obj = json.loads(repaired, strict=False)
    except (ValueError, RecursionError):
        return None, end  # a broken object: its nested pieces are not answers either
    return (obj, end) if isinstance(obj, dict) else (None, end)


def _match_brace(s: str, i: int) -> int | None:
    """The index after the `}` closing the `{` at s[i], skipping strings in either quote; None if unclosed."""
    depth, quote, pos = 0, "", i
    while (m := _SPAN_TOKEN.search(s, pos)) is not None:
        c, pos = m.group(), m.end()
        if quote:
            if c == "\\":
                pos += 1  # the escaped character, whatever it is
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return pos
    return None


def _repair(span: str) -> str:
    """Trailing commas, single quotes and Python literals, fixed outside strings only (see module doc)."""
    out: list[str] = []
    i, n = 0, len(span)
    while i < n:
        c = span[i]
        if c == '"':
            j = i + 1
            while j < n and span[j] != '"':
                j += 2 if span[j] == "\\" else 1
            out.append(span[i : j + 1])
            i = j + 1
        elif c == "'":
            i = _single_quoted(span, i + 1, out)
        elif c == ",":
            j = i + 1
            while j < n and span[j].isspace():
                j += 1
            if j >= n or span[j] not in "}]":
                out.append(c)
            i += 1
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (span[j].isalnum() or span[j] == "_"):
                j += 1
            word = span[i:j]
            out.append({"True": "true", "False": "false", "None": "null"}.get(word, word))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _single_quoted(span: str, i: int, out: list[str]) -> int:
    """Append the single-quoted string starting after s[i-1] as a JSON string; return the index after it."""
    out.append('"')
    n = len(span)
    while i < n and span[i] != "'":
        c = span[i]
        if c == "\\" and i + 1 < n:
            nxt = span[i + 1]
            out.append("'" if nxt == "'" else c + nxt)
            i += 2
            continue
        out.append('\\"' if c == '"' else c)
        i += 1
    out.append('"')
    return i + 1


# --- schema -------------------------------------------------------------------------------------

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}
_KEYWORDS = {
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
}
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id"}


def validate(obj: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Problems of `obj` against `schema` (the JSON Schema subset in the module doc); empty when valid.

    Raises:
        ValueError: the schema uses a keyword or type name outside the subset.
    """
    unknown = set(schema) - _KEYWORDS - _ANNOTATIONS
    if unknown:
        raise ValueError(f"schema at {path}: unsupported keyword(s) {sorted(unknown)}; supported: {sorted(_KEYWORDS)}")
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        bad = [t for t in names if t not in _TYPES]
        if bad:
            raise ValueError(f"schema at {path}: unknown type(s) {bad}; known: {sorted(_TYPES)}")
        if not any(_is_type(obj, t) for t in names):
            return [f"{path}: expected {' or '.join(names)}, got {type(obj).__name__}"]
    problems: list[str] = []
    if "enum" in schema and not any(_same(obj, v) for v in schema["enum"]):
        problems.append(f"{path}: {obj!r} is not one of {schema['enum']!r}")
    if "const" in schema and not _same(obj, schema["const"]):
        problems.append(f"{path}: {obj!r} is not {schema['const']!r}")
    if isinstance(obj, dict):
        problems += _validate_object(obj, schema, path)
    elif isinstance(obj, list):
        problems += _validate_array(obj, schema, path)
    elif isinstance(obj, str):
        if len(obj) < schema.get("minLength", 0):
            problems.append(f"{path}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(obj) > schema["maxLength"]:
            problems.append(f"{path}: longer than {schema['maxLength']} characters")
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        if not math.isfinite(obj):  # JSON has no NaN or Infinity (Python's json reads them): NaN passes every bound
            return [f"{path}: {obj!r} is not a finite number"]
        if "minimum" in schema and obj < schema["minimum"]:
            problems.append(f"{path}: {obj!r} < minimum {schema['minimum']!r}")
        if "maximum" in schema and obj > schema["maximum"]:
            problems.append(f"{path}: {obj!r} > maximum {schema['maximum']!r}")
    return problems


def _is_type(obj: Any, name: str) -> bool:
    if isinstance(obj, bool):
        return name == "boolean"
    if name == "integer":
        return isinstance(obj, int) or (isinstance(obj, float) and obj.is_integer())
    return isinstance(obj, _TYPES[name])


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``1 == True`` in Python, not in JSON."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _validate_object(obj: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    problems = [f"{path}: missing required key {key!r}" for key in schema.get("required", []) if key not in obj]
    properties: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, value in obj.items():
        sub = f"{path}.{key}"
        if key in properties:
            problems += validate(value, properties[key], sub)
        elif extra is False:
            problems.append(f"{path}: unexpected key {key!r}")
        elif isinstance(extra, dict):
            problems += validate(value, extra, sub)
    return problems


def _validate_array(obj: list[Any], schema: dict[str, Any], path: str) -> list[str]:
    problems: list[str] = []
    if len(obj) < schema.get("minItems", 0):
        problems.append(f"{path}: fewer than {schema['minItems']} items")
    if "maxItems" in schema and len(obj) > schema["maxItems"]:
        problems.append(f"{path}: more than {schema['maxItems']} items")
    if "items" in schema:
        for k, item in enumerate(obj):
            problems += validate(item, schema["items"], f"{path}[{k}]")
    return problems


# A reply that is a verdict: the JSON object alone, or one fenced block that is the whole reply (see parse_verdict)
_WHOLE_FENCE = re.compile(r"\A```[ \t]*[A-Za-z0-9_+-]*[ \t]*\r?\n?(.*?)```\Z", re.DOTALL)
_THINK = re.compile(r"\A\s*<think>.*?</think>", re.DOTALL)


def reply_object(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object that IS the reply, None) or (None, why it is not one); never raises.

    A reply is an object only when it is one: after a leading ``<think>...</think>`` block (a reasoning
    model served without a reasoning parser) and surrounding whitespace, the text is one JSON object, or one
    fenced block (```` ```json ```` or bare ```` ``` ````) holding one JSON object and nothing else. The
    tolerance of :func:`json_objects` inside that object (trailing commas, single quotes, Python literals,
    raw newlines in strings) still applies. An object inside prose is not the reply: a refusal that shows
    an example ("I cannot evaluate this; a verdict would look like {...}") must never be scored as one.
    """
    if not isinstance(raw, str):
        return None, "unparseable verdict: the reply is not text"
    text = _THINK.sub("", raw[:MAX_CHARS], count=1).strip()
    fence = _WHOLE_FENCE.match(text)
    if fence is not None and "```" not in fence.group(1):
        text = fence.group(1).strip()
    obj, end = (None, 0)
    if text.startswith("{"):
        try:
            obj, end = _parse_at(text, 0)
        except Exception:  # RecursionError, MemoryError in a pathological reply
            obj = None
    if obj is not None and end == len(text):
        return obj, None
    # redacted before the cut: a server echoing the key must not leave its first characters here
    shown = f"({redact(raw)[:120]!r})"
    if json_objects(raw):
        return None, f"unparseable verdict: a JSON object inside other text is not a verdict {shown}"
    return None, f"unparseable verdict: no JSON object in the reply {shown}"


def parse_verdict(
    raw: str, schema: dict[str, Any] | None = None, whole_reply: bool = True
) -> tuple[dict[str, Any] | None, str | None]:
    """(verdict, None) or (None, why): the JSON object that is the whole reply (:func:`reply_object`),
    when it passes `schema`. ``whole_reply=False`` (not for a judge: e.g. a rewriter's answer) takes the
    first object anywhere in the reply that passes `schema`."""
    if not whole_reply:
        return _first_valid(raw, schema)
    obj, error = reply_object(raw)
    if obj is None:
        return None, error
    problems = validate(obj, schema) if schema is not None else []
    if problems:
        return None, "schema-invalid verdict: " + "; ".join(problems[:5])
    return obj, None


def _first_valid(raw: str, schema: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    objects = json_objects(raw)
    if not objects:
        return None, f"unparseable verdict: no JSON object in the reply ({redact(raw)[:120]!r})"
    for obj in objects:
        if schema is None or not validate(obj, schema):
            return obj, None
    return None, "schema-invalid verdict: " + "; ".join(validate(objects[0], schema or {})[:5])
