"""SFT targets from the user's own reference pipeline: a rewrite column of the export, or the RAG service's
``/rag/chat``; every row says where its target came from and ``queryrl sft`` prints the counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openpyxl
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.data.sft_targets import HEURISTIC_SOURCE
from queryrl.apps.query_rewrite.demo.data import sales_demo_corpus
from queryrl.apps.query_rewrite.plugin import QueryRewriteApp
from queryrl.cli import app
from queryrl.config import load_config
from queryrl.data.records import load_records
from queryrl.rag import BM25Index, Document, make_app
from queryrl.testing.judge_server import running_server

runner = CliRunner()
REWRITE = "改写query"
MESSAGES = [
    ("S-1", "客户", "星辰 X3 和云帆 Pro2 多少钱？", "星辰 X3 云帆 Pro2 价格"),
    ("S-1", "客服", "分别是 2999 和 3999 元。", None),
    ("S-1", "客户", "它们续航怎么样？", "星辰 X3 云帆 Pro2 续航"),
    ("S-2", "客户", "有没有适合老人的手机？", None),  # the pipeline left no rewrite: the heuristic's
    ("S-2", "客服", "推荐星辰 Lite。", None),
]
SOURCE = f"column {REWRITE!r} of the export"
FALLBACK = f"{HEURISTIC_SOURCE}, where {SOURCE} has no rewrite"


def _export(path: Path) -> Path:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(("会话ID", "角色", "消息内容", REWRITE))
    for row in MESSAGES:
        sheet.append(row)
    book.save(path)
    return path


def _prepare(tmp_path: Path, *extra: str) -> Any:
    export = _export(tmp_path / "export.xlsx")
    args = ["prepare", "conversations", "--input", str(export), "--out", str(tmp_path / "qr")]
    return runner.invoke(app, [*args, "--val-fraction", "0", "--test-fraction", "0", *extra])


def _sft_args(tmp_path: Path, model_cache: Path, *extra: str) -> list[str]:
    return [
        "sft",
        f"model.cache_dir={model_cache}",
        f"sft.train_files=[{tmp_path / 'qr' / 'train.parquet'}]",
        f"sft.output_dir={tmp_path / 'sft'}",
        f"trainer.output_dir={tmp_path}",
        "trainer.logger=[jsonl]",
        "trainer.num_threads=1",
        "sft.max_steps=1",
        "sft.batch_size=4",
        "data.max_prompt_length=4096",  # the tiny model's byte tokenizer: a Chinese prompt is long
        *extra,
    ]


def test_the_exports_rewrite_column_gives_the_targets_and_sft_says_so(tmp_path: Path, model_cache: Path) -> None:
    result = _prepare(tmp_path, "--rewrite-column", REWRITE)
    assert result.exit_code == 0, result.output
    assert f"SFT targets (train): {SOURCE} (2 rows), {FALLBACK} (1 rows)" in result.output
    rows = {
        r["extra_info"]["contexts"][-1]["content"]: r["extra_info"]
        for r in load_records(tmp_path / "qr" / "train.parquet")
    }
    assert json.loads(rows["它们续航怎么样？"]["sft_target"]) == {"rewritten_query": "星辰 X3 云帆 Pro2 续航"}
    assert rows["它们续航怎么样？"]["sft_target_source"] == SOURCE
    assert rows["有没有适合老人的手机？"]["sft_target_source"] == FALLBACK

    sft = runner.invoke(app, _sft_args(tmp_path, model_cache))
    assert sft.exit_code == 0, sft.output
    assert f"SFT targets (train): {SOURCE} (2 rows), {FALLBACK} (1 rows)" in sft.output


def test_without_a_rewrite_column_the_heuristic_is_named_and_a_wrong_column_is_one_line(tmp_path: Path) -> None:
    export = _export(tmp_path / "export.xlsx")
    book = openpyxl.load_workbook(export)
    book.active.delete_cols(4)  # type: ignore[union-attr]
    book.save(export)
    args = ["prepare", "conversations", "--input", str(export), "--val-fraction", "0", "--test-fraction", "0"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert f"SFT targets (train): {HEURISTIC_SOURCE} (3 rows)" in result.output
    wrong = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--rewrite-column", "改写后的问题"])
    assert wrong.exit_code == 2
    assert "missing column for 'reference_rewrite'" in wrong.output
    assert "改写后的问题" in wrong.output
    assert not (tmp_path / "b").exists()


class _Pipeline:
    """The team's reference pipeline: names every product of the conversation; abstains on small talk."""

    async def rewrite(self, contexts: list[dict[str, Any]], user_profile: str, history_summary: str) -> str:
        last = str(contexts[-1]["content"])
        return "" if "老人" in last else f"参考改写：{last}"


def test_sft_target_rag_chat_asks_the_service_for_each_row(tmp_path: Path, model_cache: Path) -> None:
    assert _prepare(tmp_path).exit_code == 0
    docs = [Document(d["doc_id"], d["title"], d["content"]) for d in sales_demo_corpus()]
    service = make_app(BM25Index(docs), _Pipeline(), top_k=5)
    with running_server(service) as url:
        root = url.removesuffix("/v1")
        keys = ["app.query_rewrite.enable=true", f"app.query_rewrite.rag.url={root}"]
        keys.append("app.query_rewrite.sft_target=rag_chat")
        cfg = load_config(None, [f"model.cache_dir={model_cache}", *keys])
        rows = [(i, r) for i, r in enumerate(load_records(tmp_path / "qr" / "train.parquet"))]
        made = QueryRewriteApp().sft_targets(cfg, "train.parquet", rows)
        assert made is not None
        by_turn = {row["extra_info"]["contexts"][-1]["content"]: m for (_, row), m in zip(rows, made, strict=True)}
        where = f"rewritten_query of /rag/chat at {root}"
        assert by_turn["它们续航怎么样？"] == (
            json.dumps({"rewritten_query": "参考改写：它们续航怎么样？"}, ensure_ascii=False),
            where,
        )
        assert by_turn["有没有适合老人的手机？"] is None  # no rewrite: the row keeps its own target
        assert service.state.requests["chat"] == 3

        sft = runner.invoke(app, _sft_args(tmp_path, model_cache, *keys))
        assert sft.exit_code == 0, sft.output
        assert f"SFT targets (train): {where} (2 rows), {FALLBACK} (1 rows)" in sft.output
    down = runner.invoke(app, _sft_args(tmp_path, model_cache, *keys, "app.query_rewrite.rag.max_retries=0"))
    assert down.exit_code == 2
    assert "row 0: app.query_rewrite.sft_target=rag_chat: /rag/chat failed" in down.output
    assert "Traceback" not in down.output
