"""``queryrl eval``: the baselines on the sales demo, the outputs, a model-folder system, judging, errors, CLI."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.eval_run import (
    EvalError,
    JudgeSettings,
    SystemSpec,
    evaluate,
    parse_systems,
)
from queryrl.cli import app

DATA = "builtin://sales_demo/test"
KINDS = {"explicit", "pronoun", "ellipsis", "switch", "comparison"}
runner = CliRunner()


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _samples(out: Path) -> list[dict[str, Any]]:
    lines = (out.parent / "eval_samples.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_baselines_metrics_outputs_and_offline_judge(tmp_path: Path, model_cache: Path) -> None:
    out = tmp_path / "eval.json"
    report = evaluate(
        DATA,
        "raw_turn,concat_last3,reference",
        out,
        judge=JudgeSettings("offline"),
        max_samples=40,
        n_boot=200,
        cache_dir=str(model_cache),
        echo=None,
    )
    assert json.loads(out.read_text(encoding="utf-8")) == report
    assert report["eval_file"] == DATA
    assert report["n_samples"] == 40
    assert report["settings"]["ks"] == [1, 3, 5]
    assert report["settings"]["judge"] == "offline"
    systems = report["systems"]
    assert list(systems) == ["raw_turn", "concat_last3", "reference"]
    for metrics in systems.values():
        assert metrics["n"] == 40
        assert metrics["n_skipped"] == 0
        assert metrics["format_ok"] == 1.0
        for key in ("recall@1", "recall@3", "recall@5", "mrr", "ndcg@5"):
            assert metrics[f"{key}_low"] <= metrics[key] <= metrics[f"{key}_high"]
            assert 0.0 <= metrics[key] <= 1.0
        assert metrics["recall@1"] <= metrics["recall@3"] <= metrics["recall@5"]
        assert "recall@10" not in metrics  # results hold top_k=5 documents
        assert set(metrics["by_kind"]) <= KINDS
        assert sum(k["n"] for k in metrics["by_kind"].values()) == 40
        explicit = metrics["by_kind"].get("explicit", {"n": 0})["n"]
        assert metrics["context_dependent"]["n"] == 40 - explicit
    # the reference rewriter resolves the history; the raw turn cannot (measured: 0.80 vs 0.42 here)
    assert systems["reference"]["recall@5"] > systems["raw_turn"]["recall@5"] + 0.2
    assert systems["reference"]["context_dependent"]["recall@5"] > systems["raw_turn"]["context_dependent"]["recall@5"]
    # judge: every sample has gold, so every verdict is valid and the outcomes add up to n
    assert "win" not in systems["reference"]
    for name in ("raw_turn", "concat_last3"):
        m = systems[name]
        assert m["judge_failed"] == 0
        assert m["judge_n"] == 40
        assert m["win"] + m["tie"] + m["loss"] == 40
        assert m["win_rate_low"] <= m["win_rate"] <= m["win_rate_high"]
        assert m["judge_score_low"] <= m["judge_score"] <= m["judge_score_high"]
    assert systems["raw_turn"]["loss"] > systems["raw_turn"]["win"]

    png = tmp_path / "eval.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    samples = _samples(out)
    assert len(samples) == 40
    assert not list(tmp_path.glob("*.tmp"))
    first = samples[1]
    assert first["systems"]["raw_turn"]["query"] == first["last_turn"]
    assert first["systems"]["reference"]["query"]  # the reference pipeline's own rewrite
    for entry in first["systems"].values():
        assert 1 <= len(entry["top5"]) <= 5
        assert entry["format_ok"]
    assert first["systems"]["raw_turn"]["verdict"] in ("8b", "32b", "same")


def test_model_folder_system_counts_format_failures(tmp_path: Path, tiny_cfg: DictConfig, model_cache: Path) -> None:
    from queryrl.models.loading import resolve_model_path

    folder = resolve_model_path(tiny_cfg.model)
    out = tmp_path / "eval.json"
    report = evaluate(
        DATA,
        ["raw_turn", f"tiny={folder}"],
        out,
        judge=JudgeSettings("offline"),
        max_samples=4,
        batch_size=4,
        max_new_tokens=8,
        n_boot=50,
        cache_dir=str(model_cache),
        echo=None,
    )
    tiny = report["systems"]["tiny"]
    assert 0.0 <= tiny["format_ok"] <= 1.0
    assert tiny["n"] == 4
    assert report["settings"]["systems"][1] == {"name": "tiny", "kind": "model", "path": str(folder)}
    failed = 0
    for sample in _samples(out):
        entry = sample["systems"]["tiny"]
        assert isinstance(entry["raw"], str)
        if not entry["format_ok"]:  # an unparsed reply: no retrieval (a miss) and a loss to the reference
            failed += 1
            assert entry["query"] is None
            assert entry["top5"] == []
            assert entry["verdict"] == "32b"
    assert tiny["format_ok"] == pytest.approx(1 - failed / 4)
    assert tiny["win"] + tiny["tie"] + tiny["loss"] + tiny["judge_failed"] == 4
    if failed == 4:  # the untrained tiny model: every reply is a miss
        assert tiny["recall@5"] == 0.0
        assert tiny["mrr"] == 0.0
        assert tiny["loss"] == 4


def test_parse_systems(tmp_path: Path) -> None:
    folder = tmp_path / "grpo_final"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    systems = parse_systems(f"raw_turn, reference,{folder},sft={folder}")
    assert systems == [
        SystemSpec("raw_turn", "raw_turn"),
        SystemSpec("reference", "reference"),
        SystemSpec("grpo_final", "model", folder),
        SystemSpec("sft", "model", folder),
    ]
    with pytest.raises(EvalError, match="unknown system 'bm25'"):
        parse_systems("raw_turn,bm25")
    with pytest.raises(EvalError, match=r"system 'sft': model folder .*missing.* does not exist"):
        parse_systems(f"sft={tmp_path / 'missing'}")
    with pytest.raises(EvalError, match=r"no config\.json"):
        parse_systems(f"x={tmp_path}")
    with pytest.raises(EvalError, match="used twice: raw_turn"):
        parse_systems("raw_turn,raw_turn")


def test_rag_down_is_one_clear_error(tmp_path: Path, model_cache: Path) -> None:
    url = _closed_port_url()
    with pytest.raises(EvalError, match=rf"RAG service at {url}: /rag/chat failed"):
        evaluate(
            DATA,
            "raw_turn,reference",
            tmp_path / "eval.json",
            rag_url=url,
            rag_max_retries=0,
            max_samples=2,
            cache_dir=str(model_cache),
            echo=None,
        )
    assert not (tmp_path / "eval.json").exists()


def test_openai_judge_without_key_is_a_clear_error(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUERYRL_TEST_NO_SUCH_KEY", raising=False)
    judge = JudgeSettings(
        "openai", base_url=_closed_port_url() + "/v1", model="m", api_key_env="QUERYRL_TEST_NO_SUCH_KEY"
    )
    with pytest.raises(EvalError, match=r"judge: .*QUERYRL_TEST_NO_SUCH_KEY"):
        evaluate(
            DATA, "raw_turn", tmp_path / "eval.json", judge=judge, max_samples=2, cache_dir=str(model_cache), echo=None
        )


def test_cli_end_to_end_with_config(tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_CACHE", str(model_cache))
    config = tmp_path / "qr.yaml"
    config.write_text("app:\n  query_rewrite:\n    rag:\n      top_k: 10\n    judge:\n      backend: offline\n")
    out = tmp_path / "run" / "eval.json"
    args = ["eval", "--data", DATA, "--systems", "raw_turn,concat_last3,reference", "--out", str(out)]
    result = runner.invoke(app, [*args, "--config", str(config), "--max-samples", "6", "--bootstrap", "50"])
    assert result.exit_code == 0, result.output
    assert "| system |" in result.output
    assert "| reference |" in result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["settings"]["top_k"] == 10
    assert report["settings"]["judge"] == "offline"
    assert "recall@10" in report["systems"]["reference"]
    assert "win" in report["systems"]["raw_turn"]
    assert (out.parent / "eval.png").is_file()
    assert (out.parent / "eval_samples.jsonl").is_file()

    result = runner.invoke(app, [*args[:4], "raw_turn,nope", "--out", str(out)])
    assert result.exit_code == 2
    assert "unknown system 'nope'" in result.output
    url = _closed_port_url()
    result = runner.invoke(app, [*args, "--rag-url", url, "--max-samples", "2"])
    assert result.exit_code == 2
    assert f"RAG service at {url}" in result.output
