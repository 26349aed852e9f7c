"""The embedded service's built-in corpora, looked up by name (queryrl.apps.query_rewrite.corpora): the plugin
registers them, and the reward retrieves from them without importing the demo or the KdConv reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queryrl.apps.query_rewrite.corpora import CORPORA, BuiltinCorpus, find_corpus, register_corpus
from queryrl.apps.query_rewrite.reward.rag import corpus_documents, embedded_rag


def test_the_plugin_registers_the_demo_and_kdconv_corpora() -> None:
    demo, argument = find_corpus("sales_demo") or (None, None)
    assert demo is not None
    assert argument == ""
    assert not demo.title_entities  # the heuristic rewriter's own product names, as before the registry
    kdconv, kb = find_corpus("kdconv:travel/kb_travel.json") or (None, None)
    assert kdconv is not None
    assert kb == "travel/kb_travel.json"
    assert kdconv.argument == "KB_PATH"
    assert not kdconv.latin_entities
    assert find_corpus("data/corpus.jsonl") is None  # a corpus file
    assert find_corpus("sales_demo:old.jsonl") is None  # sales_demo takes no argument: a file's name


def test_a_corpus_that_needs_an_argument_says_how_to_name_it() -> None:
    with pytest.raises(ValueError, match=r"name it as kdconv:KB_PATH"):
        find_corpus("kdconv")
    with pytest.raises(ValueError, match=r"name it as kdconv:KB_PATH"):
        corpus_documents("kdconv:")


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_corpus("sales_demo", BuiltinCorpus(lambda _: []))
    with pytest.raises(ValueError, match="without ':'"):
        register_corpus("a:b", BuiltinCorpus(lambda _: []))
    register_corpus("sales_demo", CORPORA["sales_demo"])  # the same again: fine (a plugin set up twice)


def test_documents_and_entities_come_from_the_registered_corpus_or_the_file(tmp_path: Path) -> None:
    demo = corpus_documents("sales_demo")
    assert len(demo) == 200
    assert demo[0].doc_id.endswith("-price")
    assert not embedded_rag("sales_demo", top_k=5).index.entities  # the demo: no title entities
    kb = tmp_path / "kb_travel.json"
    triples = [["故宫", "地址", "北京市东城区景山前街4号"], ["故宫", "门票", "60元"]]
    kb.write_text(json.dumps({"故宫": triples}, ensure_ascii=False), "utf-8")
    docs = corpus_documents(f"kdconv:{kb}")
    assert [(d.title, d.content) for d in docs] == [
        ("故宫", "故宫 地址: 北京市东城区景山前街4号"),
        ("故宫", "故宫 门票: 60元"),
    ]
    kdconv = embedded_rag(f"kdconv:{kb}", top_k=2)
    assert kdconv.index.entities
    assert not kdconv.rewriter.latin_entities
    file = tmp_path / "corpus.jsonl"
    file.write_text(json.dumps({"doc_id": "a", "title": "故宫", "content": "景山前街4号"}) + "\n", "utf-8")
    assert [d.doc_id for d in corpus_documents(str(file))] == ["a"]
    assert embedded_rag(str(file), top_k=1).rewriter.latin_entities  # a corpus file: the catalogue rule
