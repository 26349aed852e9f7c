"""``queryrl eval``: the baselines on the sales demo, the outputs, a model-folder system, judging, errors, CLI."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.eval.run import evaluate
from queryrl.apps.query_rewrite.eval.samples import EvalError, SystemSpec, parse_systems
from queryrl.cli import app
from queryrl.config import load_config
from queryrl.testing.judge_server import Chaos, running_server
from queryrl.testing.judge_server import make_app as make_judge_app

DATA = "builtin://sales_demo/test"
KINDS = {
    *("explicit", "pronoun", "ellipsis", "switch", "line_switch", "comparison", "typo", "bargain", "followup"),
    "chitchat",  # needs no retrieval: no gold, scored by abstain_accuracy
}
runner = CliRunner()


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _cfg(*overrides: str) -> DictConfig:
    """The app's settings with dotted overrides, as queryrl eval loads them."""
    return load_config(None, list(overrides), allow_missing=True)


OFFLINE = "app.query_rewrite.judge.backend=offline"


def _openai(base_url: str, model: str, **judge: Any) -> DictConfig:
    """The settings of an OpenAI-compatible judge at `base_url` (`judge`: more app.query_rewrite.judge keys)."""
    keys = {"backend": "openai", "base_url": base_url, "model": model, **judge}
    return _cfg(*(f"app.query_rewrite.judge.{k}={'null' if v is None else v}" for k, v in keys.items()))


