"""KdConv loader and corpus on the real travel files (skipped, saying where KdConv comes from, where it is absent)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.data.kdconv import (
    doc_id,
    kdconv_corpus,
    kdconv_missing,
    kdconv_rows,
    load_kdconv_conversations,
)
from queryrl.cli import app
from queryrl.data.records import DataError
from tests.helpers import KDCONV, REPO
from tests.helpers import needs_kdconv as needs_files

needs_kdconv = needs_files()


@needs_kdconv
def test_gold_of_a_user_turn_is_what_the_next_reply_used() -> None:
    rows = kdconv_rows(KDCONV / "dev.json")
    first = [r for r in rows if r["extra_info"]["conversation_id"] == "dev-0000"]
    by_turn = {r["extra_info"]["turn"]: r for r in first}
    assert sorted(by_turn)[:5] == [0, 2, 4, 6, 8]  # the opening speaker's turns
    # checked by hand in dev.json: message 8 "嗯，那它那里需要门票吗？", reply 9 used (观复博物馆, 门票, 100元)
    turn = by_turn[8]
    assert turn["extra_info"]["contexts"][-1] == {"role": "user", "content": "嗯，那它那里需要门票吗？"}
    assert len(turn["extra_info"]["contexts"]) == 9
    assert turn["reward_model"]["ground_truth"] == {"gold_doc_ids": ["观复博物馆::门票"], "gold_titles": ["观复博物馆"]}
    assert by_turn[0]["reward_model"]["ground_truth"] == {
        "gold_doc_ids": ["百雅轩798艺术中心::Information"],
        "gold_titles": ["百雅轩798艺术中心"],
    }
    # reply 5 used two triples of the same entity: both are gold for turn 4, in order
    assert by_turn[4]["reward_model"]["ground_truth"]["gold_doc_ids"] == [
        "百雅轩798艺术中心::开放时间",
        "百雅轩798艺术中心::周边景点",
    ]
    assert turn["data_source"] == "query_rewrite/kdconv"


@needs_kdconv
def test_row_counts_and_both_speakers() -> None:
    data = json.loads((KDCONV / "dev.json").read_text(encoding="utf-8"))
    n_messages = sum(len(c["messages"]) for c in data)
    assert n_messages == 2691
    one = load_kdconv_conversations(KDCONV / "dev.json")
    both = load_kdconv_conversations(KDCONV / "dev.json", both_speakers=True)
    assert len(one) == 150
    assert len(both) == 300
    n_user = sum(m.role == "user" for c in both for m in c.messages)
    assert n_user == n_messages  # every message is a user turn exactly once
    gold_rows = kdconv_rows(KDCONV / "dev.json", both_speakers=True, require_gold=True)
    # slow reference: messages whose next message carries attrs
    expected = sum(1 for c in data for i in range(len(c["messages"]) - 1) if c["messages"][i + 1].get("attrs"))
    assert len(gold_rows) == expected


@needs_kdconv
def test_corpus_has_one_document_per_entity_attribute() -> None:
    corpus = kdconv_corpus(KDCONV / "kb_travel.json")
    kb = json.loads((KDCONV / "kb_travel.json").read_text(encoding="utf-8"))
    assert sum(len(t) for t in kb.values()) == 12509
    pairs = {(name, attr) for triples in kb.values() for name, attr, _ in triples}
    assert len(corpus) == len(pairs) == 6766
    ids = {d["doc_id"] for d in corpus}
    assert len(ids) == len(corpus)
    doc = next(d for d in corpus if d["doc_id"] == "观复博物馆::门票")
    assert doc == {"doc_id": "观复博物馆::门票", "title": "观复博物馆", "content": "观复博物馆 门票: 100元"}
    near = next(d for d in corpus if d["doc_id"] == doc_id("故宫", "周边景点"))
    assert near["content"].startswith("故宫 周边景点: 南锣鼓巷；天坛；恭王府")  # distinct values, in order
    gold = {g for r in kdconv_rows(KDCONV / "dev.json") for g in r["reward_model"]["ground_truth"]["gold_doc_ids"]}
    assert gold <= ids  # every gold document exists


def test_small_synthetic_file_and_errors(tmp_path: Path) -> None:
    dialogue = [
        {
            "name": "A",
            "messages": [
                {"message": "A 在哪？"},
                {"message": "在北京。", "attrs": [{"name": "A", "attrname": "地址", "attrvalue": "北京"}]},
                {"message": "门票呢？"},
            ],
        }
    ]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(dialogue, ensure_ascii=False), encoding="utf-8")
    rows = kdconv_rows(path, name="mini")
    assert [r["reward_model"]["ground_truth"]["gold_doc_ids"] for r in rows] == [["A::地址"], []]
    kb = tmp_path / "kb.json"
    kb.write_text(json.dumps({"A": [["A", "地址", "北京"], ["A", "地址", "北京"]]}, ensure_ascii=False))
    assert kdconv_corpus(kb) == [{"doc_id": "A::地址", "title": "A", "content": "A 地址: 北京"}]
    kb.write_text(json.dumps({"A": [["A", "地址"]]}))
    with pytest.raises(DataError, match="entity 'A': triple 0"):
        kdconv_corpus(kb)
    path.write_text(json.dumps([{"name": "A"}]))
    with pytest.raises(DataError, match="conversation 0: field 'messages'"):
        load_kdconv_conversations(path)


SOURCE = ("github.com/thu-coai/KdConv", "Apache-2.0")  # where KdConv comes from, and its licence


def test_the_absent_data_message_says_where_kdconv_comes_from_and_what_points_to_it() -> None:
    assert kdconv_missing("/x/travel/dev.json") == (
        "KdConv data not found at /x/travel/dev.json: it is not part of queryrl; get it from "
        "https://github.com/thu-coai/KdConv (Zhou et al., ACL 2020; licence Apache-2.0), whose travel folder holds "
        "dev.json and kb_travel.json; set KDCONV_DIR to its travel folder"
    )
    assert kdconv_missing("t.json", "KDCONV_TEST").endswith("; set KDCONV_TEST to the file")
    assert kdconv_missing("dev.json", "--input").endswith("; give its path as --input")
    assert kdconv_missing("dev.json", None).endswith("holds dev.json and kb_travel.json")


def test_reading_an_absent_kdconv_file_says_where_kdconv_comes_from(tmp_path: Path) -> None:
    for read in (kdconv_rows, kdconv_corpus):
        with pytest.raises(DataError) as err:
            read(tmp_path / "absent.json")
        assert all(s in str(err.value) for s in SOURCE), err.value


@pytest.mark.parametrize("absent", ["--input", "--kb"])
def test_prepare_kdconv_without_its_data_is_one_line_naming_the_source(tmp_path: Path, absent: str) -> None:
    files = {"--input": tmp_path / "dev.json", "--kb": tmp_path / "kb_travel.json"}
    for option, path in files.items():
        if option != absent:
            path.write_text("{}" if option == "--kb" else "[]", encoding="utf-8")
    args = ["prepare", "kdconv", *(x for kv in files.items() for x in (kv[0], str(kv[1])))]
    args += ["--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert all(s in lines[0] for s in SOURCE), lines[0]
    assert f"at {files[absent]}" in lines[0]
    assert lines[0].endswith(f"give its path as {absent}")
    assert not (tmp_path / "o").exists()


# the folder's default, written in pieces so that this file does not match itself
SHARED_KDCONV = re.compile(r'"shared"\s*/\s*"data"\s*/\s*"' + "kdconv" + '"')
ABSENT = re.compile("KdConv.*(?:absent|not found|missing)|(?:absent|not found|missing).*KdConv", re.IGNORECASE)
ONE_DEFAULT = {"benchmarks/common.py", "tests/helpers.py"}  # the benches' and the tests' default folder
HOMES = {"queryrl/apps/query_rewrite/data/kdconv.py", "tests/apps/query_rewrite/data/test_kdconv.py"}  # the message's
# being changed by another piece of work on the vocabulary-restricted head (issue #51): their own KdConv messages
OPEN = ("benchmarks/real_model.py", "benchmarks/vocab_head", "tests/benchmarks/test_real_model.py")


def _messages(tree: ast.AST) -> list[tuple[int, str]]:
    """Each string literal (an f-string's constant parts joined) that is not a docstring, with its line."""
    skipped = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    skipped |= parts  # an f-string's parts are read with it
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found.append((node.lineno, "".join(v.value for v in node.values if isinstance(v, ast.Constant))))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            found.append((node.lineno, node.value))
    return found


def kdconv_message_sites(repo: Path) -> list[str]:
    """``path:line`` of each place, in the package, the benches (not the lever scripts) and the tests, that
    builds KdConv's default folder outside its two homes or words a KdConv-is-absent message of its own
    instead of :func:`~queryrl.apps.query_rewrite.data.kdconv.kdconv_missing`."""
    files = [*repo.glob("queryrl/**/*.py"), *repo.glob("benchmarks/*.py"), *repo.glob("tests/**/*.py")]
    bad = []
    for path in sorted(files):
        rel = path.relative_to(repo).as_posix()
        if rel.startswith(OPEN) or rel in HOMES:
            continue
        text = path.read_text(encoding="utf-8")
        if rel not in ONE_DEFAULT and SHARED_KDCONV.search(text):
            bad.append(f"{rel}: builds the default KdConv folder (use tests.helpers.KDCONV or common.kdconv_dir)")
        bad += [f"{rel}:{line}: {s[:60]!r}" for line, s in _messages(ast.parse(text)) if ABSENT.search(s)]
    return bad


def test_every_kdconv_absent_message_is_the_one_helper() -> None:
    assert kdconv_message_sites(REPO) == []


def test_the_message_check_finds_a_message_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text(
        '"""KdConv absent: skipped (a docstring says so freely)."""\n'
        'KD = REPO.parent / "shared" / "data" / "' + "kdconv" + '"\n'
        'print(f"SKIP: KdConv not found at {KD}")\n'
        "print(kdconv_missing(KD))\n",
        encoding="utf-8",
    )
    assert kdconv_message_sites(tmp_path) == [
        "benchmarks/b.py: builds the default KdConv folder (use tests.helpers.KDCONV or common.kdconv_dir)",
        "benchmarks/b.py:3: 'SKIP: KdConv not found at '",
    ]
