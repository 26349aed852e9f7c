"""Entity-swapped copies of prepared KdConv rows (SFT or warm-up rows in verl's layout).

:func:`~.kdconv_prep.augment_dialogues` swaps entities in raw KdConv dialogues before the rows are built;
:func:`swap_rows` does the same to rows already built (the warm-up data ``queryrl warmup`` writes), so that a
warm-up can show its targets with other names without building its data again. In each copy every
knowledge-base entity the row names (in the prompt, the history, the target and the gold labels) is replaced,
consistently, by another entity of the knowledge base that has the gold attributes
(:func:`~.kdconv_prep.swap_mapping`); the facts the history tells (an address, a price) stay the original
entity's. The model then cannot learn which place a turn is about from the place's name and must copy the name
the conversation uses, as the tiny-model KdConv bench's ``--augment`` teaches it (its idea: counterfactual entity
substitution, as in data augmentation for dialogue state tracking, e.g. CoCo, Li et al. 2021).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from queryrl.apps.query_rewrite.data.kdconv_prep import entity_pattern, swap_mapping

__all__ = ["row_entities", "swap_rows"]


def _map(value: Any, sub: Callable[[str], str]) -> Any:
    """A copy of `value` with `sub` applied to every string inside it (arrays become lists)."""
    if isinstance(value, str):
        return sub(value)
    if isinstance(value, Mapping):
        return {k: _map(v, sub) for k, v in value.items()}
    if isinstance(value, list | tuple) or (hasattr(value, "tolist") and not isinstance(value, int | float | bool)):
        items = value.tolist() if hasattr(value, "tolist") else list(value)
        return [_map(v, sub) for v in items] if isinstance(items, list) else items
    return value


def _texts(value: Any) -> list[str]:
    """Every string inside a row's nested dicts, lists and arrays, in order (the strings :func:`_map` visits)."""
    found: list[str] = []

    def keep(text: str) -> str:
        found.append(text)
        return text

    _map(value, keep)
    return found


def row_entities(row: Mapping[str, Any], pattern: re.Pattern[str]) -> dict[str, set[str]]:
    """The knowledge-base entities a row names -> the attributes its gold labels use of each, in order of
    first mention (the prompt first, then the rest of the row); the gold documents' entities always, with their
    attributes."""
    found: dict[str, set[str]] = {}
    for text in _texts(row.get("prompt")) + _texts({k: v for k, v in row.items() if k != "prompt"}):
        for match in pattern.finditer(text):
            found.setdefault(match.group(), set())
    truth = (row.get("reward_model") or {}).get("ground_truth") or {}
    for doc in _texts(truth.get("gold_doc_ids")):
        name, _, attribute = doc.partition("::")
        if name:
            found.setdefault(name, set()).add(attribute)
    return found


def _renamer(pattern: re.Pattern[str], mapping: Mapping[str, str]) -> Callable[[str], str]:
    """A function that replaces each entity of `mapping` that `pattern` finds in a text."""

    def rename(text: str) -> str:
        return pattern.sub(lambda match: mapping.get(match.group(), match.group()), text)

    return rename


def swap_rows(
    rows: Sequence[Mapping[str, Any]], kb: Mapping[str, frozenset[str]], copies: int, seed: int
) -> list[dict[str, Any]]:
    """`copies` entity-swapped copies of each of `rows` (not the rows themselves), each row's copies in a row.

    `kb`: entity -> its attributes (:func:`~.kdconv_prep.kb_attributes`). A copy's conversation id gets
    ``-swapK``. Each row draws from its own ``random.Random`` seeded with `seed`, its conversation id and turn,
    so its copies do not depend on the other rows. A row that names no entity has no copy.
    """
    if copies < 0:
        raise ValueError(f"copies must be >= 0, got {copies}")
    pattern = entity_pattern(name for name in kb if len(name) >= 2)
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        info = row.get("extra_info") or {}
        key = f"{info.get('conversation_id', index)}/{info.get('turn', index)}"
        rng = random.Random(f"kdconv-swap-rows/{seed}/{key}")
        entities = {name: used for name, used in row_entities(row, pattern).items() if name in kb}
        for k in range(copies if entities else 0):
            copy = _map(row, _renamer(pattern, swap_mapping(entities, kb, rng)))
            if isinstance(copy.get("extra_info"), dict):
                copy["extra_info"]["conversation_id"] = f"{info.get('conversation_id', index)}-swap{k}"
            out.append(copy)
    return out
