"""Further warm-up rounds for ``benchmarks/real_model.py --warmup-rounds N``: expert iteration on the warmed model.

Round 1 is the bench's warm-up (the targets built from the reference and the gold entity, SFT from the base model).
Each further round r samples the previous round's model on `--round-rows` training turns it has not warmed up on
(the rows after those of the earlier rounds, in the split's shuffled order), `--round-samples` rewrites a turn with no
worked example and the model's own (restricted) head, keeps per turn the sample whose retrieval ranks a gold
document highest and does not change the customer's question (``queryrl warmup --no-reference``: the model's own
rewrites only, unless `--round-reference`), and SFTs the previous model on them for `--round-epochs` epochs.

This is rejection sampling / expert iteration (ReST, Gulcehre et al. 2023; RAFT, Dong et al. 2023) as the second
round of ConvSearch-R1's self-driven warm-up (Zhu et al. 2025): GRPO's groups of four are mostly flat (about 70 % of
them), so a best-of-K pass over fresh turns shows the policy wins GRPO rarely sees before GRPO starts.

The last round's model is always ``WORK/warmup`` (where GRPO starts and what the evals call ``warmup``); the earlier
rounds' models are ``WORK/warmup_r1`` ... Each round's model folder records its round in ``warmup_round.json``, so a
``--warmup-model`` that already has N rounds is used as it is: a grid's GRPO seeds share their split's rounds
(``run_grid.py --warmups-from BASE --own-warmups``). The warm-up adapter the bench publishes of such a run is the last
round's, on the previous round's merged model (its ``adapter_config.json`` names that base).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from queryrl.atomic import atomic_write_text
from queryrl.models.vocab import VOCAB_FILE

ROUND_BATCH = 32  # sequences a generation micro-batch of a further round (4 turns x 8 samples)
ROUND_FILE = "warmup_round.json"  # in a warm-up model folder: which round of warm-up it is


def add_round_args(parser: argparse.ArgumentParser) -> None:
    """The bench's options for further warm-up rounds."""
    parser.add_argument(
        "--warmup-rounds",
        type=int,
        default=1,
        help="warm-up rounds (1: the warm-up alone; 2: then expert iteration on the warmed model, benchmarks/"
        "warmup_rounds.py); with --warmup-model, the rounds that model lacks",
    )
    parser.add_argument("--round-samples", type=int, default=8, help="rewrites sampled a turn in a further round")
    parser.add_argument("--round-rows", type=int, default=320, help="fresh training turns a further round samples")
    parser.add_argument("--round-epochs", type=int, default=1, help="SFT epochs of a further round")
    parser.add_argument(
        "--round-reference",
        action="store_true",
        help="the turn's reference target is a candidate in a further round too (ties go to it)",
    )


