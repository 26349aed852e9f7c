"""The entity dictionary of the BM25 index and the heuristic rewriter (names written in Chinese)."""

from __future__ import annotations

import asyncio

from queryrl.apps.query_rewrite.demo.data import sales_demo_rows
from queryrl.apps.query_rewrite.reward.rag import embedded_rag
from queryrl.rag import BM25Index, Document, HeuristicRewriter, tokenize
from queryrl.rag.index import normalise_entities, title_entities

DOCS = [
    Document("古北水镇::门票", "古北水镇", "古北水镇 门票: 150元"),
    Document("古北水镇::地址", "古北水镇", "古北水镇 地址: 北京市密云区"),
    Document("八达岭长城::门票", "八达岭长城", "八达岭长城 门票: 40元"),
    Document("月老祠::开放时间", "月老祠", "月老祠 开放时间: 8:00-17:00"),
]


def test_multi_character_entity_is_one_token() -> None:
    index = BM25Index(DOCS, entities=title_entities(DOCS))
    assert "月老祠" in index.tokenize("月老祠几点开门")
    assert "古北水镇" in index.tokenize("我想去古北水镇")
    # the pieces follow the whole name, so a partial mention still matches
    assert index.tokenize("古北水镇") == ["古北水镇", "古北", "水", "镇"]
    # jieba's global tokenizer is untouched: no entity leaks into other indexes
    assert "月老祠" not in tokenize("月老祠几点开门")
    assert "月老祠" not in BM25Index(DOCS).tokenize("月老祠几点开门")


def test_entity_index_ranks_the_named_entity_first() -> None:
    index = BM25Index(DOCS, entities=title_entities(DOCS))
    assert index.search("月老祠 开放时间", k=1)[0].doc_id == "月老祠::开放时间"
    assert index.search("古北水镇门票多少钱", k=1)[0].doc_id == "古北水镇::门票"


def test_normalise_entities_drops_unusable_names() -> None:
    words = normalise_entities(["  故宫 ", "华为 Mate 60", "", "x" * 40, "798艺术区", "中国·长城"])
    assert words == {"故宫", "798艺术区"}


def test_heuristic_carries_the_most_recent_chinese_entity() -> None:
    rewriter = HeuristicRewriter(title_entities(DOCS), latin_entities=False)
    contexts = [
        {"role": "user", "content": "你知道古北水镇吗？"},
        {"role": "assistant", "content": "知道，它在北京市密云区，2010年开始建设。"},
        {"role": "user", "content": "那门票多少钱？"},
    ]
    # the digits of the assistant's turn are not entities: the name two turns back is carried
    assert rewriter.rewrite_sync(contexts) == "古北水镇 那门票多少钱？"
    newer = [*contexts[:2], {"role": "assistant", "content": "附近还有月老祠。"}, contexts[2]]
    assert rewriter.rewrite_sync(newer) == "月老祠 那门票多少钱？"
    # a turn that names an entity is standalone
    standalone = [*contexts[:2], {"role": "user", "content": "八达岭长城门票呢？"}]
    assert rewriter.rewrite_sync(standalone) == "八达岭长城门票呢？"
    # the product-catalogue rule (latin and digits are entity-like) is still the default, but a turn
    # whose only such tokens are bare numbers ("2010") names nothing and is passed over
    assert HeuristicRewriter(title_entities(DOCS)).rewrite_sync(contexts) == "古北水镇 那门票多少钱？"
    named = [contexts[0], {"role": "assistant", "content": "X5 在 2010 年上市"}, contexts[2]]
    assert HeuristicRewriter(title_entities(DOCS)).rewrite_sync(named) == "x5 2010 那门票多少钱？"


def test_sales_demo_reference_unchanged() -> None:
    """The embedded service over the sales demo answers as without the entity dictionary (a pinned recall)."""
    rag = embedded_rag("sales_demo", top_k=5)
    assert isinstance(rag.rewriter, HeuristicRewriter)
    assert not rag.rewriter.entities
    assert isinstance(rag.index, BM25Index)
    assert not rag.index.entities
    rows = [r for r in sales_demo_rows("test") if r["reward_model"]["ground_truth"]["gold_doc_ids"]]

    async def recall() -> float:
        total = 0.0
        for row in rows:
            gold = set(row["reward_model"]["ground_truth"]["gold_doc_ids"])
            fields = dict.fromkeys(("tenant_id", "contact_id", "account_id", "message_id"), "t")
            result = await rag.chat(contexts=row["extra_info"]["contexts"], **fields)
            total += len(gold & {d["doc_id"] for d in result["response"]}) / len(gold)
        return total / len(rows)

    # the sales demo v6 (sales chats, paraphrased replies): 250 retrieval turns in the test split
    assert len(rows) == 250
    assert abs(asyncio.run(recall()) - 0.602) < 1e-9


def test_embedded_rag_over_a_corpus_file_uses_titles(tmp_path: object) -> None:
    import json
    from pathlib import Path

    path = Path(str(tmp_path)) / "corpus.jsonl"
    lines = [json.dumps({"doc_id": d.doc_id, "title": d.title, "content": d.content}, ensure_ascii=False) for d in DOCS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rag = embedded_rag(str(path), top_k=5)
    assert isinstance(rag.index, BM25Index)
    assert "月老祠" in rag.index.entities
    assert isinstance(rag.rewriter, HeuristicRewriter)
    assert rag.rewriter.latin_entities
