"""docs/your-data.md's minimal RAG service, served as written: it passes the preflight and a tiny
``queryrl train`` runs against it; the same service without ``status``, or with null documents, stops the run
at the preflight with one line naming the field, its value and what was expected (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.demo.data import sales_demo_corpus
from queryrl.apps.query_rewrite.preflight import reward_spec, service_checks
from queryrl.cli import app
from queryrl.config import load_config
from queryrl.trainer.preflight import run_preflight
from tests.rag.minimal_service import minimal_service_source, serve_minimal_service, variant

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "configs" / "query_rewrite_demo.yaml")
FIRST_ROW = "with the first row of builtin://sales_demo/train"
TINY_RUN = [  # about tests/test_readme_recipe.py's test size for `queryrl train`
    "trainer.total_steps=1",
    "data.train_batch_size=2",
    "rollout.n=2",
    "actor.ppo_mini_batch_size=2",
    "actor.ppo_micro_batch_size=4",
    "data.max_val_samples=2",
    "trainer.logger=[jsonl]",
    "trainer.plot=false",
    "data.max_prompt_length=400",
    "data.max_response_length=32",
    "app.query_rewrite.unparsed=retrieve",  # the untrained tiny model's replies are retrieved with, not floored
]


@pytest.mark.slow  # a uvicorn process each: 3-5 s
def test_the_minimal_service_passes_the_preflight(tmp_path: Path) -> None:
    with serve_minimal_service(tmp_path / "service", sales_demo_corpus()) as service:
        cfg = load_config(DEMO, [f"app.query_rewrite.rag.url={service.url}", f"model.cache_dir={tmp_path / 'c'}"])
        lines = [check() for check in service_checks(cfg)]  # GET /health, then one request per endpoint
        assert (service.requests("chat_8b"), service.requests("chat")) == (1, 1)
        assert f"POST {service.url}/rag/chat_8b {FIRST_ROW} answered 5 documents" in lines[1]
        assert f"POST {service.url}/rag/chat {FIRST_ROW} answered 5 documents" in lines[2]
        run_preflight(cfg, lines.append, service_checks(cfg), reward_spec(cfg))  # the whole preflight passes


@pytest.mark.slow
def test_a_tiny_run_trains_against_the_minimal_service(tmp_path: Path, model_cache: Path) -> None:
    with serve_minimal_service(tmp_path / "service", sales_demo_corpus()) as service:
        args = ["train", "--config", DEMO, f"app.query_rewrite.rag.url={service.url}", f"model.cache_dir={model_cache}"]
        result = CliRunner().invoke(app, [*args, f"trainer.output_dir={tmp_path / 'runs'}", *TINY_RUN])
        assert result.exit_code == 0, result.output[-4000:]
        assert f"preflight: RAG service: POST {service.url}/rag/chat_8b {FIRST_ROW}" in result.output
        assert service.requests("chat_8b") > 1, "training sent no /rag/chat_8b request after the preflight's"
        assert service.requests("chat") > 1
    (metrics,) = (tmp_path / "runs").rglob("metrics.jsonl")
    step = json.loads(metrics.read_text(encoding="utf-8").splitlines()[0])
    assert (step["step"], step["reward/failed"]) == (1, 0.0)  # every sample scored against the service
    assert step["rag/calls"] > 0


BROKEN = {
    "no status": (
        ('{"status": "success", "response": docs,', '{"response": docs,'),
        "field 'status' is missing (expected \"success\")",
    ),
    "null title": (
        ('"title": d["title"], "content"', '"title": None, "content"'),
        "document 0 of 'response': field 'title' is null (expected a string)",
    ),
    "null ids": (
        ('"doc_id": str(d["doc_id"])', '"doc_id": None'),
        "document 0 of 'response': field 'doc_id' is null (expected a non-empty string)",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_service_that_breaks_the_contract_stops_train_at_the_preflight(tmp_path: Path, broken: str) -> None:
    (old, new), expected = BROKEN[broken]
    source = variant(minimal_service_source(), old, new)
    with serve_minimal_service(tmp_path / "service", sales_demo_corpus(), source) as service:
        args = ["train", "--config", DEMO, f"app.query_rewrite.rag.url={service.url}"]
        args += [f"model.cache_dir={tmp_path / 'cache'}", f"trainer.output_dir={tmp_path / 'runs'}"]
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error: ")]
    assert line == f"error: RAG service at {service.url}: POST {service.url}/rag/chat_8b {FIRST_ROW}: {expected}"
    assert "Traceback" not in result.output
    assert not list((tmp_path / "cache").glob("tiny-qwen2-*")), "the model was built before the check failed"
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_queryrl_eval_makes_the_same_check_before_it_generates(tmp_path: Path) -> None:
    data = "builtin://sales_demo/test"
    broken = variant(minimal_service_source(), *BROKEN["no status"][0])
    out = tmp_path / "eval.json"
    with serve_minimal_service(tmp_path / "service", sales_demo_corpus(), broken) as service:
        args = ["eval", "--data", data, "--systems", "raw_turn,reference", "--out", str(out), "--max-samples", "2"]
        result = CliRunner().invoke(app, [*args, "--rag-url", service.url])
        assert service.requests("chat_8b") == 1  # the check's one request; nothing was generated after it
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("error: ")]
    expected = BROKEN["no status"][1]
    where = f"POST {service.url}/rag/chat_8b with the first row of {data}"
    assert line == f"error: RAG service at {service.url}: {where}: {expected}"
    assert not out.exists()
    with serve_minimal_service(tmp_path / "good", sales_demo_corpus()) as service:
        result = CliRunner().invoke(app, [*args, "--rag-url", service.url])
    assert result.exit_code == 0, result.output
    assert f"POST {service.url}/rag/chat_8b with the first row of {data} answered 5 documents" in result.output
    assert f"POST {service.url}/rag/chat with the first row of {data} answered 5 documents" in result.output