def _samples(out: Path) -> list[dict[str, Any]]:
    lines = (out.parent / "eval_samples.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_baselines_metrics_outputs_and_offline_judge(tmp_path: Path, model_cache: Path) -> None:
    out = tmp_path / "eval.json"
    report = evaluate(
        DATA,
        "raw_turn,concat_last3,reference",
        out,
        _cfg(OFFLINE),
        judge=True,
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
    assert report["settings"]["machine"]["matmul_gflops"]["float32"] > 0  # what the numbers ran on
    systems = report["systems"]
    assert list(systems) == ["raw_turn", "concat_last3", "reference"]
    for metrics in systems.values():
        assert metrics["n"] + metrics["n_skipped"] == 40  # retrieval metrics over the retrieval turns only
        assert metrics["n_skipped"] == metrics["n_no_retrieval"] > 0
        assert metrics["format_ok"] == 1.0
        for key in ("recall@1", "recall@3", "recall@5", "mrr", "ndcg@5"):
            assert metrics[f"{key}_low"] <= metrics[key] <= metrics[f"{key}_high"]
            assert 0.0 <= metrics[key] <= 1.0
        assert metrics["recall@1"] <= metrics["recall@3"] <= metrics["recall@5"]
        assert "recall@10" not in metrics  # results hold top_k=5 documents
        assert set(metrics["by_kind"]) <= KINDS
        assert sum(k["n"] for k in metrics["by_kind"].values()) == 40
        explicit = metrics["by_kind"].get("explicit", {"n": 0})["n"]
        assert metrics["context_dependent"]["n"] == metrics["n"] - explicit
    # the reference rewriter resolves the history; the raw turn cannot (measured: 0.80 vs 0.42 here)
    assert systems["reference"]["recall@5"] > systems["raw_turn"]["recall@5"] + 0.2
    assert systems["reference"]["context_dependent"]["recall@5"] > systems["raw_turn"]["context_dependent"]["recall@5"]
    # judge: every sample has gold or is labelled as needing no retrieval, so every verdict is valid
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
        _cfg(OFFLINE),
        judge=True,
        max_samples=4,
        batch_size=4,
        max_new_tokens=8,
        n_boot=50,
        cache_dir=str(model_cache),
        echo=None,
    )
    tiny = report["systems"]["tiny"]
    assert 0.0 <= tiny["format_ok"] <= 1.0
    assert tiny["n"] + tiny["n_skipped"] == 4  # the first 4 rows: a greeting and 3 questions
    assert report["settings"]["systems"][1] == {"name": "tiny", "kind": "model", "path": str(folder), "head": "full"}
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


@pytest.mark.slow
def test_models_generated_in_processes_answer_as_in_one(
    tmp_path: Path, tiny_cfg: DictConfig, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``processes=2``: two model systems decode side by side in spawned processes; each gets its own replies,
    the ones it gets in this process (float32: no rounding ties)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    import queryrl.apps.query_rewrite.eval.run as run
    from queryrl.models.loading import resolve_model_path

    folder = resolve_model_path(tiny_cfg.model)
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    model = AutoModelForCausalLM.from_pretrained(other)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.5 * torch.randn_like(param))
    model.save_pretrained(other)
    pooled: list[int] = []
    in_processes = run.answers_in_processes

    def counted(*args: Any, **kwargs: Any) -> Any:
        pooled.append(args[4])
        return in_processes(*args, **kwargs)

    monkeypatch.setattr(run, "answers_in_processes", counted)
    replies: dict[int, dict[str, list[str]]] = {}
    for processes in (1, 2):
        out = tmp_path / f"p{processes}" / "eval.json"
        report = evaluate(
            DATA,
            ["raw_turn", f"tiny={folder}", f"other={other}"],
            out,
            _cfg(),
            max_samples=6,
            batch_size=4,
            max_new_tokens=8,
            n_boot=50,
            cache_dir=str(model_cache),
            processes=processes,
            echo=None,
        )
        assert report["settings"]["processes"] == processes
        rows = _samples(out)
        replies[processes] = {name: [r["systems"][name]["raw"] for r in rows] for name in ("tiny", "other")}
    assert pooled == [2]
    assert replies[2] == replies[1]
    assert replies[1]["tiny"] != replies[1]["other"]
    with pytest.raises(EvalError, match="--processes must be >= 1"):
        evaluate(DATA, ["raw_turn"], tmp_path / "p0" / "eval.json", _cfg(), processes=0, echo=None)


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
    with pytest.raises(EvalError, match=rf"RAG service at {url} does not answer: GET {url}/health: ConnectError"):
        evaluate(
            DATA,
            "raw_turn,reference",
            tmp_path / "eval.json",
            _cfg(f"app.query_rewrite.rag.url={url}", "app.query_rewrite.rag.max_retries=0"),
            max_samples=2,
            cache_dir=str(model_cache),
            echo=None,
        )
    assert not (tmp_path / "eval.json").exists()


def test_openai_judge_without_key_is_a_clear_error(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUERYRL_TEST_NO_SUCH_KEY", raising=False)
    settings = _openai(_closed_port_url() + "/v1", "m", api_key_env="QUERYRL_TEST_NO_SUCH_KEY")
    with pytest.raises(EvalError, match=r"judge API key: .*QUERYRL_TEST_NO_SUCH_KEY"):
        evaluate(
            DATA, "raw_turn", tmp_path / "eval.json", settings, judge=True, max_samples=2, cache_dir=str(model_cache)
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


# --- GPT-5 as the judge; services checked before any model; checkpoints; loud judge failures ---------

JUDGE_KEY = "sk-eval-judge-secret-31415926"


def _rubric_judge(messages: list[dict[str, Any]]) -> str:
    side = {"quality": 12, "relevance": 6, "completeness": 6, "retrieval": 6, "sum": 30}
    return json.dumps({"better": "same", "score": {"8b": side, "32b": side}})


def _unloadable_model(tmp_path: Path) -> Path:
    """A folder that passes parse_systems but fails at loading: reaching it means a check came too late."""
    folder = tmp_path / "not_loadable"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def _checkpoint(run: Path, step: int) -> Path:
    folder = run / "checkpoints" / f"step_{step}"
    (folder / "actor").mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"step": step}))
    (folder / "optim.pt").write_bytes(b"")
    return folder


