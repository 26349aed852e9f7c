"""``benchmarks/warmup_rounds.py``: further warm-up rounds (expert iteration on the warmed model) of the bench."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from queryrl.models.vocab import write_vocab_ids
from tests.helpers import KDCONV, needs_kdconv

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import real_model as bench  # noqa: E402
import warmup_rounds as rounds  # noqa: E402


def _args(*extra: str) -> Any:
    return bench.parse_args(["--model", "m", "--warmup-rows", "4", "--round-rows", "3", *extra])


def test_each_round_samples_fresh_turns_in_the_splits_shuffled_order(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"x": list(range(12))})
    args = _args()
    order = list(frame.sample(frac=1.0, random_state=args.seed)["x"])
    first = list(rounds.first_rows(frame, args)["x"])  # round 1's, as warm_up takes them
    second = pd.read_parquet(rounds.round_rows(frame, args, 2, tmp_path / "r2.parquet"))["x"].tolist()
    third = pd.read_parquet(rounds.round_rows(frame, args, 3, tmp_path / "r3.parquet"))["x"].tolist()
    assert (first, second, third) == (order[:4], order[4:7], order[7:10])
    assert pd.read_parquet(rounds.round_rows(frame, args, 4, tmp_path / "r4.parquet"))["x"].tolist() == order[10:]
    with pytest.raises(ValueError, match="round 5: the training split's 12 rows are used up"):
        rounds.round_rows(frame, args, 5, tmp_path / "r5.parquet")


def test_by_default_round_one_takes_every_training_turn_and_leaves_none_for_round_two(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"x": list(range(12))})
    args = bench.parse_args(["--model", "m"])
    assert args.warmup_rows is None
    assert sorted(rounds.first_rows(frame, args)["x"]) == list(range(12))
    with pytest.raises(ValueError, match=r"round 2: .* unless --warmup-rows is smaller"):
        rounds.round_rows(frame, args, 2, tmp_path / "r2.parquet")
    assert rounds.check_round_args(args) is None
    args.warmup_rounds = 2
    assert "--warmup-rounds 2 needs --warmup-rows below the training turns" in (rounds.check_round_args(args) or "")
    args.warmup_rows = 0
    assert rounds.check_round_args(args) == "--warmup-rows must be 1 or more, got 0"


def test_a_round_samples_the_model_alone_with_its_own_head(tmp_path: Path) -> None:
    prev = tmp_path / "warmup_r1"
    prev.mkdir()
    cmd = rounds.warmup_round_cmd("queryrl", _args(), prev, Path("r.parquet"), Path("out"), Path("kb"), "bfloat16")
    assert cmd[cmd.index("--samples") + 1] == "8"
    assert cmd[cmd.index("--shots") + 1] == "0"
    assert "--no-reference" in cmd
    assert "--vocab-ids" not in cmd  # the model has no kept ids
    write_vocab_ids(prev / "vocab_ids.json", [1, 2, 3])
    cmd = rounds.warmup_round_cmd("q", _args("--round-reference"), prev, Path("r"), Path("o"), Path("k"), "float32")
    assert cmd[cmd.index("--vocab-ids") + 1] == str(prev / "vocab_ids.json")
    assert "--no-reference" not in cmd
    cmd = rounds.warmup_round_cmd("q", _args("--no-restrict-vocab"), prev, Path("r"), Path("o"), Path("k"), "float32")
    assert "--vocab-ids" not in cmd


def _stand_ins(tmp_path: Path) -> tuple[list[Any], Any, Any]:
    calls: list[Any] = []

    def measure(phase: str, cmd: list[str]) -> dict[str, Any]:
        calls.append((phase, cmd))
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "warmup.json").write_text(json.dumps({"kept": 2}))
        return {"wall_s": 0.0}

    def sft(phase: str, files: str, start: Path, epochs: int) -> Path:
        calls.append((phase, files, start, epochs))
        (tmp_path / phase).mkdir()
        return tmp_path / phase

    return calls, measure, sft


def test_further_rounds_train_each_round_from_the_last_and_a_model_with_them_all_is_used_as_it_is(
    tmp_path: Path,
) -> None:
    pd = pytest.importorskip("pandas")
    (tmp_path / "data").mkdir()
    frame = pd.DataFrame({"x": list(range(12))})
    start = tmp_path / "given"
    start.mkdir()  # an earlier run's warm-up: no marker, round 1
    calls, measure, sft = _stand_ins(tmp_path)
    args = _args("--warmup-rounds", "3", "--round-epochs", "2")
    last = rounds.further_rounds(args, tmp_path, frame, start, Path("kb"), "float32", measure, sft, "queryrl")
    assert last == tmp_path / "warmup"
    assert [c[0] for c in calls] == ["warmup_data_r2", "warmup_r2", "warmup_data_r3", "warmup"]
    assert calls[0][1][calls[0][1].index("--model") + 1] == str(start)
    assert calls[1][1:] == (str(tmp_path / "warmup_data_r2" / "warmup.parquet"), start, 2)
    assert calls[2][1][calls[2][1].index("--model") + 1] == str(tmp_path / "warmup_r2")
    assert calls[3][2] == tmp_path / "warmup_r2"
    assert [rounds.model_round(m) for m in (start, tmp_path / "warmup_r2", last)] == [1, 2, 3]
    calls.clear()
    assert rounds.further_rounds(args, tmp_path, frame, last, Path("kb"), "f", measure, sft, "q") == last
    assert calls == []


def _refusal_argv(tmp_path: Path) -> tuple[list[str], Path]:
    """The bench's arguments for a run that must be refused before it touches anything: a model folder, KdConv, and a
    --work folder holding a file the bench would delete if it started; that folder."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep").write_text("x")
    return ["--model", str(model), "--kdconv-dir", str(KDCONV), "--work", str(work)], work


