"""Format rewards: does the response have the right shape? 1.0 or 0.0 (JSON: partial credit optional).

- :func:`regex_format_score`: the response matches a regular expression;
- :func:`think_answer_score`: ``<think>...</think><answer>...</answer>``, the format reward of
  DeepSeek-R1 (DeepSeek-AI, "DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via
  Reinforcement Learning", arXiv:2501.12948, section 2.2.2);
- :func:`json_shape_score`: the response holds a JSON object with the required keys (and value
  types). The object is found by :func:`queryrl.rewards.json_extract.extract_json`: the first
  object, those in code fences first, prose around it tolerated, a few repairs (trailing commas,
  single quotes).

None of them raises on any response. Each has a verl-contract form, :func:`compute_score`,
configured from ``reward.kwargs`` and, per sample, from the same names in ``extra_info``
(the sample's value wins)::

    reward.function.path=queryrl/rewards/scorers/format.py  reward.kwargs.kind=json
    reward.kwargs.required_keys=[query,reason]  reward.kwargs.partial=true

A regular expression from the config runs on every response: keep it free of nested
quantifiers such as ``(a+)+``, which backtrack for exponential time on a near miss.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from queryrl.rewards.json_extract import extract_json, validate

Kind = Literal["regex", "think_answer", "json"]

# JSON Schema type names (what json_extract.validate checks), and Python types spelled as them
_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}
TypeSpec = str | type | Sequence[str | type]


def regex_format_score(
    solution_str: str, pattern: str, flags: int = re.DOTALL, full_match: bool = True, strip: bool = True
) -> float:
    """1.0 if `solution_str` matches `pattern`, else 0.0.

    Args:
        solution_str: the response.
        pattern: a regular expression (a bad one raises ``re.error``: a config bug).
        flags: ``re`` flags; ``re.DOTALL`` lets ``.`` cross lines.
        full_match: the whole response must match (``re.fullmatch``); False: a match anywhere (``re.search``).
        strip: drop whitespace at both ends first (trailing newlines are common after generation).
    """
    text = solution_str.strip() if strip else solution_str
    match = re.fullmatch(pattern, text, flags) if full_match else re.search(pattern, text, flags)
    return 1.0 if match else 0.0


def think_answer_score(
    solution_str: str, think_tag: str = "think", answer_tag: str = "answer", think_prefilled: bool = False
) -> float:
    """1.0 for ``<think>reasoning</think><answer>answer</answer>`` and nothing else, else 0.0.

    Whitespace is allowed around and between the two blocks; both must be non-empty, and each
    tag must appear exactly once (so an ``<answer>`` inside the thinking does not count twice).

    Args:
        solution_str: the response.
        think_tag: the reasoning tag's name.
        answer_tag: the answer tag's name.
        think_prefilled: the prompt already ends with ``<think>`` (e.g. a chat template that opens
            it), so the response starts inside the reasoning and must not open it again.
    """
    t, a = re.escape(think_tag), re.escape(answer_tag)
    opening = "" if think_prefilled else rf"<{t}>"
    pattern = rf"\s*{opening}(?P<think>.*?)</{t}>\s*<{a}>(?P<answer>.*?)</{a}>\s*"
    match = re.fullmatch(pattern, solution_str, re.DOTALL)
    if match is None or not match["think"].strip() or not match["answer"].strip():
        return 0.0
    tags = [f"<{think_tag}>", f"</{think_tag}>", f"<{answer_tag}>", f"</{answer_tag}>"]
    expected = [0 if think_prefilled else 1, 1, 1, 1]
    return 1.0 if [solution_str.count(tag) for tag in tags] == expected else 0.0


def extract_tag(solution_str: str, tag: str = "answer") -> str | None:
    """The stripped content of the last ``<tag>...</tag>`` in `solution_str`, or None."""
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", solution_str, re.DOTALL)
    return found[-1].strip() if found else None


def _schema_types(spec: TypeSpec) -> list[str]:
    """`spec` as JSON Schema type names: ``"string"``, ``str``, or a list of either."""
    specs = [spec] if isinstance(spec, str | type) else list(spec)
    names: list[str] = []
    for s in specs:
        if isinstance(s, type):
            if s not in _TYPE_NAMES and s is not type(None):
                raise ValueError(
                    f"no JSON type for Python type {s.__name__}; use one of {sorted(_TYPE_NAMES.values())}"
                )
            names.append("null" if s is type(None) else _TYPE_NAMES[s])
        else:
            names.append(s)
    return names


def json_shape_score(
    solution_str: str,
    required_keys: Sequence[str],
    types: Mapping[str, TypeSpec] | None = None,
    partial: bool = False,
) -> float:
    """Whether the response's JSON object has every required key, with the right value types.

    Args:
        solution_str: the response; the object is found by ``extract_json`` (module docstring).
        required_keys: keys that must be present.
        types: the type of some keys' values: a JSON Schema name (``"string"``, ``"integer"``,
            ``"number"``, ``"boolean"``, ``"array"``, ``"object"``, ``"null"``), a Python type
            (``str``, ``int``, ...), or a list of either; ``true`` is not a number. A key in
            `types` but not in `required_keys` is checked only when present.
        partial: the fraction of required keys present with the right type, instead of 1/0.

    Returns:
        1.0 when all is well (or the fraction with `partial`); 0.0 without an object. With no
        required keys, 1.0 for any object.

    Raises:
        ValueError: an unknown type name (a config bug, not the response's fault).
    """
    schemas = {key: {"type": _schema_types(spec)} for key, spec in (types or {}).items()}
    for schema in schemas.values():
        validate(None, schema)  # raises on an unknown type name, response or not
    obj = extract_json(solution_str)
    if obj is None:
        return 0.0
    optional_ok = all(not validate(obj[k], s) for k, s in schemas.items() if k not in required_keys and k in obj)
    good = [key in obj and (key not in schemas or not validate(obj[key], schemas[key])) for key in required_keys]
    if partial:
        return sum(good) / len(good) if good else float(optional_ok)
    return 1.0 if all(good) and optional_ok else 0.0


_OPTIONS: dict[Kind, tuple[str, ...]] = {
    "regex": ("pattern", "flags", "full_match", "strip"),
    "think_answer": ("think_tag", "answer_tag", "think_prefilled"),
    "json": ("required_keys", "types", "partial"),
}


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    kind: Kind = "think_answer",
    **options: Any,
) -> float:
    """A format reward in verl's contract; `ground_truth` and `data_source` are not used.

    Args:
        kind: ``"regex"`` (:func:`regex_format_score`), ``"think_answer"``
            (:func:`think_answer_score`) or ``"json"`` (:func:`json_shape_score`); may come
            from ``extra_info["kind"]`` too.
        options: that scorer's arguments (``pattern``, ``required_keys``, ...); each may also
            come from `extra_info` under the same name, which wins over the one here.

    Raises:
        TypeError: an option the chosen scorer does not take, or a required one missing.
    """
    info = dict(extra_info or {})
    kind = info.get("kind", kind)
    if kind not in _OPTIONS:
        raise ValueError(f"unknown format reward kind {kind!r}; known: {', '.join(_OPTIONS)}")
    unknown = set(options) - set(_OPTIONS[kind])
    if unknown:
        raise TypeError(f"format reward {kind!r} takes {', '.join(_OPTIONS[kind])}; got {', '.join(sorted(unknown))}")
    options.update({name: info[name] for name in _OPTIONS[kind] if name in info})
    if kind == "regex":
        return regex_format_score(solution_str, **options)
    if kind == "think_answer":
        return think_answer_score(solution_str, **options)
    return json_shape_score(solution_str, **options)