def test_a_checkpoint_folder_points_to_queryrl_export(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "x"
    _checkpoint(run, 2)
    step = _checkpoint(run, 10)
    with pytest.raises(EvalError) as caught:
        parse_systems(f"grpo={step}")
    message = str(caught.value)
    assert "is a queryrl training checkpoint, not a model folder" in message
    assert f"`queryrl export {step} {run / 'export' / 'step_10'}`" in message
    assert f"then evaluate grpo={run / 'export' / 'step_10'}" in message
    for holder in (run, run / "checkpoints"):  # a run folder, or its checkpoints folder: the latest step
        with pytest.raises(
            EvalError, match=r"holds training checkpoints \(step_2, step_10\).*queryrl export .*step_10"
        ):
            parse_systems(f"grpo={holder}")
    (tmp_path / "stuff").mkdir()
    with pytest.raises(EvalError, match=r"is not a model folder \(no config\.json\)"):
        parse_systems(f"x={tmp_path / 'stuff'}")
    result = runner.invoke(app, ["eval", "--data", DATA, "--systems", str(step), "--out", str(tmp_path / "e.json")])
    assert result.exit_code == 2
    assert "queryrl export" in result.output


def test_services_are_checked_before_any_model_is_loaded(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    systems = f"raw_turn,m={_unloadable_model(tmp_path)}"
    out = tmp_path / "eval.json"
    common: dict[str, Any] = {"max_samples": 2, "cache_dir": str(model_cache), "echo": None}
    monkeypatch.delenv("QUERYRL_TEST_NO_SUCH_KEY", raising=False)
    no_key = _openai("http://127.0.0.1:9/v1", "gpt-5", api_key_env="QUERYRL_TEST_NO_SUCH_KEY")
    with pytest.raises(EvalError, match=r"^judge API key: environment variable QUERYRL_TEST_NO_SUCH_KEY is not set"):
        evaluate(DATA, systems, out, no_key, judge=True, **common)

    gone = _openai(_closed_port_url() + "/v1", "gpt-5", api_key_env=None, max_retries=0)
    with pytest.raises(EvalError, match=r"judge 'gpt-5' at .* does not answer: connection error"):
        evaluate(DATA, systems, out, gone, judge=True, **common)

    app_ = make_judge_app(_rubric_judge, strict=True)
    with running_server(app_) as url:
        cold = _openai(url, "gpt-5", api_key_env=None, temperature=0.0)
        with pytest.raises(EvalError, match=r"a test request failed: HTTP 400: .*'temperature' does not support 0\.0"):
            evaluate(DATA, systems, out, cold, judge=True, **common)
    assert app_.state.stats.requests == 1  # one probe, not one call per sample

    url = _closed_port_url()
    with pytest.raises(EvalError, match=rf"RAG service at {url} does not answer"):
        evaluate(DATA, systems, out, _cfg(f"app.query_rewrite.rag.url={url}"), **common)
    assert not out.exists()


def test_gpt5_judge_from_the_command_line(tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUERYRL_CACHE", str(model_cache))
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", JUDGE_KEY)
    server = make_judge_app(_rubric_judge, strict=True, api_key=JUDGE_KEY, served_models=["gpt-5"])
    out = tmp_path / "eval.json"
    with running_server(server) as url:
        args = ["eval", "--data", DATA, "--systems", "raw_turn,reference", "--out", str(out), "--max-samples", "4"]
        args += ["--bootstrap", "20", "--judge", "openai", "--judge-base-url", url, "--judge-model", "gpt-5"]
        args += ["--judge-api-key-env", "QUERYRL_TEST_JUDGE_KEY", "--judge-reasoning-effort", "minimal"]
        args += ["--judge-max-tokens", "3000", "--judge-extra-body", '{"verbosity": "low"}']
        args += ["app.query_rewrite.judge.price_per_million_input=1.25"]  # your prices: an estimated cost
        args += ["app.query_rewrite.judge.price_per_million_output=10"]
        args += ["app.query_rewrite.judge.intent_check=false"]  # the intent question: test_intent_judge.py
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "checked judge 'gpt-5'" in result.output
    body = server.state.stats.last_body
    assert "temperature" not in body
    assert (body["max_completion_tokens"], body["reasoning_effort"], body["verbosity"]) == (3000, "minimal", "low")
    assert server.state.stats.requests == 1 + 4  # the probe, then one call per sample
    report = json.loads(out.read_text(encoding="utf-8"))
    calls = report["judge_calls"]
    assert {k: calls[k] for k in ("sent", "failed", "first_error")} == {"sent": 4, "failed": 0, "first_error": None}
    # the tokens of the probe and the 4 calls (issue 49: they were only in a training run's metrics.jsonl)
    assert calls["prompt_tokens"] > 4 * 100
    assert isinstance(calls["prompt_tokens"], int)  # a count, not 1234.0
    assert calls["completion_tokens"] > 4 * 10
    assert (calls["reasoning_tokens"], calls["cut_off"]) == (0, 0)
    assert calls["cost"] == pytest.approx((calls["prompt_tokens"] * 1.25 + calls["completion_tokens"] * 10) / 1e6)
    assert f"judge: {calls['prompt_tokens']:.0f} prompt tokens" in result.output
    assert "estimated cost" in result.output
    raw = report["systems"]["raw_turn"]
    assert (raw["tie"], raw["judge_call_failed"], raw["judge_calls"]) == (4, 0, 4)
    settings = report["settings"]
    assert settings["judge_reasoning_effort"] == "minimal"
    assert settings["judge_temperature"] is None
    assert settings["judge_extra_body_keys"] == ["verbosity"]
    assert JUDGE_KEY not in out.read_text(encoding="utf-8") + result.output

    bad = runner.invoke(app, [*args[:-5], "--judge-extra-body", "{verbosity: low}"])
    assert bad.exit_code == 2
    assert "--judge-extra-body: not valid JSON" in bad.output


def test_judge_failures_are_loud_and_all_failed_exits_2(tmp_path: Path, model_cache: Path) -> None:
    out = tmp_path / "eval.json"
    common: dict[str, Any] = {"max_samples": 4, "n_boot": 20, "cache_dir": str(model_cache), "echo": None}
    # the probe passes, then one judge call is refused: a warning with the count and the server's message
    some = make_judge_app(_rubric_judge, chaos=["ok", "400"])
    warnings: list[str] = []
    with running_server(some) as url:  # the intent question (intent_check) is test_intent_judge.py's
        cfg = _openai(url, "m", api_key_env=None, intent_check="false")
        report = evaluate(DATA, "raw_turn", out, cfg, judge=True, warn=warnings.append, **common)
    assert report["judge_calls"]["failed"] == 1
    assert report["systems"]["raw_turn"]["judge_call_failed"] == 1
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: 1 of 4 judge calls failed")
    assert "first error: call failed after 1 attempt(s): HTTP 400: injected fault: bad request" in warnings[0]

    # every call refused after the probe: exit 2, the outputs written all the same
    every = make_judge_app(_rubric_judge, chaos=Chaos(sequence=["ok"], rates={"400": 1.0}))
    out.unlink()
    with running_server(every) as url:
        args = ["eval", "--data", DATA, "--systems", "raw_turn", "--out", str(out), "--max-samples", "4"]
        args += ["--bootstrap", "20", "--judge", "openai", "--judge-base-url", url, "--judge-model", "m"]
        args += ["--judge-api-key-env", "", "app.query_rewrite.judge.intent_check=false"]
        result = runner.invoke(app, args, env={"QUERYRL_CACHE": str(model_cache)})
    assert result.exit_code == 2, result.output
    assert "every judge call failed (4 of 4)" in result.output
    assert "HTTP 400: injected fault: bad request" in result.output
    assert json.loads(out.read_text(encoding="utf-8"))["judge_calls"]["failed"] == 4


def test_judge_settings_from_the_config_file(tmp_path: Path, model_cache: Path) -> None:
    server = make_judge_app(_rubric_judge, strict=True)
    out = tmp_path / "eval.json"
    with running_server(server) as url:
        config = tmp_path / "qr.yaml"
        judge_yaml = (
            f"    judge:\n      backend: openai\n      base_url: {url}\n      model: o3-mini\n      api_key_env: null\n"
            "      reasoning_effort: high\n      max_tokens: 5000\n      extra_body:\n        seed: 7\n"
        )
        config.write_text("app:\n  query_rewrite:\n" + judge_yaml, encoding="utf-8")
        args = ["eval", "--data", DATA, "--systems", "raw_turn", "--out", str(out), "--config", str(config)]
        args += ["--max-samples", "2", "--bootstrap", "20"]
        ok = runner.invoke(app, args, env={"QUERYRL_CACHE": str(model_cache)})
        body = dict(server.state.stats.last_body or {})
        cold = runner.invoke(app, [*args, "--judge-temperature", "0"], env={"QUERYRL_CACHE": str(model_cache)})
    assert ok.exit_code == 0, ok.output
    assert (body["model"], body["reasoning_effort"], body["max_completion_tokens"], body["seed"]) == (
        "o3-mini",
        "high",
        5000,
        7,
    )
    assert "temperature" not in body
    assert cold.exit_code == 2
    assert "'temperature' does not support 0.0 with this model" in cold.output  # the option over the config


# --- one settings object: --config plus dotted overrides, the options as shorthands ----------------------


def test_dotted_overrides_reach_the_report(tmp_path: Path, model_cache: Path) -> None:
    out = tmp_path / "eval.json"
    args = ["eval", "--data", DATA, "--systems", "raw_turn,reference", "--out", str(out), "--max-samples", "6"]
    args += ["--bootstrap", "20", "app.query_rewrite.rag.top_k=10", "app.query_rewrite.judge.backend=offline"]
    result = runner.invoke(app, args, env={"QUERYRL_CACHE": str(model_cache)})
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    assert (report["settings"]["top_k"], report["settings"]["ks"]) == (10, [1, 3, 5, 10])
    assert report["settings"]["judge"] == "offline"  # a dotted judge.backend asks for judging, as --judge does
    assert "recall@10" in report["systems"]["reference"]
    assert report["systems"]["raw_turn"]["judge_n"] == 6


def test_a_bad_dotted_key_is_one_error_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    args = ["eval", "--data", DATA, "--systems", "raw_turn", "--out", str(out), "app.query_rewrite.rag.topk=10"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith(
        "error: override 'app.query_rewrite.rag.topk=10': unknown key 'app.query_rewrite.rag.topk'; "
        "did you mean app.query_rewrite.rag.top_k"
    )
    assert "Traceback" not in result.output
    assert not out.exists()
    clash = runner.invoke(app, [*args[:-1], "--top-k", "5", "app.query_rewrite.rag.top_k=10"])
    assert clash.exit_code == 2
    assert "--top-k and the override 'app.query_rewrite.rag.top_k=10' both set app.query_rewrite.rag.top_k" in (
        clash.output
    )
    wrong_type = runner.invoke(app, [*args[:-1], "app.query_rewrite.rag.top_k=many"])
    assert wrong_type.exit_code == 2
    assert "app.query_rewrite.rag.top_k" in wrong_type.output


def test_the_help_says_dotted_keys_are_accepted() -> None:
    result = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "key.sub=value" in result.output
    assert "dotted keys" in result.output


def test_the_shorthands_are_the_dotted_keys(tmp_path: Path) -> None:
    from queryrl.apps.query_rewrite.eval.settings import load_eval_config

    plain = load_eval_config()  # no config: the app's defaults, no judging, a budget of 64 tokens
    assert (plain.judge, plain.max_new_tokens, plain.cfg.app.query_rewrite.rag.top_k) == (False, 64, 5)
    short = load_eval_config(
        None,
        [],
        judge="openai",
        judge_base_url="http://127.0.0.1:9/v1",
        judge_api_key_env="",
        judge_extra_body='{"verbosity": "low"}',
        top_k=7,
        corpus="sales_demo",
    )
    dotted = load_eval_config(
        None,
        [
            "app.query_rewrite.judge.backend=openai",
            "app.query_rewrite.judge.base_url=http://127.0.0.1:9/v1",
            "app.query_rewrite.judge.api_key_env=null",
            "app.query_rewrite.judge.extra_body.verbosity=low",
            "app.query_rewrite.rag.top_k=7",
            "app.query_rewrite.rag.corpus=sales_demo",
            "app.query_rewrite.rag.url=null",
        ],
    )
    assert (short.judge, dotted.judge) == (True, True)
    assert short.cfg == dotted.cfg
    config = tmp_path / "qr.yaml"
    config.write_text("data:\n  max_response_length: 40\napp:\n  query_rewrite:\n    rag:\n      url: http://r:1\n")
    from_file = load_eval_config(config, ["app.query_rewrite.rag.top_k=9"], corpus="kdconv:kb.json")
    assert from_file.judge  # --config: the app's judge (offline by default), as before
    assert from_file.max_new_tokens == 40
    rag = from_file.cfg.app.query_rewrite.rag
    assert (rag.url, rag.corpus, rag.top_k) == (None, "kdconv:kb.json", 9)  # --corpus: the embedded service
    assert not load_eval_config(config, judge="none").judge
    with pytest.raises(EvalError, match=r"unknown judge 'gpt'; use one of none, offline, openai"):
        load_eval_config(judge="gpt")
    with pytest.raises(EvalError, match=r"--judge-extra-body: expected a JSON object"):
        load_eval_config(judge_extra_body="[1]")


def test_data_without_gold_says_the_retrieval_metrics_were_skipped(tmp_path: Path, model_cache: Path) -> None:
    from queryrl.apps.query_rewrite.demo.data import sales_demo_rows

    rows = [r for r in sales_demo_rows("test") if r["reward_model"]["ground_truth"]["gold_doc_ids"]][:3]
    for row in rows:
        row["reward_model"]["ground_truth"]["gold_doc_ids"] = []  # a conversation log nobody labelled
    data = tmp_path / "unlabelled.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    warnings: list[str] = []
    report = evaluate(
        str(data), "raw_turn", tmp_path / "eval.json", n_boot=20, cache_dir=str(model_cache), echo=None,
        warn=warnings.append,
    )  # fmt: skip
    assert report["systems"]["raw_turn"]["n"] == 0
    assert warnings == [
        f"warning: no row of {data} has gold document ids: Recall@k, MRR and NDCG were skipped (n 0 in the table); "
        "format, abstention and the judge are reported"
    ]
