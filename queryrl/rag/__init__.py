"""Retrieval for the query-rewrite application: a BM25 index (jieba tokens; optional dense / hybrid), the
RAG service the reward calls (docs/query-rewriter.md; FastAPI or in-process) and its async client."""

from queryrl.rag.client import RAGClient, RAGError, RAGFailure, reference_key
from queryrl.rag.index import (
    BM25Index,
    DenseIndex,
    Document,
    Hit,
    HybridIndex,
    Index,
    load_corpus,
    tokenize,
)
from queryrl.rag.rewriters import (
    REWRITERS,
    HeuristicRewriter,
    LastTurnRewriter,
    OpenAICompatibleRewriter,
    Rewriter,
    build_rewriter,
    make_rewriter,
    register_rewriter,
)
from queryrl.rag.service import InProcessRAG, make_app, serve

__all__ = [
    "REWRITERS",
    "BM25Index",
    "DenseIndex",
    "Document",
    "HeuristicRewriter",
    "Hit",
    "HybridIndex",
    "InProcessRAG",
    "Index",
    "LastTurnRewriter",
    "OpenAICompatibleRewriter",
    "RAGClient",
    "RAGError",
    "RAGFailure",
    "Rewriter",
    "build_rewriter",
    "load_corpus",
    "make_app",
    "make_rewriter",
    "reference_key",
    "register_rewriter",
    "serve",
    "tokenize",
]
