"""The SFT targets bench-real's warm-up can build from a KdConv training turn's gold documents
(``--sft-target``): training rows only, whose labels the GRPO reward reads anyway; held-out rows never carry
gold-derived text. Each takes the policy's window of the conversation, the gold ``entity::attribute`` ids and the
reference rewriter's query, and returns the target query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from queryrl.apps.query_rewrite.data.kdconv import doc_entity


def gold_query(window: Sequence[dict[str, Any]], gold_doc_ids: Sequence[str], reference: str) -> str:
    """A training row's query built with its gold documents (``entity::attribute`` ids): the entity of
    the first gold document when the window shows it (else `reference`'s query), the current turn,
    then that entity's gold attributes that the query does not contain yet."""
    entity = doc_entity(gold_doc_ids[0])
    current = str(window[-1]["content"]).strip()
    if entity in current:
        query = current
    elif any(entity in str(m["content"]) for m in window):
        query = f"{entity} {current}"
    else:
        query = reference
    for doc in gold_doc_ids:
        name, _, attribute = doc.partition("::")
        if name == entity and attribute and attribute not in query:
            query = f"{query} {attribute}"
    return query


def gold_entity_query(window: Sequence[dict[str, Any]], gold_doc_ids: Sequence[str], reference: str) -> str:
    """A training row's query that names its gold entity the way the reference rewriter names one: the
    current turn, then the entity of the first gold document when the turn leaves it out and the window
    shows it (else `reference`'s query). No attribute words: the intent check refuses words the
    conversation never had, and the policy cannot see which attribute the label holds."""
    entity = doc_entity(gold_doc_ids[0])
    current = str(window[-1]["content"]).strip()
    if entity in current:
        return current
    if any(entity in str(m["content"]) for m in window):
        return f"{current} {entity}"
    return reference


def question_entity_query(window: Sequence[dict[str, Any]], gold_doc_ids: Sequence[str], reference: str) -> str:
    """:func:`gold_entity_query` of the turn without the clauses that tell a value beside the question
    (:func:`~queryrl.apps.query_rewrite.intent.reading.without_told_clauses`: "电话是010-…，开放时间呢？" asks the
    hours, and the told phone number pulls the phone document to the top)."""
    from queryrl.apps.query_rewrite.intent.reading import without_told_clauses

    current = str(window[-1]["content"]).strip()
    asked = [*window[:-1], {**window[-1], "content": without_told_clauses(current)}]
    return gold_entity_query(asked, gold_doc_ids, reference)


def question_attribute_query(window: Sequence[dict[str, Any]], gold_doc_ids: Sequence[str], reference: str) -> str:
    """:func:`question_entity_query` with the knowledge base's names of the gold entity's attributes it lacks
    ("这里能玩多久呀？ 圆明园 建议游玩时间"), for the attributes whose question type the turn itself asks
    (the offline intent check's reading of both), and only where the check keeps the result; else
    :func:`question_entity_query` as it is.

    The customer asks in their own words ("能玩多久"); the documents are filed under the catalogue's field
    names ("建议游玩时间"), which BM25 matches and the turn's words do not. A field the turn does not ask is
    never added: not one its history asked ("周边景点" on a turn that only tells a price), which would teach
    the rewriter to add fields to turns that ask nothing, and not the entity's description (``Information``,
    no question type), which BM25 does not reach with a short query anyway. The check knows KdConv's visiting
    time and nearby sights as question types (:mod:`~queryrl.apps.query_rewrite.intent.words`).
    """
    from queryrl.apps.query_rewrite.intent.check import check_intent
    from queryrl.apps.query_rewrite.intent.reading import read_text

    query = question_entity_query(window, gold_doc_ids, reference)
    entity = doc_entity(gold_doc_ids[0])
    asked = read_text(str(window[-1]["content"])).types
    named = query
    for doc in gold_doc_ids:
        name, _, attribute = doc.partition("::")
        if name == entity and attribute and attribute not in named and read_text(attribute).types & asked:
            named = f"{named} {attribute}"
    if named == query or not check_intent(list(window), named).kept:
        return query
    return named


# sft_target -> the query it builds
GOLD_TARGETS = {
    "gold": gold_query,
    "gold_entity": gold_entity_query,
    "question_entity": question_entity_query,
    "question_attribute": question_attribute_query,
}
