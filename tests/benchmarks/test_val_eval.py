"""benchmarks/val_eval.py: a finished bench run's final eval repeated on its validation conversations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import val_eval  # benchmarks/val_eval.py (benchmarks/ is on the tests' path: pyproject.toml)


def _finished_run(tmp_path: Path) -> Path:
    """A result JSON whose run folder holds the final eval's settings and a validation file."""
    work = tmp_path / "work"
    (work / "eval").mkdir(parents=True)
    (work / "data").mkdir()
    (work / "data" / "val.parquet").write_bytes(b"PAR1")
    systems = [
        {"name": "raw_turn", "kind": "raw_turn", "path": None},
        {"name": "reference", "kind": "reference", "path": None},
        {"name": "warmup", "kind": "model", "path": "/m/warmup", "vocab_ids": "/m/warmup/vocab_ids.json"},
        {"name": "grpo", "kind": "model", "path": str(work / "grpo"), "vocab_ids": str(work / "ids.json")},
    ]
    settings = {"systems": systems, "corpus": "kdconv:/kb.json", "max_new_tokens": 48, "batch_size": 8}
    settings |= {"processes": 1, "compare": ["grpo:warmup", "grpo:reference"]}
    (work / "eval" / "eval.json").write_text(json.dumps({"settings": settings}))
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"settings": {"args": {"work": str(work)}}, "compute_dtype": "bfloat16"}))
    return result


def test_the_command_repeats_the_final_eval_on_the_validation_rows(tmp_path: Path) -> None:
    result = _finished_run(tmp_path)
    work = tmp_path / "work"
    cmd = val_eval.eval_command(json.loads(result.read_text()), "queryrl")

    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert cmd[:2] == ["queryrl", "eval"]
    assert value("--data") == str(work / "data" / "val.parquet")
    assert value("--out") == str(work / "eval_val" / "eval.json")
    assert value("--systems") == f"raw_turn,reference,warmup=/m/warmup,grpo={work / 'grpo'}"
    assert value("--vocab-ids") == f"warmup=/m/warmup/vocab_ids.json,grpo={work / 'ids.json'}"
    assert (value("--dtype"), value("--max-new-tokens"), value("--corpus")) == ("bfloat16", "48", "kdconv:/kb.json")
    assert value("--compare") == "grpo:warmup,grpo:reference"


def test_a_run_already_evaluated_is_left_as_it_is(tmp_path: Path) -> None:
    result = _finished_run(tmp_path)
    done = tmp_path / "work" / "eval_val" / "eval.json"
    done.parent.mkdir()
    done.write_text("{}")
    before = result.read_text()
    assert val_eval.evaluate(result) is False
    assert result.read_text() == before


def test_a_run_without_a_validation_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _finished_run(tmp_path / "a")
    bad = _finished_run(tmp_path / "b")
    (tmp_path / "b" / "work" / "data" / "val.parquet").unlink()
    assert val_eval.main([str(good), str(bad)]) == 2  # checked before anything is evaluated
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"val_eval: {bad}: its run folder has no ")
    assert "val.parquet" in err
    assert not (tmp_path / "a" / "work" / "eval_val").exists()


def test_a_run_whose_grpo_trained_on_the_validation_conversations_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--grpo-rows val`` trains GRPO on those conversations: they are not held out, so no second eval on them."""
    result = _finished_run(tmp_path)
    record = json.loads(result.read_text())
    record["settings"]["args"]["grpo_rows"] = "val"
    result.write_text(json.dumps(record))
    assert val_eval.main([str(result)]) == 2
    assert "GRPO trained on its validation conversations (--grpo-rows val)" in capsys.readouterr().err
    assert not (tmp_path / "work" / "eval_val").exists()