@needs_kdconv("travel/dev.json")  # without KdConv the bench skips before it reads its options
@pytest.mark.parametrize(
    ("option", "value"), [("--warmup-rounds", "0"), ("--round-samples", "0"), ("--round-rows", "0")]
)
def test_bad_round_options_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    argv, work = _refusal_argv(tmp_path)
    assert bench.main([*argv, option, value]) == 2
    assert f"{option} must be 1 or more" in capsys.readouterr().out
    assert (work / "keep").exists()


def test_grpo_on_unseen_rows_takes_the_turns_the_warm_up_leaves_out(tmp_path: Path) -> None:
    """``--grpo-rows unseen``: the split's shuffled order after round 1's --warmup-rows, disjoint from the warm-up's
    turns and together with them every turn; refused without --warmup-rows, with further rounds, or when the warm-up
    takes every turn."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"x": list(range(12))})
    args = _args("--grpo-rows", "unseen")
    assert rounds.check_round_args(args) is None
    warm = list(rounds.first_rows(frame, args)["x"])
    rest = pd.read_parquet(rounds.unseen_rows(frame, args, tmp_path / "g.parquet"))["x"].tolist()
    order = list(frame.sample(frac=1.0, random_state=args.seed)["x"])
    assert (warm, rest) == (order[:4], order[4:])
    args.warmup_rows = 12
    with pytest.raises(ValueError, match="takes all 12 training turns"):
        rounds.unseen_rows(frame, args, tmp_path / "g.parquet")
    assert "--grpo-rows unseen" in (
        rounds.check_round_args(bench.parse_args(["--model", "m", "--grpo-rows", "unseen"])) or ""
    )
    args.warmup_rows, args.warmup_rounds = 4, 2
    assert "one warm-up round" in (rounds.check_round_args(args) or "")


def test_grpo_rows_picks_grpos_training_file(tmp_path: Path) -> None:
    """``--grpo-rows``: every training turn, the unseen ones (written beside the split), or the validation
    conversations' file; a ``--train-file`` wins (the bench refuses it together with ``unseen``/``val``)."""
    pd = pytest.importorskip("pandas")
    train = tmp_path / "train.parquet"
    pd.DataFrame({"x": list(range(12))}).to_parquet(train, index=False)
    files = {"train": str(train), "val": str(tmp_path / "val.parquet")}
    assert rounds.grpo_rows_file(_args(), files, tmp_path) == str(train)
    assert rounds.grpo_rows_file(_args("--grpo-rows", "val"), files, tmp_path) == files["val"]
    unseen = rounds.grpo_rows_file(_args("--grpo-rows", "unseen"), files, tmp_path)
    assert unseen == str(tmp_path / "train_grpo_rows.parquet")
    assert len(pd.read_parquet(unseen)) == 8
    given = tmp_path / "signal.parquet"
    assert rounds.grpo_rows_file(_args("--train-file", str(given)), files, tmp_path) == str(given.resolve())


