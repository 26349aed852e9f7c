"""The preflight scores a reply that can score and says which (issue 49, item 2: it printed "scored the first
row: -2", the format floor of an empty reply): the query-rewrite app's reference rewrite of the first row, in
the answer format its prompt asks for; for other rewards the row's ground truth, or an empty reply, named."""

from __future__ import annotations

import json
from pathlib import Path

from queryrl.apps.query_rewrite.demo.data import sales_demo_rows
from queryrl.apps.query_rewrite.preflight import reference_reply, reward_spec, service_checks
from queryrl.apps.query_rewrite.prompts import parse_rewrite
from queryrl.config import load_config
from queryrl.trainer.preflight import run_preflight

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "query_rewrite_demo.yaml"
TOY = REPO / "configs" / "toy_grpo.yaml"


def reward_line(cfg_path: Path, *overrides: str, app: bool = True) -> str:
    cfg = load_config(cfg_path, list(overrides))
    lines: list[str] = []
    run_preflight(cfg, lines.append, *((service_checks(cfg), reward_spec(cfg)) if app else ()))
    return lines[-1]


def test_the_app_scores_the_reference_rewrite_of_the_first_row(tmp_path: Path) -> None:
    line = reward_line(DEMO, f"model.cache_dir={tmp_path}")  # the embedded RAG service and the offline judge
    first = sales_demo_rows("train")[0]["extra_info"]["sft_target"]
    assert f"scored the reference rewrite {first!r} from queryrl's heuristic rewriter" in line
    score = float(line.rsplit(": ", 1)[1])
    assert score > 0  # retrieved and judged; the empty reply scored before got the floors of the mix, -1.5 here


def test_the_reference_rewrite_of_a_row_without_one_is_made_in_its_answer_format() -> None:
    rows = sales_demo_rows("val")
    turn = next(r for r in rows if r["extra_info"]["turn_type"] == "pronoun")
    bare = {**turn, "extra_info": {k: v for k, v in turn["extra_info"].items() if not k.startswith("sft_target")}}
    said, reply = reference_reply(bare)
    assert said.startswith("the reference rewrite '{")
    parsed = parse_rewrite(reply)
    assert parsed is not None
    assert parsed.rewritten_query  # a turn that needs retrieval gets a query
    assert "sft_target" not in bare["extra_info"]  # the row itself is left as it was
    chat = next(r for r in rows if r["extra_info"]["turn_type"] == "chitchat")
    chat = {**chat, "extra_info": {k: v for k, v in chat["extra_info"].items() if not k.startswith("sft_target")}}
    assert json.loads(reference_reply(chat)[1]) == {"rewritten_query": ""}  # small talk: no retrieval


def test_other_rewards_say_which_reply_they_scored(tmp_path: Path) -> None:
    line = reward_line(TOY, f"model.cache_dir={tmp_path}", app=False)
    assert line == (
        "preflight: the built-in reward scored the reply 'hello' (the row's reward_model.ground_truth), on the "
        "first row of builtin://toy_target_string/train: 1"
    )
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"data_source": "mine", "prompt": "hi", "reward_model": {"ground_truth": 7}}) + "\n")
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.5\n")
    line = reward_line(TOY, f"data.train_files=[{data}]", f"reward.function.path={reward}", app=False)
    assert f"scored an empty reply (the row has no string reward_model.ground_truth), on the first row of {data}" in (
        line
    )