def check_round_args(args: argparse.Namespace) -> str | None:
    """One line saying what is wrong with the round options, or None."""
    if args.warmup_rounds < 1:
        return f"--warmup-rounds must be 1 or more, got {args.warmup_rounds}"
    for name in ("round_samples", "round_rows", "round_epochs"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be 1 or more, got {getattr(args, name)}"
    if args.warmup_rows is not None and args.warmup_rows < 1:
        return f"--warmup-rows must be 1 or more, got {args.warmup_rows}"
    if getattr(args, "grpo_rows", "all") == "unseen" and (args.warmup_rows is None or args.warmup_rounds > 1):
        return (
            "--grpo-rows unseen trains GRPO on the turns round 1 of the warm-up leaves out: it needs --warmup-rows "
            "below the training turns and one warm-up round"
        )
    if args.warmup_rounds > 1 and args.warmup_rows is None:  # before the hour of round 1, not after it
        return (
            f"--warmup-rounds {args.warmup_rounds} needs --warmup-rows below the training turns: round 1 takes every "
            "one by default, leaving none for round 2"
        )
    return None


def model_round(folder: Path) -> int:
    """The warm-up round of the model in `folder` (its ``warmup_round.json``; 1 without one)."""
    marker = folder / ROUND_FILE
    return int(json.loads(marker.read_text(encoding="utf-8"))["round"]) if marker.is_file() else 1


def mark_round(folder: Path, record: dict[str, Any]) -> None:
    """Write `record` (with its ``round``) as `folder`'s ``warmup_round.json``."""
    atomic_write_text(folder / ROUND_FILE, json.dumps(record, ensure_ascii=False, indent=1) + "\n")


def round_phase(r: int, rounds: int) -> str:
    """The SFT phase (and model folder) of round `r` of `rounds`: the last is ``warmup``, earlier ``warmup_rR``."""
    return "warmup" if r == rounds else f"warmup_r{r}"


def shuffled(frame: Any, seed: int) -> Any:
    """The training turns in the split's shuffled order: round 1 takes the first `--warmup-rows`, each further round
    the next `--round-rows` (one order, so the rounds' turns never overlap)."""
    return frame.sample(frac=1.0, random_state=seed)


def _first_count(frame: Any, args: argparse.Namespace) -> int:
    """How many training turns round 1 takes: `--warmup-rows`, at most the split's (default: all of them)."""
    return len(frame) if args.warmup_rows is None else min(args.warmup_rows, len(frame))


def first_rows(frame: Any, args: argparse.Namespace) -> Any:
    """Round 1's training turns: the first `--warmup-rows` of the split's shuffled order (default: all of them)."""
    return shuffled(frame, args.seed).head(_first_count(frame, args))


def unseen_rows(frame: Any, args: argparse.Namespace, out: Path) -> Path:
    """The training turns round 1 of the warm-up leaves out (the split's shuffled order after its first
    `--warmup-rows`), written to `out`: GRPO's prompts with ``--grpo-rows unseen``, the same for every GRPO seed of
    a split whether it builds the warm-up or reuses one.

    Raises:
        ValueError: `--warmup-rows` takes every training turn."""
    rows = shuffled(frame, args.seed).iloc[_first_count(frame, args) :]
    if rows.empty:
        raise ValueError(
            f"--grpo-rows unseen: --warmup-rows {args.warmup_rows} takes all {len(frame)} training turns, none is left"
        )
    rows.to_parquet(out, index=False)
    return out


def swapped_rows(frame: Any, kb: Path, seed: int, out: Path) -> Path:
    """One entity-swapped copy of every training turn that names a knowledge-base entity
    (:func:`~queryrl.apps.query_rewrite.data.kdconv_swap.swap_rows`, seeded with the split's seed), written to
    `out`: GRPO's prompts with ``--grpo-rows swapped``. The warm-up learnt the turns with their own names; in a copy
    every name (prompt, history summary and gold labels alike) is another place's that has the gold attributes, so a
    rewrite that recalls the memorised name instead of copying the one the conversation uses retrieves nothing."""
    from queryrl.apps.query_rewrite.data.kdconv import kdconv_corpus
    from queryrl.apps.query_rewrite.data.kdconv_prep import kb_attributes
    from queryrl.apps.query_rewrite.data.kdconv_swap import swap_rows

    copies = swap_rows(frame.to_dict("records"), kb_attributes(kdconv_corpus(kb)), 1, seed)
    if not copies:
        raise ValueError("--grpo-rows swapped: no training turn names a knowledge-base entity, nothing to swap")
    return write_rows(copies, out)


def write_rows(rows: list[dict[str, Any]], out: Path) -> Path:
    """`rows` as a parquet file at `out`, written to a temporary name and renamed."""
    import pandas as pd

    partial = out.with_name(out.name + ".partial")
    pd.DataFrame(rows).to_parquet(partial, index=False)
    partial.replace(out)
    return out


def grpo_rows_file(args: argparse.Namespace, files: dict[str, str], data_dir: Path, kb: Path | None = None) -> str:
    """GRPO's training file: `args.train_file`, else by ``--grpo-rows``: every training turn (``all``), those the
    warm-up leaves out (``unseen``, written to `data_dir`), the validation conversations' turns (``val``), or an
    entity-swapped copy of every training turn (``swapped``, written to `data_dir`; needs the knowledge base `kb`)."""
    if args.train_file is not None:
        return str(args.train_file.resolve())
    if args.grpo_rows in ("unseen", "swapped"):
        import pandas as pd

        frame = pd.read_parquet(files["train"])
        if args.grpo_rows == "unseen":  # the turns the warm-up's SFT never saw (--warmup-rows leaves them out)
            return str(unseen_rows(frame, args, data_dir / "train_grpo_rows.parquet"))
        if kb is None:
            raise ValueError("--grpo-rows swapped needs the knowledge base to swap names from")
        return str(swapped_rows(frame, kb, args.seed, data_dir / "train_grpo_swapped.parquet"))
    return files["val"] if args.grpo_rows == "val" else files["train"]


def round_rows(frame: Any, args: argparse.Namespace, r: int, out: Path) -> Path:
    """Round `r`'s training turns (`r` >= 2): the `--round-rows` rows of `frame` (shuffled with the split's seed, as
    round 1 takes its first `--warmup-rows`) after those of rounds 1 .. r-1, written to `out`.

    Raises:
        ValueError: the training split has no rows left for round `r`."""
    start = _first_count(frame, args) + (r - 2) * args.round_rows
    rows = shuffled(frame, args.seed).iloc[start : start + args.round_rows]
    if rows.empty:
        hint = " (round 1 takes every one unless --warmup-rows is smaller)" if args.warmup_rows is None else ""
        raise ValueError(
            f"warm-up round {r}: the training split's {len(frame)} rows are used up by the earlier rounds{hint}"
        )
    rows.to_parquet(out, index=False)
    return out


def warmup_round_cmd(
    queryrl: str, args: argparse.Namespace, prev: Path, rows: Path, out: Path, kb: Path, dtype: str
) -> list[str]:
    """``queryrl warmup`` of a further round: `prev`'s own samples of `rows`, no worked examples, its kept ids."""
    cmd = [queryrl, "warmup", "--model", str(prev), "--data", str(rows), "--out", str(out), "--dtype", dtype]
    cmd += ["--corpus", f"kdconv:{kb}", "--samples", str(args.round_samples), "--shots", "0"]
    cmd += ["--max-new-tokens", str(args.max_response_length), "--seed", str(args.seed)]
    cmd += ["--batch-size", str(ROUND_BATCH)]  # several turns' samples a decode step: the step's cost is mostly fixed
    if not args.round_reference:
        cmd.append("--no-reference")
    if args.restrict_vocab and (prev / VOCAB_FILE).is_file():
        cmd += ["--vocab-ids", str(prev / VOCAB_FILE)]
    return cmd


def further_rounds(
    args: argparse.Namespace,
    work: Path,
    frame: Any,
    prev: Path,
    kb: Path,
    dtype: str,
    measure: Callable[[str, list[str]], dict[str, Any]],
    sft: Callable[[str, str, Path, int], Path],
    queryrl: str,
) -> Path:
    """Rounds ``model_round(prev) + 1`` .. `args.warmup_rounds` from the warm-up model `prev`; the last round's model
    (`prev` itself when it already has them all)."""
    for r in range(model_round(prev) + 1, args.warmup_rounds + 1):
        rows = round_rows(frame, args, r, work / "data" / f"train_warmup_rows_r{r}.parquet")
        data_dir = work / f"warmup_data_r{r}"
        phase = measure(f"warmup_data_r{r}", warmup_round_cmd(queryrl, args, prev, rows, data_dir, kb, dtype))
        phase["report"] = json.loads((data_dir / "warmup.json").read_text(encoding="utf-8"))
        model = sft(round_phase(r, args.warmup_rounds), str(data_dir / "warmup.parquet"), prev, args.round_epochs)
        mark_round(model, {"round": r, "from": str(prev), "data": str(data_dir / "warmup.parquet")})
        prev = model
    return prev
