"""benchmarks/kdconv.py's stages and goal: what each stage is given (recorded, not run) and the goal's verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kdconv as bench  # benchmarks/kdconv.py (benchmarks/ is on the tests' path: pyproject.toml)
import pytest

from queryrl.apps.query_rewrite.data.kdconv import kdconv_missing

REPO = Path(__file__).resolve().parents[2]


def test_goal_ratio_and_verdict() -> None:
    systems = {
        "grpo": {"context_dependent": {"recall@5": 0.5}},
        "concat_last3": {"context_dependent": {"recall@5": 0.2}},
    }
    goal = bench.goal(systems)
    assert goal["met"]
    assert goal["ratio"] == pytest.approx(2.5)
    assert not bench.goal({**systems, "grpo": {"context_dependent": {"recall@5": 0.3}}})["met"]
    assert bench.goal({})["ratio"] is None
    assert not bench.goal({})["met"]


def test_main_skips_without_kdconv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "kdconv.json"
    assert bench.main(["--kdconv-dir", str(tmp_path / "absent"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == f"SKIP: {kdconv_missing(tmp_path / 'absent' / 'dev.json')}\n"
    for said in ("github.com/thu-coai/KdConv", "Apache-2.0", "set KDCONV_DIR to its travel folder"):
        assert said in printed
    assert not out.exists()


def test_main_names_the_absent_kdconv_test_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "travel").mkdir()
    (tmp_path / "travel" / "dev.json").write_text("[]", encoding="utf-8")
    monkeypatch.setenv("KDCONV_TEST", str(tmp_path / "test.json"))
    assert bench.main(["--kdconv-dir", str(tmp_path / "travel"), "--out", str(tmp_path / "k.json")]) == 2
    printed = capsys.readouterr().err
    assert printed == kdconv_missing(tmp_path / "test.json", "KDCONV_TEST") + "\n"
    assert "github.com/thu-coai/KdConv" in printed
    assert printed.strip().endswith("set KDCONV_TEST to the file")


def test_main_passes_the_augmented_rows_to_sft_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "travel"
    src.mkdir()
    (src / "dev.json").write_text("[]", encoding="utf-8")
    (src / "kb_travel.json").write_text("{}", encoding="utf-8")
    prepared: list[dict[str, object]] = []
    commands: dict[str, list[str]] = {}

    def fake_prepare(*args: object, **kwargs: object) -> dict[str, object]:
        prepared.append(kwargs)
        files = {name: str(tmp_path / f"{name}.parquet") for name in ("train", "val", "test")}
        if kwargs.get("augment"):
            files["train_aug"] = str(tmp_path / "train_aug.parquet")
        return {"files": files, "rows": {}, "conversations": {}, "augment": {"copies": kwargs.get("augment")}}

    def fake_run_stage(name: str, cmd: list[str], log: Path, timings: dict[str, float]) -> None:
        commands[name] = cmd

    monkeypatch.setattr(bench, "prepare", fake_prepare)
    monkeypatch.setattr(bench, "run_stage", fake_run_stage)
    argv = ["--kdconv-dir", str(src), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "r.json")]
    with pytest.raises(FileNotFoundError, match="checkpoint"):  # no GRPO ran: it stops before the export
        bench.main([*argv, "--augment", "3", "--sft-prompt-loss", "1.0", "sft.lr=0.001"])
    assert prepared[-1]["augment"] == 3
    sft, grpo = commands["sft"], commands["grpo"]
    aug = str(tmp_path / "train_aug.parquet")
    assert f"sft.train_files=[{tmp_path / 'train.parquet'},{aug}]" in sft
    assert "sft.prompt_loss_weight=1.0" in sft
    assert sft[-1] == "sft.lr=0.001"  # the user's overrides come last and win
    assert not any(aug in part for part in grpo)
    assert f"data.train_files=[{tmp_path / 'train.parquet'}]" in grpo
    assert not any(part.startswith("sft.") and part != "sft.lr=0.001" for part in grpo)

    commands.clear()
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        bench.main(argv)
    assert prepared[-1]["augment"] == 0
    assert not any("train_aug" in part or part.startswith("sft.train_files") for part in commands["sft"])
    assert "sft.prompt_loss_weight=0.0" in commands["sft"]
    with pytest.raises(SystemExit):
        bench.main([*argv, "--augment", "-1"])


def test_main_passes_the_extra_rows_to_sft_only_and_the_tokenizer_flag_to_every_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "kdconv"
    for domain in ("travel", "film", "music"):
        (root / domain).mkdir(parents=True)
        for name in ("dev.json", "test.json"):
            (root / domain / name).write_text("[]", encoding="utf-8")
    (root / "travel" / "kb_travel.json").write_text("{}", encoding="utf-8")
    data = tmp_path / "data"
    prepared: list[dict[str, object]] = []
    commands: dict[str, list[str]] = {}

    def fake_prepare(*args: object, **kwargs: Any) -> dict[str, object]:
        prepared.append(kwargs)
        files = {name: str(data / f"{name}.parquet") for name in ("train", "val", "test")}
        if kwargs.get("augment"):
            files["train_aug"] = str(data / "train_aug.parquet")
        domains = list(kwargs.get("extra_sft") or ())
        section: dict[str, object] = {"domains": domains}
        if domains:
            files["extra"] = str(data / "extra.parquet")
            section |= {"file": files["extra"], "rows": 7, "sources": {f"{d}/dev.json": {"rows": 7} for d in domains}}
        return {"files": files, "rows": {}, "conversations": {}, "augment": {}, "extra_sft": section}

    def fake_run_stage(name: str, cmd: list[str], log: Path, timings: dict[str, float]) -> None:
        commands[name] = cmd
        if name == "eval":
            metrics = {"recall@5": 0.2, "mrr": 0.1, "format_ok": 1.0, "context_dependent": {"recall@5": 0.2}}
            out = Path(cmd[cmd.index("--out") + 1])
            out.parent.mkdir(parents=True, exist_ok=True)
            report = {"eval_file": "test.parquet", "systems": {"concat_last3": metrics, "grpo": metrics}}
            out.write_text(json.dumps(report), encoding="utf-8")

    monkeypatch.setattr(bench, "prepare", fake_prepare)
    monkeypatch.setattr(bench, "run_stage", fake_run_stage)
    monkeypatch.setattr(bench, "last_checkpoint", lambda run_dir: run_dir / "checkpoints" / "step_1")
    monkeypatch.delenv("KDCONV_TEST", raising=False)
    work, result = tmp_path / "work", tmp_path / "r.json"
    argv = ["--kdconv-dir", str(root / "travel"), "--work", str(work), "--out", str(result)]
    train, extra, aug = (str(data / f"{n}.parquet") for n in ("train", "extra", "train_aug"))

    assert bench.main([*argv, "--extra-sft", "film,music"]) == 0
    assert prepared[-1]["extra_sft"] == ("film", "music")
    sft, grpo, evaluate = commands["sft"], commands["grpo"], commands["eval"]
    assert f"sft.train_files=[{train},{extra}]" in sft
    for cmd in (grpo, evaluate, commands["export"]):
        assert not any(extra in part for part in cmd)  # GRPO, its validation and the test never see them
    assert f"data.train_files=[{train}]" in grpo
    assert f"data.val_files=[{data / 'val.parquet'}]" in grpo
    # without --tokenizer-extra the tokenizer is trained on the training rows only, in every stage
    assert f"model.tiny.corpus_datasets=[{train}]" in sft
    assert f"model.tiny.corpus_datasets=[{train}]" in grpo
    bench_json = json.loads(result.read_text(encoding="utf-8"))["bench"]
    assert bench_json["extra_sft"]["domains"] == ["film", "music"]
    assert bench_json["extra_sft"]["file"] == extra
    assert bench_json["extra_sft"]["sources"] == {"film/dev.json": {"rows": 7}, "music/dev.json": {"rows": 7}}
    assert bench_json["tokenizer_datasets"] == [train]

    # --tokenizer-extra: the SFT-only files join the tokenizer's corpus on every stage's command line;
    # the evaluation loads the SFT and GRPO model folders, whose tokenizer that is
    assert bench.main([*argv, "--extra-sft", "music", "--augment", "2", "--tokenizer-extra"]) == 0
    tokenizer = f"model.tiny.corpus_datasets=[{train},{aug},{extra}]"
    assert tokenizer in commands["sft"]
    assert tokenizer in commands["grpo"]
    assert f"sft={work / 'sft'},grpo={work / 'grpo'}" in commands["eval"][commands["eval"].index("--systems") + 1]
    assert f"sft.train_files=[{train},{aug},{extra}]" in commands["sft"]
    assert not any(extra in part or aug in part for part in commands["grpo"] if "corpus_datasets" not in part)
    assert json.loads(result.read_text(encoding="utf-8"))["bench"]["tokenizer_datasets"] == [train, aug, extra]
    # default: no extra rows
    assert bench.main(argv) == 0
    assert prepared[-1]["extra_sft"] == ()
    assert not any("extra.parquet" in part for part in commands["sft"])

    # a bad domain: one clear message, before anything runs
    capsys.readouterr()
    calls = len(prepared)
    with pytest.raises(SystemExit):
        bench.main([*argv, "--extra-sft", "film,travel"])
    err = capsys.readouterr().err
    assert err.count("unknown KdConv domain 'travel'") == 1
    assert "choose from film, music" in err
    with pytest.raises(SystemExit):  # nothing to add to the tokenizer
        bench.main([*argv, "--tokenizer-extra"])
    assert "give --extra-sft or --augment" in capsys.readouterr().err
    # a missing domain folder: named, exit 2, nothing prepared
    (root / "music" / "dev.json").unlink()
    (root / "music" / "test.json").unlink()
    (root / "music").rmdir()
    assert bench.main([*argv, "--extra-sft", "film,music"]) == 2
    assert f"--extra-sft: {kdconv_missing(root / 'music', None)} (" in capsys.readouterr().err
    assert len(prepared) == calls
