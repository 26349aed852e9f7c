"""KdConv travel benchmark: SFT + GRPO query rewriter vs the baselines (``make bench-kdconv``).

    python benchmarks/kdconv.py                      # -> benchmarks/results/kdconv.json
    KDCONV_TEST=path/to/test.json python benchmarks/kdconv.py
    python benchmarks/kdconv.py --sft-steps 200 --grpo-steps 20   # a quick run
    python benchmarks/kdconv.py --augment 8 --sft-prompt-loss 1.0  # SFT on 8 entity-swapped copies too

Pipeline (the ``make demo`` pipeline on KdConv, config ``configs/query_rewrite_kdconv.yaml``):

1. Data. The conversations of ``$KDCONV_DIR/dev.json`` (default ``../shared/data/kdconv/travel``)
   are split by conversation id (seeded): 80 % train, 10 % validation, 10 % held-out test. Both
   speakers ask (:func:`~queryrl.apps.query_rewrite.data.kdconv.load_kdconv_conversations` with
   ``both_speakers``); only turns whose reply uses the knowledge base are kept. The policy's prompt
   shows the most recent history only (at most ``--history-chars`` characters of earlier messages, at
   least the previous one) so that it fits ``data.max_prompt_length``; ``extra_info.contexts`` keeps
   the whole conversation, which the baselines and the reference rewriter see. The SFT target
   (``--sft-target``) is by default ``reference``: the entity-aware reference rewriter's answer on the
   prompt's history (KB entity names as a jieba dictionary, :class:`~queryrl.rag.HeuristicRewriter`
   with ``latin_entities=False``); ``gold`` builds it from the training row's gold documents
   (:func:`~.kdconv_targets.gold_query`: the gold entity when the prompt shows it, the turn, the gold attributes).
   Test rows never carry gold-derived text.

   ``--augment K`` (default 0: off) adds K entity-swapped copies of each *training* dialogue
   (:func:`~.kdconv_prep.augment_dialogues`): every knowledge-base entity the dialogue mentions (in its messages, found
   longest first so that 北京故宫 is not read as 故宫, or in its ``attrs``) is replaced everywhere in it
   (messages, ``attrs`` names and values, so the gold ``entity::attribute`` becomes
   ``new_entity::attribute``) by another KB entity, drawn with a seeded ``random.Random`` and, where one
   exists, having the attributes the dialogue uses. The copies go through the same rows, window and SFT
   target (the reference's answer on the swapped history) into ``train_aug.parquet``, which only
   ``queryrl sft`` reads (``sft.train_files``): the tiny model sees many more entity names to copy from
   the history. GRPO keeps ``train.parquet``, so its reward never gets a gold id the corpus lacks; the
   tokenizer (``model.tiny.corpus_datasets``) is trained on ``train.parquet`` only unless
   ``--tokenizer-extra``. Validation and test rows are never augmented. ``--sft-prompt-loss W`` passes
   ``sft.prompt_loss_weight=W`` to SFT.

   ``--extra-sft film,music`` (default off) adds the conversations of KdConv's other domains, ``dev.json``
   and ``test.json`` of ``film/`` and ``music/`` beside the travel folder (:func:`~.kdconv_prep.extra_sft_rows`): their
   turns with gold documents, with their own domain line, the same window and SFT target, the reference
   rewriter knowing that file's entity names (the ``attrs`` names, :func:`~.kdconv_prep.attr_entity_names`; those
   domains have no knowledge base here), into ``extra.parquet``, which like ``train_aug.parquet`` only
   ``queryrl sft`` reads (their gold ids are not in the travel corpus): more diverse conversation text
   with the same kind of target. ``--tokenizer-extra`` also trains the tokenizer on the SFT-only files
   (``train_aug`` and ``extra``: ``model.tiny.corpus_datasets`` of every stage that builds a model; the
   evaluation loads the SFT and GRPO folders, which carry that tokenizer).
2. ``queryrl sft``, ``queryrl train`` (GRPO from the SFT model against the embedded RAG over the
   knowledge base, corpus ``kdconv:KB``), ``queryrl export`` of the last checkpoint.
3. ``queryrl eval`` on the held-out conversations, or on the KdConv file named by ``KDCONV_TEST``
   (all its conversations), with raw_turn, concat_last3, reference, sft and grpo.

Output: ``benchmarks/results/kdconv.json`` (written atomically), the eval JSON (``systems``,
``eval_file``, ...) plus ``bench`` (settings, augmentation, extra SFT rows, tokenizer data, data sizes,
wall time per stage) and ``goal``: GRPO's Recall@5 on the context-dependent turns against twice
concat_last3's. The numbers are what the evaluation measured, met or not. Without the KdConv folder
the bench prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from common import DEFAULT_KDCONV_DIR
from common import kdconv_dir as travel_dir

from queryrl.apps.query_rewrite.data.kdconv import kdconv_missing
from queryrl.apps.query_rewrite.data.kdconv_prep import (  # the data step, in the app
    GOLD_TARGETS,
    SFT_ONLY,
    extra_sft_sources,
    kb_name,
    parse_domains,
    prepare,
)

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "query_rewrite_kdconv.yaml"
RESULTS = REPO / "benchmarks" / "results" / "kdconv.json"
WORK = REPO / "runs" / "bench_kdconv"
GOAL_FACTOR = 2.0
SYSTEMS = ("raw_turn", "concat_last3", "reference", "sft", "grpo")


# --- pipeline -------------------------------------------------------------------------------------


def run_stage(name: str, cmd: list[str], log: Path, timings: dict[str, float]) -> None:
    """Run `cmd` in the repo (output to `log` and a short tail on failure); record its wall time."""
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as f:
        proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=_env(), check=False)
    timings[name] = round(time.perf_counter() - start, 1)
    print(f"[{name}] {timings[name]:.0f} s (log: {log})", flush=True)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
        raise RuntimeError(f"stage {name} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    return env


def last_checkpoint(run_dir: Path) -> Path:
    """The ``checkpoints/step_N`` folder with the largest N."""
    steps = sorted((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    if not steps:
        raise FileNotFoundError(f"{run_dir}/checkpoints: no step_* checkpoint")
    return steps[-1]


def goal(systems: dict[str, Any]) -> dict[str, Any]:
    """GRPO's context-dependent Recall@5 against concat_last3's (met: at least :data:`GOAL_FACTOR` times)."""

    def ctx(name: str) -> float | None:
        value = (systems.get(name) or {}).get("context_dependent", {}).get("recall@5")
        return None if value is None else float(value)

    grpo, base = ctx("grpo"), ctx("concat_last3")
    ratio = grpo / base if grpo is not None and base else None
    return {
        "ctx_dep_recall@5": {"grpo": grpo, "concat_last3": base},
        "ratio": ratio,
        "target_ratio": GOAL_FACTOR,
        "met": ratio is not None and ratio >= GOAL_FACTOR,
    }


def atomic_write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=2)
            f.write("\n")
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def table(systems: dict[str, Any]) -> str:
    """Recall@5 / MRR overall and on the context-dependent turns, one line per system."""
    lines = [f"{'system':<14}{'R@5':>8}{'MRR':>8}{'ctx R@5':>10}{'ctx MRR':>10}{'format':>8}"]
    for name, m in systems.items():
        dep = m.get("context_dependent") or {}
        lines.append(
            f"{name:<14}{m.get('recall@5', float('nan')):>8.3f}{m.get('mrr', float('nan')):>8.3f}"
            f"{dep.get('recall@5', float('nan')):>10.3f}{dep.get('mrr', float('nan')):>10.3f}"
            f"{m.get('format_ok', float('nan')):>8.3f}"
        )
    return "\n".join(lines)


def sft_only_files(files: Mapping[str, str]) -> list[str]:
    """The prepared files that only ``queryrl sft`` reads (:data:`SFT_ONLY` present in `files`)."""
    return [files[name] for name in SFT_ONLY if name in files]


def sft_overrides(files: Mapping[str, str], prompt_loss_weight: float) -> list[str]:
    """The overrides only ``queryrl sft`` gets: the prompt-loss weight and, when `files` has SFT-only rows
    (``train_aug``, ``extra``), the SFT data: the training rows and those. GRPO keeps ``data.train_files``
    (the original rows, whose gold documents are all in the corpus)."""
    out = [f"sft.prompt_loss_weight={prompt_loss_weight}"]
    if extra := sft_only_files(files):
        out.append(f"sft.train_files=[{','.join([files['train'], *extra])}]")
    return out


def tokenizer_datasets(files: Mapping[str, str], with_sft_only: bool) -> list[str]:
    """``model.tiny.corpus_datasets``: the training rows and, with `with_sft_only`, the SFT-only files."""
    return [files["train"], *(sft_only_files(files) if with_sft_only else [])]


def _domains_arg(text: str) -> tuple[str, ...]:
    try:
        return parse_domains(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--kdconv-dir", type=Path, default=travel_dir(), help=f"default: $KDCONV_DIR, else {DEFAULT_KDCONV_DIR}"
    )
    parser.add_argument("--work", type=Path, default=WORK, help="run folder (wiped first)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=0, help="the split's seed")
    parser.add_argument("--history-chars", type=int, default=160, help="earlier-message characters in the prompt")
    parser.add_argument(
        "--sft-target",
        choices=("reference", *GOLD_TARGETS),
        default="reference",
        help="SFT targets: the entity-aware reference rewriter's answers, or built from the gold documents",
    )
    parser.add_argument(
        "--augment",
        type=_non_negative_int,
        default=0,
        metavar="K",
        help="K entity-swapped copies of each training dialogue (train_aug.parquet), for SFT only; 0: none",
    )
    parser.add_argument(
        "--sft-prompt-loss",
        type=float,
        default=0.0,
        metavar="W",
        help="sft.prompt_loss_weight: SFT also learns the prompt tokens with weight W (0: the target only)",
    )
    parser.add_argument(
        "--extra-sft",
        type=_domains_arg,
        default=(),
        metavar="DOMAINS",
        help="KdConv domains beside travel (film,music) whose dev and test conversations become SFT-only rows "
        "(extra.parquet); default: none",
    )
    parser.add_argument(
        "--tokenizer-extra",
        action="store_true",
        help="train the tokenizer (model.tiny.corpus_datasets) on the SFT-only files too (train_aug, extra)",
    )
    parser.add_argument("--sft-steps", type=int, default=None, help="default: the config's sft.max_steps")
    parser.add_argument("--grpo-steps", type=int, default=None, help="default: the config's trainer.total_steps")
    parser.add_argument("overrides", nargs="*", help="extra config overrides (key=value) for sft and train")
    args = parser.parse_args(argv)
    if args.tokenizer_extra and not (args.extra_sft or args.augment):
        parser.error(
            "--tokenizer-extra adds the SFT-only files to the tokenizer's corpus: give --extra-sft or --augment"
        )

    kdconv_dir: Path = args.kdconv_dir
    if not (kdconv_dir / "dev.json").exists():
        print(f"SKIP: {kdconv_missing(kdconv_dir / 'dev.json')}")
        return 0
    try:
        extra_sft_sources(Path(os.path.abspath(kdconv_dir)).parent, args.extra_sft)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    test_env = os.environ.get("KDCONV_TEST")
    test_file = Path(test_env) if test_env else None
    if test_file is not None and not test_file.exists():
        print(kdconv_missing(test_file, "KDCONV_TEST"), file=sys.stderr)
        return 2
    kb = kdconv_dir / kb_name(kdconv_dir)

    work: Path = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    data = prepare(
        kdconv_dir,
        work / "data",
        test_file,
        args.seed,
        args.history_chars,
        sft_target=args.sft_target,
        augment=args.augment,
        extra_sft=args.extra_sft,
    )
    timings["prepare"] = round(time.perf_counter() - start, 1)
    print(f"[prepare] rows {data['rows']}, conversations {data['conversations']}", flush=True)
    if args.augment:
        print(f"[prepare] augmentation {data['augment']}", flush=True)
    if args.extra_sft:
        print(f"[prepare] extra SFT rows {data['extra_sft']}", flush=True)

    files = data["files"]
    tokenizer = tokenizer_datasets(files, args.tokenizer_extra)  # every stage: one tokenizer
    settings = [
        *([f"sft.max_steps={args.sft_steps}"] if args.sft_steps is not None else []),
        *([f"trainer.total_steps={args.grpo_steps}"] if args.grpo_steps is not None else []),
        *args.overrides,
    ]
    common = [
        f"trainer.output_dir={work.parent}",
        f"trainer.experiment_name={work.name}",
        f"model.tiny.corpus_datasets=[{','.join(tokenizer)}]",
        f"data.train_files=[{files['train']}]",
        f"data.val_files=[{files['val']}]",
        f"app.query_rewrite.rag.corpus=kdconv:{kb}",
    ]
    sft_settings = sft_overrides(files, args.sft_prompt_loss)  # before the user's overrides, which win
    queryrl = str(Path(sys.executable).parent / "queryrl")
    logs = work / "logs"
    sft = [queryrl, "sft", "--config", str(CONFIG), *common, *sft_settings, *settings]
    run_stage("sft", sft, logs / "sft.log", timings)
    train = [queryrl, "train", "--config", str(CONFIG), *common, *settings]
    train += [f"model.path={work / 'sft'}", "trainer.resume=disable"]
    run_stage("grpo", train, logs / "grpo.log", timings)
    export = [queryrl, "export", str(last_checkpoint(work)), str(work / "grpo")]
    run_stage("export", export, logs / "export.log", timings)
    eval_json = work / "eval" / "eval.json"
    systems = f"raw_turn,concat_last3,reference,sft={work / 'sft'},grpo={work / 'grpo'}"
    evaluate = [queryrl, "eval", "--config", str(CONFIG), "--data", files["test"], "--systems", systems]
    evaluate += ["--corpus", f"kdconv:{kb}", "--out", str(eval_json)]
    run_stage("eval", evaluate, logs / "eval.log", timings)
    timings["total"] = round(time.perf_counter() - start, 1)

    report = json.loads(eval_json.read_text(encoding="utf-8"))
    report["eval_file"] = str(test_file) if test_file is not None else report["eval_file"]
    report["goal"] = goal(report["systems"])
    report["bench"] = {
        "config": str(CONFIG.relative_to(REPO)),
        "kdconv_dir": str(kdconv_dir),
        "test": "KDCONV_TEST" if test_file is not None else "held-out dev conversations (10 %)",
        "eval_rows_file": files["test"],
        "split_seed": args.seed,
        "history_chars": args.history_chars,
        "sft_target": args.sft_target,
        "overrides": settings,
        "sft_overrides": sft_settings,
        "sft_prompt_loss_weight": args.sft_prompt_loss,
        "augment": data["augment"],
        "extra_sft": data["extra_sft"],
        "tokenizer_datasets": tokenizer,
        "rows": data["rows"],
        "conversations": data["conversations"],
        "wall_time_s": timings,
        "cpu_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    atomic_write_json(args.out, report)

    print(table(report["systems"]))
    g = report["goal"]
    grpo, base = g["ctx_dep_recall@5"]["grpo"], g["ctx_dep_recall@5"]["concat_last3"]
    verdict = "MET" if g["met"] else "NOT met"
    ratio = "n/a" if g["ratio"] is None else f"{g['ratio']:.2f}x"
    print(
        f"goal {verdict}: grpo context-dependent Recall@5 {grpo:.3f} vs concat_last3 {base:.3f} = {ratio} "
        f"(target {GOAL_FACTOR:.1f}x, i.e. >= {GOAL_FACTOR * (base or 0):.3f})"
    )
    print(f"wall time {timings['total']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
