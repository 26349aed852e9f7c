"""The published LoRA pair (``benchmarks/published/<name>/``) evaluated again on the held-out rows its
``check.json`` lists, as ``queryrl eval --systems NAME=BASE+ADAPTER[+ADAPTER2]``, against the card's numbers.

Needs the licensed base model (``make real-models``: ``runs/models/gemma3-270m``) and the KdConv travel folder
(``KDCONV_DIR``, else ``../shared/data/kdconv/travel``); skips, saying which is missing, without them. The bench
evaluated merged float32 adapters and these are bf16, evaluated in other batches: a greedy reply may flip on a
rounding tie, so the check allows one row in four to differ, and the mean Recall@5 to move by two rows' worth.
A pair trained with the vocabulary-restricted head (``model.vocab.restrict``) is evaluated with it, as the card's
numbers were: ``check.json``'s ``vocab_ids`` names each system's kept-ids file and the check passes it as
``queryrl eval --vocab-ids`` (the eval adds the evaluated prompts' own tokens, here of the checked rows only).

The unit tests below (no model) check that ``benchmarks/publish_adapters.py`` publishes those files and the option
for a restricted run, and neither for a full-head one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import publish_adapters  # benchmarks/publish_adapters.py (benchmarks/ is on the tests' path: pyproject.toml)
import pytest
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.data.kdconv import kdconv_missing
from queryrl.cli import app
from tests.helpers import KDCONV

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = sorted((REPO / "benchmarks" / "published").glob("*/check.json"))
BASE = REPO / "runs" / "models" / "gemma3-270m"


def test_one_pair_is_published_with_its_card() -> None:
    assert len(PUBLISHED) == 1, f"keep exactly one published pair, found {[str(p.parent) for p in PUBLISHED]}"
    folder = PUBLISHED[0].parent
    for name in ("warmup", "grpo"):
        assert (folder / name / "adapter_config.json").is_file()
        assert (folder / name / "adapter_model.safetensors").is_file()
        config = json.loads((folder / name / "adapter_config.json").read_text(encoding="utf-8"))
        assert not Path(config["base_model_name_or_path"]).is_absolute(), "a path of the machine that made it"
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert "Gemma Terms of Use" in card
    assert "| grpo - reference |" in card
    vocab = json.loads(PUBLISHED[0].read_text(encoding="utf-8")).get("vocab_ids", {})
    for name, file in vocab.items():
        assert (folder / file).is_file(), f"{name} decodes with {file}, which is not published"
        assert f"{name}=DIR/{file}" in card, "the card's command must decode it with the head it was measured with"


def _rows(check: dict[str, Any], tmp: Path) -> Path:
    from queryrl.apps.query_rewrite.data.kdconv_prep import prepare
    from queryrl.data.records import load_records

    fold = tuple(check["fold"]) if check.get("fold") else None  # a --fold run's split, else the seeded one
    prepare(
        KDCONV,
        tmp / "data",
        None,
        check["split_seed"],
        check["history_chars"],
        answer_format=check["answer_format"],
        fold=fold,
        mentions=check.get("mentions", 0),
    )
    wanted = {(r["conversation_id"], r["turn"]) for r in check["rows"]}
    rows = [
        r
        for r in load_records(tmp / "data" / "test.parquet")
        if (r["extra_info"]["conversation_id"], r["extra_info"]["turn"]) in wanted
    ]
    assert len(rows) == len(wanted), "the held-out split no longer holds every checked row"
    out = tmp / "rows.jsonl"
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return out


@pytest.mark.slow
def test_the_published_pair_gives_the_cards_numbers(tmp_path: Path) -> None:
    if not PUBLISHED:
        pytest.skip("no published pair under benchmarks/published/")
    if not (BASE / "config.json").is_file():
        pytest.skip(f"{BASE} is absent: make real-models installs and converts Gemma 3 270M")
    if not (KDCONV / "dev.json").is_file():
        pytest.skip(kdconv_missing(KDCONV / "dev.json"))
    folder = PUBLISHED[0].parent
    check = json.loads(PUBLISHED[0].read_text(encoding="utf-8"))
    data = _rows(check, tmp_path)
    systems = f"warmup={BASE}+{folder / 'warmup'},grpo={BASE}+{folder / 'warmup'}+{folder / 'grpo'}"
    out = tmp_path / "eval.json"
    args = ["eval", "--config", str(REPO / "configs" / "query_rewrite_kdconv.yaml"), "--data", str(data)]
    args += ["--corpus", f"kdconv:{KDCONV / 'kb_travel.json'}", "--dtype", check["dtype"], "--batch-size", "8"]
    args += ["--max-new-tokens", str(check["max_new_tokens"]), "--systems", systems, "--out", str(out)]
    vocab = check.get("vocab_ids", {})  # a restricted-head pair: each system's kept ids, as the bench decoded it
    if vocab:
        args += ["--vocab-ids", ",".join(f"{name}={folder / file}" for name, file in vocab.items())]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    samples = [json.loads(x) for x in (tmp_path / "eval_samples.jsonl").read_text(encoding="utf-8").splitlines()]
    by_key = {(s["conversation_id"], s["turn"]): s for s in samples}
    for name in ("warmup", "grpo"):
        same_query, card_recall, now_recall = 0, 0.0, 0.0
        for row in check["rows"]:
            now = by_key[(row["conversation_id"], row["turn"])]["systems"][name]
            same_query += hashlib.sha256(now["query"].encode("utf-8")).hexdigest() == row[name]["query"]
            card_recall += row[name]["recall@5"]
            now_recall += now["recall@5"]
        n = len(check["rows"])
        assert same_query >= 0.75 * n, f"{name}: {same_query} of {n} queries as published"
        assert abs(now_recall - card_recall) / n <= 2 / n, (
            f"{name}: Recall@5 {now_recall / n} against {card_recall / n}"
        )


def _fake_run(tmp: Path, restricted: bool, files_in_result: bool) -> Path:
    """A bench-real result JSON and its work folder, as much of them as publish_adapters reads: two adapters,
    the eval's samples and report, the GRPO run's config and, for a restricted run, the two kept-ids files."""
    work = tmp / "work"
    for name in ("warmup", "grpo"):
        (work / "adapters" / name).mkdir(parents=True)
        (work / "adapters" / name / "adapter_config.json").write_text('{"base_model_name_or_path": "x"}\n')
        (work / "adapters" / name / "adapter_model.safetensors").write_bytes(b"weights")
    (work / "grpo_run").mkdir()
    (work / "grpo_run" / "config.yaml").write_text("trainer:\n  seed: 7\n")
    (work / "warmup").mkdir()
    kept = {"warmup": work / "warmup" / "vocab_ids.json", "grpo": work / "grpo_run" / "vocab_ids.json"}
    for name, file in kept.items():
        file.write_text(json.dumps({"kept": 3, "ids": [0, 1, 2 if name == "warmup" else 3]}))
    row = {"conversation_id": "dev-0001", "turn": 2, "gold": ["e::a"], "systems": {}}
    row["systems"] = {name: {"recall@5": 1.0, "mrr": 0.5, "query": f"{name} query"} for name in ("warmup", "grpo")}
    (work / "eval").mkdir()
    (work / "eval" / "eval_samples.jsonl").write_text(json.dumps(row) + "\n")
    heads = {"zero_shot": {"head": "full"}}
    for name, file in kept.items():
        heads[name] = {"head": "restricted", "vocab_kept": 3} if restricted else {"head": "full"}
        if restricted and files_in_result:
            heads[name]["vocab_ids"] = str(file)
    systems = [{"name": name, "kind": "model", **head} for name, head in heads.items()]
    if restricted and not files_in_result:  # an older result: only the eval's report names the files
        for system in systems[1:]:
            system["vocab_ids"] = str(kept[system["name"]])
    (work / "eval" / "eval.json").write_text(json.dumps({"settings": {"systems": systems}}))
    args = {"model": str(tmp / "model"), "work": str(work), "out": str(tmp / "r.json"), "seed": 1}
    args |= {"history_chars": 320, "answer_format": "text", "fp32_check": 0, "warmup_rows": 320, "warmup_samples": 0}
    args |= {"sft_target": "gold_entity", "sft_epochs": 2, "grpo_steps": 40, "batch": 4, "n": 4, "lora_rank": 16}
    args |= {"grpo_lora_targets": "q_proj", "restrict_vocab": restricted, "max_response_length": 48, "threads": 1}
    args |= {"eval_samples": 0, "overrides": ["trainer.seed=7"]}
    final = {"grpo": {"n": 1, "recall@5": 1.0, "mrr": 0.5, "ctx_dep_recall@5": 1.0, "intent_kept": 1.0}}
    result = {
        "settings": {"args": args, "eval_heads": heads, "eval_decoding": "greedy"},
        "data": {"rows": {"train": 8, "val": 1, "test": 1}, "conversations": {"train": 4, "val": 1, "test": 1}},
        "compute_dtype": "bfloat16",
        "final_eval": final,
        "comparisons": {},
        "phases": {"grpo": {"per_step": {"zero_std_group_frac_mean": 0.8}}},
        "adapters": {},
        "wall_time_s": 2800.9,
        "machine": {"cores": 2, "cpu": "AMD EPYC", "capability": "AVX512", "native_bf16": True},
    }
    path = tmp / "r.json"
    path.write_text(json.dumps(result))
    return path


@pytest.mark.parametrize("files_in_result", [True, False], ids=["eval_heads", "eval.json"])
def test_a_restricted_run_publishes_its_kept_ids_and_the_option(tmp_path: Path, files_in_result: bool) -> None:
    out = tmp_path / "published"
    assert publish_adapters.main([str(_fake_run(tmp_path, True, files_in_result)), "--out", str(out)]) == 0
    work = tmp_path / "work"
    assert (out / "warmup" / "vocab_ids.json").read_text() == (work / "warmup" / "vocab_ids.json").read_text()
    assert (out / "grpo" / "vocab_ids.json").read_text() == (work / "grpo_run" / "vocab_ids.json").read_text()
    check = json.loads((out / "check.json").read_text())
    assert check["vocab_ids"] == {"warmup": "warmup/vocab_ids.json", "grpo": "grpo/vocab_ids.json"}
    card = (out / "README.md").read_text()
    assert "--vocab-ids warmup=DIR/warmup/vocab_ids.json,grpo=DIR/grpo/vocab_ids.json" in card
    assert "`model.vocab.restrict=true`" in card
    assert "docs/training.md" in card
    assert "decoding them with the full head (without `--vocab-ids`) is not what was measured" in card
    assert "Gemma Terms of Use" in card
    # the command that made the run, from settings.args: its non-default options, none of the defaults
    for option in ("--seed 1", "--fp32-check 0", "--threads 1", "--restrict-vocab", "trainer.seed=7"):
        assert option in card
    assert "--history-chars" not in card
    assert "Split seed 1, GRPO `trainer.seed` 7" in card


def test_a_fold_run_publishes_its_fold_and_the_warm_up_s_turns(tmp_path: Path) -> None:
    path = _fake_run(tmp_path, True, True)
    result = json.loads(path.read_text())
    result["settings"]["args"] |= {"fold": 3, "folds": 10, "seed": 0, "warmup_rows": 2000, "sft_epochs": 1}
    path.write_text(json.dumps(result))
    out = tmp_path / "published"
    assert publish_adapters.main([str(path), "--out", str(out)]) == 0
    check = json.loads((out / "check.json").read_text())
    assert check["fold"] == [3, 10]
    assert check["split_seed"] == 0
    assert check["mentions"] == 0
    card = (out / "README.md").read_text()
    assert "--mentions" not in card
    assert "Fold 3 of 10 (seed 0), GRPO `trainer.seed` 7" in card
    assert "fold 3 tested, fold 4 validated" in card
    assert "LoRA SFT, 1 epoch, on every training turn (8) for the warm-up" in card  # 2000 asked, 8 there
    result["settings"]["args"] |= {"warmup_rows": 4, "sft_epochs": 2}
    path.write_text(json.dumps(result))
    assert publish_adapters.main([str(path), "--out", str(out)]) == 0
    assert "LoRA SFT, 2 epochs, on 4 training turns sampled for the warm-up" in (out / "README.md").read_text()
    result["settings"]["args"].pop("fold")
    path.write_text(json.dumps(result))
    assert publish_adapters.main([str(path), "--out", str(out)]) == 0
    assert json.loads((out / "check.json").read_text())["fold"] is None


def test_a_run_with_a_history_summary_says_so_and_its_eval_command_passes_it(tmp_path: Path) -> None:
    """A ``--mentions N`` run: check.json, the card's data line and its ``queryrl eval`` command all carry N (the
    prompts without the summary are not the ones the adapters were trained and measured on)."""
    path = _fake_run(tmp_path, True, True)
    result = json.loads(path.read_text())
    result["settings"]["args"]["mentions"] = 5
    path.write_text(json.dumps(result))
    out = tmp_path / "published"
    assert publish_adapters.main([str(path), "--out", str(out)]) == 0
    assert json.loads((out / "check.json").read_text())["mentions"] == 5
    card = (out / "README.md").read_text()
    assert "a history summary naming the latest 5 knowledge-base entities" in card
    command = card[card.index("queryrl eval --config") :].split("```")[0]
    assert "--mentions 5 \\" in command


def test_the_card_places_the_run_in_the_grid_that_holds_it(tmp_path: Path) -> None:
    path = _fake_run(tmp_path, True, True)
    ci = {"diff": 0.014, "low": -0.011, "high": 0.041, "group_low": -0.018, "group_high": 0.048}
    runs = [{"split": "fold 0/10", "grpo_seed": g, "result": str(tmp_path / f"r{g}.json"), "grpo_recall@5": x}
            for g, x in ((9, 0.471), (8, 0.497))]  # fmt: skip
    runs.append({"split": "fold 0/10", "grpo_seed": 7, "result": str(path), "grpo_recall@5": 0.509})
    runs.append({"split": "fold 2/10", "grpo_seed": 7, "result": str(tmp_path / "f2.json"), "grpo_recall@5": 0.53})
    pooled = {"runs": 4, "splits": ["fold 0/10", "fold 2/10"], "turns": 336, "grpo_minus_reference": ci}
    pooled |= {"grpo_minus_warmup": ci, "ctx_dep_x_concat_last3": 1.94, "intent_kept_mean_of_runs": 0.96}
    pooled |= {"flat_groups_mean_of_runs": 0.85}
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"runs": runs, "pooled": pooled}))
    out = tmp_path / "published"
    assert publish_adapters.main([str(path), "--out", str(out), "--grid", str(grid)]) == 0
    card = " ".join((out / "README.md").read_text().split())
    assert "This run is one of the 4 runs of" in card
    assert "On fold 0/10 the GRPO seeds reached Recall@5 seed 7 0.509, seed 8 0.497, seed 9 0.471" in card
    assert "GRPO - reference +0.014 [-0.011, +0.041] (over conversations [-0.018, +0.048])" in card
    assert "1.94x concat_last3" in card
    assert "intent kept on 96.0 % of turns and 85 % of GRPO's groups flat" in card
    grid.write_text(json.dumps({"runs": runs[:2], "pooled": pooled}))  # a grid without the run: nothing written
    (out / "README.md").unlink()
    assert publish_adapters.main([str(path), "--out", str(out), "--grid", str(grid)]) == 2
    assert not (out / "README.md").exists()


def test_a_full_head_run_publishes_as_before(tmp_path: Path) -> None:
    out = tmp_path / "published"
    assert publish_adapters.main([str(_fake_run(tmp_path, False, True)), "--out", str(out)]) == 0
    assert not list(out.rglob("vocab_ids.json"))
    assert "vocab_ids" not in json.loads((out / "check.json").read_text())
    card = (out / "README.md").read_text()
    assert "--vocab-ids" not in card
    assert "--no-restrict-vocab" in card
    assert "restricted" not in card


def test_a_run_evaluated_on_its_validation_conversations_shows_them_in_the_card(tmp_path: Path) -> None:
    path = _fake_run(tmp_path, True, True)
    result = json.loads(path.read_text())
    out = tmp_path / "published"
    assert publish_adapters.main([str(path), "--out", str(out)]) == 0
    assert "validation conversations" not in (out / "README.md").read_text()  # a run val_eval.py has not seen
    result["val_eval"] = {"grpo": {"n": 1, "recall@5": 0.25, "mrr": 0.125, "ctx_dep_recall@5": 0.25}}
    pair = {"recall@5": {"diff": 0.25, "low": 0.0, "high": 0.5, "group_low": -0.1, "group_high": 0.6}}
    pair["mrr"] = {"diff": 0.125, "low": 0.0, "high": 0.25, "group_low": -0.05, "group_high": 0.3}
    result["val_comparisons"] = {"grpo-reference": {"a": "grpo", "b": "reference", "n": 1, **pair}}
    path.write_text(json.dumps(result))
    assert publish_adapters.main([str(path), "--out", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert "**On the split's validation conversations** (1 rows;" in card
    assert "| grpo | 1 | 0.250 | 0.125 | 0.250 | - |" in card
    assert "| grpo - reference | 1 | +0.250 [+0.000, +0.500] [-0.100, +0.600] |" in card