def test_grpo_on_swapped_rows_renames_every_turn_and_its_gold(tmp_path: Path) -> None:
    """``--grpo-rows swapped``: one entity-swapped copy of each training turn that names a place (prompt and gold
    labels renamed alike, another place with the gold attribute), the same copies for every GRPO seed of a split;
    refused without a knowledge base, and when no turn names a place."""
    pd = pytest.importorskip("pandas")
    names = ("北京故宫", "颐和园", "天坛", "香山公园")
    kb = tmp_path / "kb.json"
    kb.write_text(json.dumps({n: [[n, "地址", f"{n}的地址"], [n, "门票", "免费"]] for n in names}), encoding="utf-8")

    def row(turn: int, text: str, gold: list[str]) -> dict[str, Any]:
        return {
            "prompt": [{"role": "user", "content": text}],
            "reward_model": {"ground_truth": {"gold_doc_ids": gold, "gold_titles": [g.split("::")[0] for g in gold]}},
            "extra_info": {"conversation_id": "dev-0001", "turn": turn},
        }

    train = tmp_path / "train.parquet"
    rows = [row(1, "客服：北京故宫很好。\n当前问题：地址在哪？", ["北京故宫::地址"]), row(3, "你好", [])]
    pd.DataFrame(rows).to_parquet(train, index=False)
    files = {"train": str(train), "val": str(tmp_path / "val.parquet")}
    args = _args("--grpo-rows", "swapped")
    out = rounds.grpo_rows_file(args, files, tmp_path, kb)
    assert out == str(tmp_path / "train_grpo_swapped.parquet")
    (copy,) = pd.read_parquet(out).to_dict("records")  # the turn that names no place has no copy
    (new,) = copy["reward_model"]["ground_truth"]["gold_titles"]
    assert new in names
    assert new != "北京故宫"
    assert copy["reward_model"]["ground_truth"]["gold_doc_ids"][0] == f"{new}::地址"
    assert copy["prompt"][0]["content"] == f"客服：{new}很好。\n当前问题：地址在哪？"
    assert copy["extra_info"]["conversation_id"] == "dev-0001-swap0"
    assert pd.read_parquet(rounds.grpo_rows_file(args, files, tmp_path, kb)).equals(pd.read_parquet(out))
    with pytest.raises(ValueError, match="needs the knowledge base"):
        rounds.grpo_rows_file(args, files, tmp_path)
    pd.DataFrame(rows[1:]).to_parquet(train, index=False)
    with pytest.raises(ValueError, match="no training turn names a knowledge-base entity"):
        rounds.grpo_rows_file(args, files, tmp_path, kb)


@needs_kdconv("travel/dev.json")  # without KdConv the bench skips before it reads its options
@pytest.mark.parametrize("rows", ["unseen", "val", "swapped"])
def test_grpo_rows_refuses_a_train_file_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str
) -> None:
    argv, work = _refusal_argv(tmp_path)
    assert bench.main([*argv, "--warmup-rows", "4", "--grpo-rows", rows, "--pass-rate-rows", "8"]) == 2
    assert f"--grpo-rows {rows} chooses GRPO's rows itself" in capsys.readouterr().out
    assert (work / "keep").exists()
