"""benchmarks/pair_systems.py: one system against another over the turns with gold documents, and bad input refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pair_systems as tool  # benchmarks/ is on the tests' path (pyproject.toml)
import pytest


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(a_hits: list[float], b_hits: list[float], b_name: str = "reference") -> list[dict[str, Any]]:
    rows = [
        {
            "last_turn": f"turn {i}",
            "conversation_id": f"c{i // 2}",
            "gold": ["故宫::门票"],
            "systems": {
                "grpo": {"recall@5": a, "mrr": a / 2, "query": "故宫 门票" if a else "门票"},
                b_name: {"recall@5": b, "mrr": b, "query": "门票"},
            },
        }
        for i, (a, b) in enumerate(zip(a_hits, b_hits, strict=True))
    ]
    rows.append({"last_turn": "no gold", "gold": [], "systems": {}})  # left out of the pairing
    return rows


def test_pairs_a_against_b_over_the_turns_with_gold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = _write(tmp_path / "eval_samples.jsonl", _rows([1, 1, 0, 1], [0, 1, 0, 0]))
    out_file = tmp_path / "pair.json"
    assert tool.main([str(samples), "grpo", "reference", "--conversations", "--out", str(out_file)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(out_file.read_text(encoding="utf-8"))
    assert out["n"] == 4
    assert out["conversations"] == 2
    assert out["recall@5"]["diff"] == pytest.approx(0.5)
    assert out["mrr"]["diff"] == pytest.approx(0.75 / 2 - 0.25)
    assert out["names_gold_entity"] == {"a": 3, "b": 0}  # 故宫 is the gold document's entity
    assert out["recall@5"]["conversation_low"] <= 0.5 <= out["recall@5"]["conversation_high"]


def test_b_from_another_eval_of_the_same_turns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _write(tmp_path / "a.jsonl", _rows([1, 1, 1, 1], [0, 0, 0, 0]))
    b = _write(tmp_path / "b.jsonl", _rows([0, 1, 0, 1], [0, 0, 0, 0]))
    assert tool.main([str(a), "grpo", "grpo", "--b-from", str(b)]) == 0
    assert json.loads(capsys.readouterr().out)["recall@5"]["diff"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("other_turns", "do not hold the same turns in the same order"),
        ("no_system", "row 0 has no system 'sft' (it has grpo, reference)"),
        ("absent", "not readable as eval_samples.jsonl"),
        ("no_gold", "no turn with gold documents to pair"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, words: str
) -> None:
    samples = _write(tmp_path / "eval_samples.jsonl", _rows([1, 0], [0, 0]))
    argv = [str(samples), "grpo", "reference"]
    if case == "other_turns":
        other = _rows([1, 0], [0, 0])
        other[1]["last_turn"] = "another turn"
        argv += ["--b-from", str(_write(tmp_path / "other.jsonl", other))]
    elif case == "no_system":
        argv[2] = "sft"
    elif case == "absent":
        argv[0] = str(tmp_path / "absent.jsonl")
    else:
        argv[0] = str(_write(tmp_path / "nogold.jsonl", [{"last_turn": "x", "gold": [], "systems": {}}]))
    assert tool.main([*argv, "--out", str(tmp_path / "pair.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("pair_systems: "), err
    assert words in err, err
    assert not (tmp_path / "pair.json").exists()
