"""benchmarks/real_model.py (``make bench-real``): per-process peak memory, step-time means, the summary,
and its exits without a model or without KdConv (the run itself is the benchmark, not a test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import real_model as bench  # benchmarks/real_model.py (benchmarks/ is on the tests' path: pyproject.toml)

REPO = Path(__file__).resolve().parents[2]


def test_run_measured_reports_that_process_peak_rss(tmp_path: Path) -> None:
    grow = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"  # touch every page: 300 MiB resident
    big = bench.run_measured("big", [sys.executable, "-c", grow], tmp_path / "big.log", {})
    small = bench.run_measured("small", [sys.executable, "-c", "pass"], tmp_path / "small.log", {})
    assert big["peak_rss_mb"] > 300
    assert small["peak_rss_mb"] < 100  # the earlier, bigger child does not leak into this one
    assert big["wall_s"] >= 0


def test_run_measured_raises_with_the_log_tail(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; print('the reason'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"phase boom failed \(exit 3\):\nthe reason"):
        bench.run_measured("boom", cmd, tmp_path / "boom.log", {})


def test_step_timings_are_means_over_steps(tmp_path: Path) -> None:
    rows = [
        {"step": 1, "timing_s/gen": 2.0, "timing_s/update_actor": 4.0, "critic/score/mean": -0.5},
        {"step": 2, "timing_s/gen": 4.0, "timing_s/update_actor": 6.0, "critic/score/mean": 0.25},
        {"step": 3, "timing_s/gen": 3.0, "reward/format/mean": 0.5, "reward/zero_std_group_frac": 1.0},
        {"step": 4, "timing_s/gen": 3.0, "reward/zero_std_group_frac": 0.5, "rollout/identical_group_frac": 0.25},
        {
            "step": 5,
            "timing_s/gen": 3.0,
            "training/rollout_probs_diff_mean": 0.01,
            "training/rollout_probs_diff_max": 0.2,
        },
        {
            "step": 6,
            "timing_s/gen": 3.0,
            "training/rollout_probs_diff_mean": 0.03,
            "training/rollout_probs_diff_max": 0.1,
        },
        {"step": 2, "val/score/mean": 0.1},  # a validation row: no timings
    ]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert bench.step_timings(metrics) == {
        "steps": 6,
        "mean_s": {"gen": 3.0, "update_actor": 5.0},
        "score_mean_per_step": [-0.5, 0.25],
        "format_mean_per_step": [0.5],
        "zero_std_group_frac_per_step": [1.0, 0.5],
        "identical_group_frac_per_step": [0.25],
        "zero_std_group_frac_mean": 0.75,
        "identical_group_frac_mean": 0.25,
        "rollout_probs_diff_mean": 0.02,  # the steps' mean of the gap, and its largest (rollout.quantize=int8)
        "rollout_probs_diff_max": 0.2,
    }
    metrics.write_text(json.dumps(rows[0]) + "\n")  # no step logged the flat groups or the gap: no means
    assert bench.step_timings(metrics)["zero_std_group_frac_mean"] is None
    assert bench.step_timings(metrics)["rollout_probs_diff_max"] is None


def test_max_weight_change_compares_same_named_tensors(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    for name, shift in (("a", 0.0), ("b", 0.25)):
        (tmp_path / name).mkdir()
        save_file(
            {"w": torch.ones(3) + torch.tensor([0.0, shift, 0.0]), "only_" + name: torch.zeros(1)},
            str(tmp_path / name / "model.safetensors"),
        )
    assert bench.max_weight_change(tmp_path / "a", tmp_path / "b") == 0.25
    assert bench.max_weight_change(tmp_path / "a", tmp_path / "a") == 0.0


def test_system_summary_keeps_the_headline_metrics() -> None:
    systems = {
        "zero_shot": {
            "n": 4,
            "recall@5": 0.25,
            "mrr": 0.1,
            "format_ok": 0.5,
            "false_abstain": 0.0,
            "ndcg@5": 0.2,
            "context_dependent": {"n": 3, "recall@5": 1 / 3},
        }
    }
    assert bench.system_summary(systems) == {
        "zero_shot": {
            "n": 4,
            "recall@5": 0.25,
            "mrr": 0.1,
            "format_ok": 0.5,
            "false_abstain": 0.0,
            "ctx_dep_recall@5": 1 / 3,
            "ctx_dep_n": 3,
        }
    }


def test_main_needs_a_model_folder_and_skips_without_kdconv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "real.json"
    assert bench.main(["--model", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "config.json" in capsys.readouterr().out
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    args = ["--model", str(tmp_path / "model"), "--kdconv-dir", str(tmp_path / "absent"), "--out", str(out)]
    assert bench.main(args) == 0
    assert "SKIP: KdConv not found" in capsys.readouterr().out
    assert not out.exists()


def test_warm_up_runs_queryrl_warmup_before_reading_its_report(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    (tmp_path / "data").mkdir()
    train = tmp_path / "data" / "train.parquet"
    pd.DataFrame({"x": list(range(10))}).to_parquet(train)
    args = bench.parse_args(["--model", str(tmp_path), "--warmup-rows", "4", "--warmup-samples", "0"])
    phases: list[str] = []

    def measure(phase: str, cmd: list[str]) -> dict[str, object]:
        phases.append(phase)
        if phase == "warmup_data":  # what `queryrl warmup --out DIR` writes
            out = Path(cmd[cmd.index("--out") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / "warmup.json").write_text(json.dumps({"kept": 3}))
        return {"wall_s": 0.0}

    def sft(phase: str, files: str) -> Path:
        phases.append(phase)
        (tmp_path / phase).mkdir(exist_ok=True)
        return tmp_path / phase

    model, ref = bench.warm_up(args, tmp_path, {"files": {"train": str(train)}}, tmp_path, "float32", measure, sft)
    assert (model, ref, phases) == (tmp_path / "warmup", None, ["warmup_data", "warmup"])
    assert len(pd.read_parquet(tmp_path / "data" / "train_warmup_rows.parquet")) == 4
    assert bench.model_round(model) == 1
    # with a second round to come, round 1's model is warmup_r1 (the last round's is always `warmup`)
    args.warmup_rounds, phases[:] = 2, []
    model, _ = bench.warm_up(args, tmp_path, {"files": {"train": str(train)}}, tmp_path, "float32", measure, sft)
    assert (model, phases) == (tmp_path / "warmup_r1", ["warmup_data", "warmup_r1"])


KDCONV = REPO.parent / "shared" / "data" / "kdconv" / "travel"


@pytest.mark.skipif(not (KDCONV / "dev.json").exists(), reason="KdConv travel is absent")
def test_the_kdconv_test_file_is_read_whole_with_the_benchs_window(tmp_path: Path) -> None:
    """KDCONV_TEST: every turn with gold of the given file, prompted through the bench's default history window
    (the reference's answer as the target, never gold-derived text)."""
    pd = pytest.importorskip("pandas")
    dialogues = json.loads((KDCONV / "dev.json").read_text(encoding="utf-8"))[:3]
    test_file = tmp_path / "test.json"
    test_file.write_text(json.dumps(dialogues, ensure_ascii=False), encoding="utf-8")
    window = bench.parse_args(["--model", str(tmp_path)]).history_chars
    info = bench.external_rows(test_file, KDCONV, tmp_path / "external.parquet", window, "text")
    rows = pd.read_parquet(info["file"])
    assert info["rows"] == len(rows) > 0
    assert rows["extra_info"].map(lambda e: e["conversation_id"]).nunique() == 3  # every dialogue of the file
    windowed = 0
    for _, row in rows.iterrows():
        extra = row["extra_info"]
        assert len(row["reward_model"]["ground_truth"]["gold_doc_ids"]) > 0
        assert extra["contexts"][-1]["content"] in row["prompt"][-1]["content"]
        assert extra["answer_format"] == "text"
        assert not extra["sft_target"].startswith("{")  # the text format: the query itself
        windowed += extra["prompt_messages"] < len(extra["contexts"])
    assert windowed > 0  # long conversations are cut to the window, as the bench's own rows
    assert rows["extra_info"].map(lambda e: e["history_summary"]).eq("").all()  # --mentions 0: no summary
    assert bench.parse_args([]).mentions == 5  # the default since lever 33's four-fold grid (2026-12-07)
    assert bench.parse_args([]).max_response_length == 96  # lever 38: 48 cut the long turns' rewrites
    mentions = bench.external_rows(test_file, KDCONV, tmp_path / "m.parquet", window, "text", mentions=3)
    summaries = pd.read_parquet(mentions["file"])["extra_info"].map(lambda e: e["history_summary"])
    assert summaries.str.startswith("对话中提到过").any()  # --mentions reaches the KDCONV_TEST rows too


def test_the_external_file_gets_the_trained_systems() -> None:
    systems = "raw_turn,concat_last3,reference,zero_shot=/m,warmup=/w/warmup,grpo=/w/grpo,ref_sft=/w/ref_sft"
    compare = f"{bench.COMPARE},warmup:ref_sft,grpo:ref_sft"
    kept, pairs = bench.without_systems(systems, compare, bench.UNTRAINED)
    assert kept == "raw_turn,concat_last3,reference,warmup=/w/warmup,grpo=/w/grpo"
    assert pairs == "grpo:warmup,grpo:concat_last3,grpo:reference"
    assert bench.parse_args(["--external-systems", "all"]).external_systems == "all"
    assert bench.parse_args([]).external_systems == "trained"


def test_grpo_adapts_every_linear_layer_by_default_and_overrides_come_last() -> None:
    """Lever 24's default reaches the train command as one override; a user's own overrides follow (and win)."""
    from queryrl.config import load_config

    settings = bench.grpo_settings(bench.parse_args(["--threads", "1"]), "bfloat16")
    every = "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
    assert every in settings
    assert "trainer.num_threads=1" in settings
    assert "model.compute_dtype=bfloat16" in settings
    cfg = load_config(str(bench.CONFIG), settings)
    assert list(cfg.model.lora.target_modules) == list(bench.GRPO_LORA_TARGETS)
    args = bench.parse_args(["--grpo-lora-targets", "q_proj,v_proj", "actor.lr=3e-4"])
    settings = bench.grpo_settings(args, "float32")
    assert "model.lora.target_modules=[q_proj,v_proj]" in settings
    assert settings[-1] == "actor.lr=3e-4"
    assert not any(s.startswith("model.compute_dtype") for s in settings)
    assert not any(s.startswith("rollout.quantize") for s in settings)  # --rollout-quantize none: the config's
    settings = bench.grpo_settings(bench.parse_args(["--rollout-quantize", "int8", "--threads", "1"]), "float32")
    assert "rollout.quantize=int8" in settings
    assert load_config(str(bench.CONFIG), settings).rollout.quantize == "int8"


def test_evals_generate_their_models_one_process_a_thread_unless_told() -> None:
    """``queryrl eval --processes``: as many as ``--threads`` by default, ``--eval-processes`` when given."""

    def processes(argv: list[str]) -> str:
        cmd = bench._eval_cmd("queryrl", "d.parquet", Path("kb.json"), bench.parse_args(argv), "bfloat16", 0)
        return cmd[cmd.index("--processes") + 1]

    assert processes(["--threads", "2"]) == "2"
    assert processes(["--threads", "1"]) == "1"
    assert processes(["--threads", "2", "--eval-processes", "1"]) == "1"


def test_sft_dtype_reaches_the_warm_up_sft_as_its_compute_dtype(tmp_path: Path) -> None:
    """``--sft-dtype`` (default float32, every measured warm-up's): bfloat16 becomes ``model.compute_dtype`` over the
    float32 weights, a valid config; float32 passes nothing; ``auto`` resolves as ``--dtype auto`` does."""
    from queryrl.config import load_config
    from queryrl.machine import auto_dtype

    def compute(argv: list[str]) -> list[str]:
        cmd = bench.sft_cmd("queryrl", bench.parse_args(argv), tmp_path / "m", "w.parquet", tmp_path, "warmup")
        return [c for c in cmd if c.startswith("model.compute_dtype=")]

    assert bench.parse_args([]).sft_dtype == "float32"
    assert compute([]) == []
    assert compute(["--sft-dtype", "bfloat16"]) == ["model.compute_dtype=bfloat16"]
    assert compute(["--sft-dtype", "auto"]) == (
        [] if auto_dtype() == "float32" else [f"model.compute_dtype={auto_dtype()}"]
    )
    cmd = bench.sft_cmd("queryrl", bench.parse_args(["--sft-dtype", "bfloat16"]), tmp_path / "m", "w", tmp_path, "x")
    overrides = [c for c in cmd[4:] if not c.startswith(("model.path=", "sft.train_files="))]
    cfg = load_config(str(bench.CONFIG), overrides).model
    assert (cfg.dtype, cfg.compute_dtype) == ("float32", "bfloat16")


def test_restrict_vocab_reaches_the_warm_up_sft_and_the_trained_systems_evals(tmp_path: Path) -> None:
    """``--restrict-vocab`` (the default): the SFT command trains with the restricted head (a valid config), and the
    evals decode warmup / ref_sft / grpo with their kept ids (a warm-up without its own: the GRPO run's), only where
    the eval has that system; off, nothing changes."""
    from queryrl.config import load_config
    from queryrl.models.vocab import VOCAB_FILE

    on, off = bench.parse_args(["--restrict-vocab"]), bench.parse_args(["--no-restrict-vocab"])
    assert bench.parse_args([]).restrict_vocab is True  # the default since the three-split grid (2026-12-06)
    cmd = bench.sft_cmd("queryrl", on, tmp_path / "m", "w.parquet", tmp_path, "warmup")
    assert cmd[-1] == "model.vocab.restrict=true"
    overrides = [c for c in cmd[4:] if not c.startswith(("model.path=", "sft.train_files="))]
    assert load_config(str(bench.CONFIG), overrides).model.vocab.restrict is True
    assert not any("model.vocab" in c for c in bench.sft_cmd("queryrl", off, tmp_path / "m", "w", tmp_path, "warmup"))

    run, warm, ref = tmp_path / "grpo_run", tmp_path / "warmup", tmp_path / "ref_sft"
    for folder in (run, warm, ref):
        folder.mkdir()
    (run / VOCAB_FILE).write_text("{}")
    (warm / VOCAB_FILE).write_text("{}")
    assert bench.trained_vocab(False, {"warmup": warm}, run) == {}
    vocab = bench.trained_vocab(True, {"warmup": warm, "ref_sft": ref}, run)
    assert vocab == {"warmup": warm / VOCAB_FILE, "ref_sft": run / VOCAB_FILE, "grpo": run / VOCAB_FILE}
    systems = f"raw_turn,zero_shot=/m,warmup={warm},grpo=/w/grpo"
    assert bench.vocab_option(vocab, systems) == ["--vocab-ids", f"warmup={warm / VOCAB_FILE},grpo={run / VOCAB_FILE}"]
    assert bench.vocab_option(vocab, "raw_turn,zero_shot=/m") == []
    assert bench.vocab_option({}, systems) == []


def _bench_argv(tmp_path: Path) -> list[str]:
    """``--model``, ``--kdconv-dir`` and ``--work`` of a bench that the argument checks stop before it runs."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    kdconv = tmp_path / "kdconv"
    kdconv.mkdir()
    (kdconv / "dev.json").write_text("[]")
    (kdconv / "kb_travel.json").write_text("{}")
    return ["--model", str(tmp_path / "model"), "--kdconv-dir", str(kdconv), "--work", str(tmp_path / "work")]


def test_a_train_file_must_exist_outside_the_work_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _bench_argv(tmp_path)
    inside = tmp_path / "work" / "data" / "train_signal.parquet"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"PAR1")
    for train_file in (tmp_path / "absent.parquet", inside):  # missing, or in the folder the bench empties first
        assert bench.main([*base, "--train-file", str(train_file), "--out", str(tmp_path / "r.json")]) == 2
        assert "--train-file must be a parquet file outside --work" in capsys.readouterr().out
    assert inside.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--warmup-swaps", "-1"], "--warmup-swaps must be 0 or more"),
        (["--fold", "10"], "--fold must be 0 to --folds - 1 with --folds 3 or more"),
        (["--fold", "-1"], "--fold must be 0 to --folds - 1 with --folds 3 or more"),
        (["--fold", "0", "--folds", "2"], "--fold must be 0 to --folds - 1 with --folds 3 or more"),
        (["--mentions", "-1"], "--mentions must be 0 (no history summary) or more, got -1"),
    ],
    ids=["negative-swaps", "fold-past-the-folds", "negative-fold", "two-folds", "negative-mentions"],
)
def test_a_bad_option_is_refused_before_the_work_folder_is_emptied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    argv = _bench_argv(tmp_path)
    kept = tmp_path / "work" / "kept.txt"
    kept.parent.mkdir()
    kept.write_text("an earlier run")
    assert bench.main([*argv, *options, "--out", str(tmp_path / "r.json")]) == 2
    assert message in capsys.readouterr().out
    assert kept.read_text() == "an earlier run"
