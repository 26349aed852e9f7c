"""Async client of the RAG service (HTTP, or an :class:`~queryrl.rag.service.InProcessRAG` without HTTP).

    client = RAGClient("http://127.0.0.1:8000")             # or RAGClient(InProcessRAG(index))
    client = RAGClient("http://127.0.0.1:8000/{endpoint}")  # a service without the /rag prefix
    cand, ref = await client.both(rewritten_query=q, **prompt_fields)
    if isinstance(cand, RAGFailure) or isinstance(ref, RAGFailure):
        ...  # mark the sample failed; never score it 0

Failure policy. Connection errors, timeouts (``timeout_s`` per attempt) and HTTP 5xx / 429 are retried
``max_retries`` times, the n-th retry after ``uniform(b/2, b)`` with ``b = min(backoff_max_s,
backoff_base_s * 2**(n-1))``; other 4xx are not retried. :meth:`chat_8b` and :meth:`chat` raise
:class:`RAGError` when the call still fails (or answers a status other than ``"success"``); :meth:`both`
never raises: each side is the response dict or a :class:`RAGFailure`.

The response contract (docs/your-data.md), checked on every answer (:func:`contract_problem`): a JSON
object with ``"status": "success"`` whose ``response`` is a list of documents, each an object with
``doc_id`` (a non-empty string), ``title`` and ``content`` (strings) and optionally ``score`` (a number).
An answer that breaks it fails the call with one line naming the field, its value and what was expected
(for a missing document field, also the fields the document has: a service that says
``knowledge_id``/``question``/``answer`` instead): scored on empty or ``null`` documents, a judge would
compare nothing (or the text "None") and the run would train on it silently. Not retried. A service
whose documents use other names maps them with ``document_fields`` (``app.query_rewrite.rag.document_fields``:
ours -> its, e.g. ``{"doc_id": "knowledge_id", "title": "question", "content": "answer"}``,
:func:`map_document_fields`; a mapped integer id becomes a string), applied before the check.

Tokens. With ``token_env`` (``app.query_rewrite.rag.token_env``) every request carries
``Authorization: Bearer <the variable's value>``, as ``serve-rag --token-env`` wants; the value is
registered with :mod:`queryrl.redaction`. An unset variable is an error when the client is made.

Reference cache. The reference pipeline's result depends only on the prompt, so :meth:`chat` results are
cached in memory per (tenant_id, contact_id, account_id, message_id, contexts, context, thought_unit,
score_threshold); concurrent identical calls share one request. Failures are not cached.

Accounting (:meth:`pop_stats`, sums since the last pop): ``rag/calls`` (chat_8b / chat invocations, cache
hits included), ``rag/requests`` (requests sent, retries included), ``rag/retries``, ``rag/failed``
(invocations that ended in an error), ``rag/cache_hits``, ``rag/latency_s`` (mean seconds of an invocation
that was not a cache hit, backoff waits included).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from queryrl.rag.service import InProcessRAG
from queryrl.service_auth import bearer_header

CHAT_FIELDS = (
    "tenant_id",
    "contact_id",
    "account_id",
    "message_id",
    "contexts",
    "context",
    "thought_unit",
    "score_threshold",
)
CHAT_8B_FIELDS = (
    "tenant_id",
    "contact_id",
    "account_id",
    "message_id",
    "contexts",
    "thought_unit",
    "score_threshold",
    "user_profile",
    "history_summary",
    "rewritten_query",
)
_STAT_KEYS = ("rag/calls", "rag/requests", "rag/retries", "rag/failed", "rag/cache_hits")


class RAGError(RuntimeError):
    """A RAG call that failed after its retries."""

    def __init__(self, endpoint: str, error: str) -> None:
        super().__init__(f"{endpoint}: {error}")
        self.endpoint = endpoint
        self.error = error


@dataclass(frozen=True)
class RAGFailure:
    """One side of :meth:`RAGClient.both` that failed: the endpoint (``"chat_8b"`` / ``"chat"``) and why."""

    endpoint: str
    error: str


class _Retryable(Exception):
    """A 5xx / 429 answer, to be retried."""


def _is_retryable(error: BaseException) -> bool:
    return isinstance(error, httpx.TransportError | _Retryable | TimeoutError)


class RAGClient:
    """Calls ``/rag/chat_8b`` and ``/rag/chat`` (see the module doc for retries, caching and stats).

    Args:
        base_url: the service root (``http://host:port``: posts to ``/rag/chat_8b`` and ``/rag/chat``), a
            URL template with ``{endpoint}`` (``http://host:port/api/{endpoint}``: ``{endpoint}`` becomes
            ``chat_8b`` or ``chat``), or an :class:`InProcessRAG` to call directly.
        timeout_s: limit on one attempt.
        max_retries: re-sends after the first attempt.
        backoff_base_s, backoff_max_s: the retry waits.
        cache_reference: cache :meth:`chat` results.
        token_env: an environment variable holding the service's bearer token (None: none sent).
        document_fields: our document field -> the service's name for it (:func:`map_document_fields`).

    Raises:
        TokenError: `token_env` names a variable that is not set or empty.
    """

    def __init__(
        self,
        base_url: str | InProcessRAG,
        timeout_s: float = 10.0,
        max_retries: int = 2,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 2.0,
        cache_reference: bool = True,
        token_env: str | None = None,
        document_fields: dict[str, str] | None = None,
    ) -> None:
        if timeout_s <= 0 or max_retries < 0:
            raise ValueError(f"need timeout_s > 0 and max_retries >= 0, got {timeout_s}, {max_retries}")
        self.target = base_url.rstrip("/") if isinstance(base_url, str) else base_url
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.cache_reference = cache_reference
        self._headers = bearer_header(token_env, "app.query_rewrite.rag.token_env")
        self.document_fields = check_document_fields(document_fields or {})
        self._cache: dict[str, dict[str, Any]] = {}
        self._inflight: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Task[Any]]] = (
            weakref.WeakKeyDictionary()
        )
        self._http: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._stats = dict.fromkeys(_STAT_KEYS, 0.0)
        self._latency_sum = 0.0
        self._latency_n = 0

    # --- public API -----------------------------------------------------------------------------

    async def chat_8b(self, **fields: Any) -> dict[str, Any]:
        """``POST /rag/chat_8b`` with `fields`; raises :class:`RAGError` on failure."""
        self._add("rag/calls", 1)
        return await self._call("chat_8b", fields)

    async def chat(self, **fields: Any) -> dict[str, Any]:
        """``POST /rag/chat`` with `fields` (cached, see the module doc); raises :class:`RAGError`."""
        self._add("rag/calls", 1)
        if not self.cache_reference:
            return await self._call("chat", fields)
        key = reference_key(fields)
        if key in self._cache:
            self._add("rag/cache_hits", 1)
            return self._cache[key]
        inflight = self._inflight.setdefault(asyncio.get_running_loop(), {})
        task = inflight.get(key)
        if task is None:
            task = inflight[key] = asyncio.ensure_future(self._call("chat", fields))
            task.add_done_callback(lambda _: inflight.pop(key, None))
        else:
            self._add("rag/cache_hits", 1)
        result: dict[str, Any] = await asyncio.shield(task)
        self._cache[key] = result
        return result

    async def both(self, **fields: Any) -> tuple[dict[str, Any] | RAGFailure, dict[str, Any] | RAGFailure]:
        """(candidate, reference): ``chat_8b(**fields)`` and ``chat(**reference fields)`` in parallel.

        `fields` are the ``/rag/chat_8b`` fields plus optionally ``context``; each endpoint gets its own.
        Never raises: a failed side is a :class:`RAGFailure`.
        """
        cand_fields = {k: v for k, v in fields.items() if k != "context"}
        ref_fields = {k: v for k, v in fields.items() if k in CHAT_FIELDS}
        outcomes = await asyncio.gather(self.chat_8b(**cand_fields), self.chat(**ref_fields), return_exceptions=True)
        return _as_result("chat_8b", outcomes[0]), _as_result("chat", outcomes[1])

    def pop_stats(self) -> dict[str, float]:
        """The counters since the last pop (see the module doc), reset."""
        with self._lock:
            stats = dict(self._stats)
            stats["rag/latency_s"] = self._latency_sum / self._latency_n if self._latency_n else 0.0
            self._stats = dict.fromkeys(_STAT_KEYS, 0.0)
            self._latency_sum, self._latency_n = 0.0, 0
        return stats

    def clear_cache(self) -> None:
        self._cache.clear()

    async def aclose(self) -> None:
        """Close this event loop's HTTP connections."""
        client = self._http.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    # --- internals ------------------------------------------------------------------------------

    async def _call(self, endpoint: str, fields: dict[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            result = await self._with_retries(endpoint, fields)
        except Exception as e:
            self._add("rag/failed", 1)
            raise RAGError(endpoint, _describe(e)) from e
        finally:
            with self._lock:
                self._latency_sum += time.perf_counter() - start
                self._latency_n += 1
        return result

    async def _with_retries(self, endpoint: str, fields: dict[str, Any]) -> dict[str, Any]:
        retrying = AsyncRetrying(
            retry=retry_if_exception(_is_retryable),
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                self._add("rag/requests", 1)
                if attempt.retry_state.attempt_number > 1:
                    self._add("rag/retries", 1)
                return await self._once(endpoint, fields)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(self, endpoint: str, fields: dict[str, Any]) -> dict[str, Any]:
        if isinstance(self.target, InProcessRAG):
            method = self.target.chat_8b if endpoint == "chat_8b" else self.target.chat
            body: dict[str, Any] = await asyncio.wait_for(method(**fields), self.timeout_s)
        else:
            response = await self._client().post(endpoint_url(self.target, endpoint), json=fields)
            if response.status_code >= 500 or response.status_code == 429:
                raise _Retryable(f"HTTP {response.status_code}: {response.text[:200]}")
            if response.status_code >= 400:
                raise RAGError(endpoint, f"HTTP {response.status_code}: {response.text[:300]}")
            try:
                answer = response.json()
            except ValueError:
                raise RAGError(endpoint, f"the answer is not JSON: {response.text[:200]!r}") from None
            body = map_document_fields(answer, self.document_fields)
        problem = contract_problem(body, self.document_fields)
        if problem is not None:
            raise RAGError(endpoint, problem)
        return body

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._http.get(loop)
        if client is None or client.is_closed:
            client = self._http[loop] = httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers)
        return client

    def _wait(self, state: RetryCallState) -> float:
        b = min(self.backoff_max_s, self.backoff_base_s * 2 ** (state.attempt_number - 1))
        return random.uniform(b / 2, b)

    def _add(self, key: str, value: float) -> None:
        with self._lock:
            self._stats[key] += value


DOCUMENT_FIELDS = ("doc_id", "title", "content")  # what every document of a RAG answer must carry


def check_document_fields(
    mapping: dict[str, str], where: str = "app.query_rewrite.rag.document_fields"
) -> dict[str, str]:
    """`mapping` (our field -> the service's name) checked: keys among :data:`DOCUMENT_FIELDS` and ``score``,
    values non-empty strings. Raises ValueError naming `where` and the bad entry."""
    allowed = (*DOCUMENT_FIELDS, "score")
    out: dict[str, str] = {}
    for ours, theirs in dict(mapping).items():
        if ours not in allowed:
            raise ValueError(
                f"{where}: unknown field {ours!r}; map any of {', '.join(allowed)} to your service's names"
            )
        if not isinstance(theirs, str) or not theirs.strip():
            raise ValueError(f"{where}.{ours}: the service's field name must be a non-empty string, got {theirs!r}")
        out[str(ours)] = theirs.strip()
    return out


def map_document_fields(body: Any, mapping: dict[str, str]) -> Any:
    """`body` with each document of its ``response`` list given our field names: ``doc[ours] =
    doc[theirs]`` for each ``ours -> theirs`` of `mapping` where the document has ``theirs`` (the service's
    own keys are kept). Anything that is not such a body is returned as it is (the contract check names it)."""
    if not mapping or not isinstance(body, dict) or not isinstance(body.get("response"), list):
        return body
    docs = []
    for doc in body["response"]:
        if isinstance(doc, dict):
            doc = {**doc, **{ours: doc[theirs] for ours, theirs in mapping.items() if theirs in doc}}
            if "doc_id" in mapping and isinstance(doc.get("doc_id"), int) and not isinstance(doc["doc_id"], bool):
                doc["doc_id"] = str(doc["doc_id"])  # a numeric knowledge_id (null stays null: the check names it)
        docs.append(doc)
    return {**body, "response": docs}


def contract_problem(body: Any, mapping: dict[str, str] | None = None) -> str | None:
    """Why a RAG service's answer breaks the response contract (see the module docstring), or None: one
    line naming the field, its value and what was expected. `mapping` (the configured ``document_fields``)
    is named where a field is missing or a mapped one is bad."""
    if not isinstance(body, dict):
        return f"the answer is a JSON {type(body).__name__}, not an object with a 'response' list of documents"
    if body.get("status") != "success":
        value = f"is {shown_value(body['status'])}" if "status" in body else "is missing"
        error = f"; its 'error': {shown_value(body['error'])}" if body.get("error") not in (None, "") else ""
        return f"field 'status' {value} (expected \"success\"){error}"
    docs = body.get("response")
    if not isinstance(docs, list):
        return (
            f"the answer has no 'response' list of documents (its keys: {', '.join(sorted(map(str, body))) or 'none'})"
        )
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            return f"document {i} of 'response' is a JSON {type(doc).__name__}, not an object"
        missing = [f for f in DOCUMENT_FIELDS if f not in doc]
        if missing:
            mapped = f" after app.query_rewrite.rag.document_fields {mapping}" if mapping else ""
            return (
                f"document {i} of 'response' lacks {', '.join(missing)}{mapped} (it has: "
                f"{', '.join(sorted(map(str, doc)))}); every document needs {', '.join(DOCUMENT_FIELDS)}: map your "
                "service's names with app.query_rewrite.rag.document_fields, e.g. "
                '{"doc_id": "knowledge_id", "title": "question", "content": "answer"}'
            )
        problem = _field_problem(doc, mapping or {})
        if problem is not None:
            return f"document {i} of 'response': {problem}"
    return None


_EXPECTED = {"doc_id": "a non-empty string", "title": "a string", "content": "a string", "score": "a number"}


def _field_problem(doc: dict[str, Any], mapping: dict[str, str]) -> str | None:
    """The first field of `doc` whose value the contract refuses (see :data:`_EXPECTED`), or None."""
    for name, expected in _EXPECTED.items():
        if name not in doc:
            continue  # a missing doc_id/title/content is named above; score is optional
        value = doc[name]
        if name == "score":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok = isinstance(value, str) and (bool(value) or name != "doc_id")
        if not ok:
            theirs = f" (the service's {mapping[name]!r} by document_fields)" if name in mapping else ""
            return f"field {name!r}{theirs} is {shown_value(value)} (expected {expected})"
    return None


def shown_value(value: Any, limit: int = 80) -> str:
    """`value` as JSON writes it (``null``, ``""``, ``3``, ``"error"``), cut to `limit` characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def endpoint_url(base_url: str, endpoint: str) -> str:
    """The URL of `endpoint` (``chat_8b`` or ``chat``) under `base_url`: a service root or a ``{endpoint}`` template."""
    base_url = base_url.rstrip("/")
    if "{endpoint}" in base_url:
        return base_url.replace("{endpoint}", endpoint)
    return f"{base_url}/rag/{endpoint}"


def reference_key(fields: dict[str, Any]) -> str:
    """The cache key of a ``/rag/chat`` request: its fields (defaults filled), as canonical JSON."""
    defaults: dict[str, Any] = {"context": "", "thought_unit": "", "score_threshold": 0.0}
    return json.dumps({k: fields.get(k, defaults.get(k)) for k in CHAT_FIELDS}, sort_keys=True, ensure_ascii=False)


def _describe(error: BaseException) -> str:
    if isinstance(error, RAGError):
        return error.error
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _as_result(endpoint: str, outcome: dict[str, Any] | BaseException) -> dict[str, Any] | RAGFailure:
    if isinstance(outcome, BaseException):
        if isinstance(outcome, asyncio.CancelledError):
            raise outcome
        return RAGFailure(endpoint, _describe(outcome))
    return outcome
