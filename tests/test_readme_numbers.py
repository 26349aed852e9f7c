"""Every number README states about speed and learning, tied to the results file it comes from.

Each row of :data:`CLAIMS` is a README phrase with ``{}`` holes and, per hole, a results JSON file (under the
repository), a function of its content and a format. The test renders each phrase from the files and finds it in
README (line breaks read as spaces): a changed result or an edited README number fails. A second test checks that
every number in README's results paragraphs lies inside a rendered phrase or is listed in :data:`UNTIED` with the
reason it cannot be tied to a file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SEEDS = "benchmarks/results/demo_seeds.json"
TOY = "benchmarks/results/demo_toy.json"
GPU = "benchmarks/results/gpu_check.json"
GRID = "benchmarks/results/seed_grid.json"
GRID24 = "benchmarks/results/seed_grid_lever24.json"
GRIDR = "benchmarks/results/seed_grid_restricted.json"  # today's defaults: the restricted head
GRIDV = "benchmarks/results/seed_grid_restricted_val.json"  # the same runs on the validation conversations
GRIDB = "benchmarks/results/seed_grid_restricted_both.json"  # test and validation pooled
VOCAB_S0 = "experiments/results/seed_grid_vocab_s0.json"  # restricted against full head, split 0, paired seeds
VOCAB_STEP = "benchmarks/results/vocab_head.json"
GRIDM = "experiments/results/seed_grid_mentwarm_4folds.json"  # today's defaults: levers 33 + 34, 4 folds x 3 seeds
GRIDMV = "experiments/results/seed_grid_mentwarm_4folds_val.json"  # the same runs on the validation conversations
GRIDMB = "experiments/results/seed_grid_mentwarm_4folds_both.json"  # test and validation pooled
GRIDW = "experiments/results/seed_grid_warmall_g789.json"  # the previous defaults: lever 34 on the same folds
MACHINES = [
    ("experiments/results/grid_warmall_amd_fold{}of10_g7.json", "experiments/results/grid_warmall_fold{}of10_g7.json")
]
B96 = "experiments/results/budget96/"  # lever 38: the defaults' 12 models decoded with 96 tokens instead of 48
B96_GAIN = [f"{B96}warmup_96_vs_48.json", *(f"{B96}grpo_g{s}_96_vs_48.json" for s in (7, 8, 9))]
B96_REF = [f"{B96}grpo_g{s}_96_vs_reference.json" for s in (7, 8, 9)]
B96_EVALS = [f"{B96}eval96_fold{k}of10.json" for k in (0, 2, 3, 4)]
B96_VAL = [f"{B96}val_eval96_fold{k}of10.json" for k in (0, 2, 3, 4)]
M48 = "experiments/results/grid_mentwarm_amd_fold0of10_g7.json"  # one of the 12 runs decoded again with 96 tokens
GRID96 = "experiments/results/seed_grid_defaults96_g789.json"  # the 96-token defaults from scratch, 4 folds x 3 seeds
PUB = "experiments/results/grid_defaults96_amd_fold0of10_g7.json"  # the run of the published adapters
OLDPUB = "experiments/results/real_model_bf16_vocab_g7_s1.json"  # a run of the three seeded splits
Hole = tuple[str, Callable[[Any], Any], str]  # file, value of its JSON, format


@cache
def load(rel: str) -> Any:
    return json.loads((REPO / rel).read_text(encoding="utf-8"))


def runs_of(d: Any, pair: str, metric: str, key: str) -> list[float]:
    return [r["comparisons"][pair][metric][key] for r in d["runs"]]


def lo(pair: str, metric: str, key: str) -> Callable[[Any], float]:
    return lambda d: min(runs_of(d, pair, metric, key))


def hi(pair: str, metric: str, key: str) -> Callable[[Any], float]:
    return lambda d: max(runs_of(d, pair, metric, key))


def at(*keys: str) -> Callable[[Any], Any]:
    def get(d: Any) -> Any:
        for k in keys:
            d = d[int(k)] if isinstance(d, list) else d[k]
        return d

    return get


def diff_ci(file: str, *keys: str) -> list[Hole]:
    """``{} [{}, {}]``: a paired difference and its interval, signed to 3 decimals."""
    return [(file, at(*keys, k), "+.3f") for k in ("diff", "low", "high")]


def over(files: list[str], pick: Callable[..., float], key: str) -> Callable[[Any], float]:
    """`pick` (min or max) of ``recall@5[key]`` over the pair files `files` (``benchmarks/pair_systems.py --out``)."""
    return lambda _: pick(load(f)["recall@5"][key] for f in files)


def least_intent_96(files: list[str]) -> Callable[[Any], float]:
    """The lowest share of turns with the question kept over the 12 GRPO runs decoded with 96 tokens in the eval
    summaries `files` (one a fold), in %."""
    return lambda _: (
        100 * min(v["intent_kept"] for f in files for k, v in load(f)["systems"].items() if k.startswith("grpo"))
    )


def goals_met(d: Any) -> int:
    names = ("above_warmup_conversations", "ctx_dep_2x_concat_last3", "ctx_dep_at_least_reference", "intent_kept_95")
    return sum(all(r["goals"][g] for g in names) for r in d["runs"])


def split_range(split: int) -> Callable[[Any], tuple[float, float]]:
    def get(d: Any) -> tuple[float, float]:
        values = [r["grpo_recall@5"] for r in d["runs"] if r["split"] == split]
        return min(values), max(values)

    return get


def max_seed_spread(d: Any) -> float:
    """The largest range of GRPO Recall@5 over the GRPO seeds of one split (each end rounded as README shows it)."""
    return max(round(split_range(s)(d)[1], 3) - round(split_range(s)(d)[0], 3) for s in {r["split"] for r in d["runs"]})


def checks_passed(d: Any) -> int:
    """The gpu-check's parts whose ``ok`` is true."""
    return sum(isinstance(v, dict) and v.get("ok") is True for v in d.values())


def wall_minutes(d: Any) -> list[float]:
    return [r["wall_s"]["total"] / 60 for r in d["runs"]]


def grpo_seed(d: Any) -> int:
    """A bench-real run's GRPO seed: its ``trainer.seed=`` override."""
    return int(next(o.split("=", 1)[1] for o in d["settings"]["args"]["overrides"] if o.startswith("trainer.seed=")))


def ctx_dep_x(d: Any) -> float:
    """A bench-real run's GRPO context-dependent Recall@5 over concat_last3's."""
    return d["final_eval"]["grpo"]["ctx_dep_recall@5"] / d["final_eval"]["concat_last3"]["ctx_dep_recall@5"]


def half_minutes(seconds: float) -> str:
    return {1: "half a minute", 2: "a minute"}.get(round(seconds / 30), f"{seconds / 60:.0f} minutes")


def fold_turns(pick: Callable[..., int]) -> Callable[[Any], int]:
    return lambda d: pick(v["turns"] for v in d["pooled_by_split"].values())


def folds_above_reference(d: Any) -> str:
    """How many folds have GRPO - reference's interval over conversations above 0, in words ("no" for none)."""
    n = sum(v["grpo_minus_reference"]["group_low"] > 0 for v in d["pooled_by_split"].values())
    return "no" if n == 0 else str(n)


def folds_under_97(d: Any) -> int:
    """Folds whose runs keep the intent on under 97 % of turns, on average over the fold's GRPO seeds."""
    return sum(v["intent_kept_mean_of_runs"] < 0.97 for v in d["pooled_by_split"].values())


def machine_warmup_gap(_: Any) -> float:
    """The largest warm-up Recall@5 gap between the AMD and the Intel run of one fold (folds 2 and 4)."""
    recall = [[load(f.format(k))["final_eval"]["warmup"]["recall@5"] for f in MACHINES[0]] for k in (2, 4)]
    return max(abs(a - b) for a, b in recall)


CLAIMS: list[tuple[str, list[Hole]]] = [
    # What `make demo` shows (demo_seeds.json, 3 runs)
    ("About {} minutes of one CPU thread", [(SEEDS, lambda d: min(wall_minutes(d)), ".0f")]),
    ("({}-{} min a seed in `make bench-demo-seeds`", [(SEEDS, lambda d: min(wall_minutes(d)), ".0f"),
                                                     (SEEDS, lambda d: max(wall_minutes(d)), ".0f")]),
    ("Over seeds {}-{}", [(SEEDS, at("runs", "0", "seed"), "d"), (SEEDS, at("runs", "-1", "seed"), "d")]),
    ("({} user turns, {} with gold documents)", [(SEEDS, lo("grpo-sft", "intent_kept", "n"), ".0f"),
                                                  (SEEDS, lo("grpo-sft", "recall@5", "n"), ".0f")]),
    ("| | range over the {} seeds |", [(SEEDS, lambda d: len(d["runs"]), "d")]),
    ("| MRR: SFT start / GRPO / reference pipeline | {}-{} / {}-{} / {} |", [
        (SEEDS, lo("grpo-sft", "mrr", "b"), ".3f"), (SEEDS, hi("grpo-sft", "mrr", "b"), ".3f"),
        (SEEDS, lo("grpo-sft", "mrr", "a"), ".3f"), (SEEDS, hi("grpo-sft", "mrr", "a"), ".3f"),
        (SEEDS, hi("grpo-reference", "mrr", "b"), ".3f")]),
    ("| GRPO - SFT, MRR | {} to {}, each interval above 0 |", [
        (SEEDS, lo("grpo-sft", "mrr", "diff"), "+.3f"), (SEEDS, hi("grpo-sft", "mrr", "diff"), "+.3f")]),
    ("| GRPO - reference, MRR | {} to {}: below on {} seeds (intervals below 0), above on {} |", [
        (SEEDS, lo("grpo-reference", "mrr", "diff"), "+.3f"), (SEEDS, hi("grpo-reference", "mrr", "diff"), "+.3f"),
        (SEEDS, lambda d: sum(h < 0 for h in runs_of(d, "grpo-reference", "mrr", "high")), "d"),
        (SEEDS, lambda d: sum(x > 0 for x in runs_of(d, "grpo-reference", "mrr", "diff")), "d")]),
    ("| Recall@5: SFT start / GRPO / reference | {}-{} / {}-{} / {} |", [
        (SEEDS, lo("grpo-sft", "recall@5", "b"), ".3f"), (SEEDS, hi("grpo-sft", "recall@5", "b"), ".3f"),
        (SEEDS, lo("grpo-sft", "recall@5", "a"), ".3f"), (SEEDS, hi("grpo-sft", "recall@5", "a"), ".3f"),
        (SEEDS, at("summary", "recall@5_mean", "reference"), ".3f")]),
    ("| GRPO - SFT, Recall@5 | {} to {}, each interval above 0 |", [
        (SEEDS, lo("grpo-sft", "recall@5", "diff"), "+.3f"), (SEEDS, hi("grpo-sft", "recall@5", "diff"), "+.3f")]),
    ("| GRPO - SFT, intent kept | {} to {} (seed {}'s interval crosses 0) |", [
        (SEEDS, lo("grpo-sft", "intent_kept", "diff"), "+.3f"), (SEEDS, hi("grpo-sft", "intent_kept", "diff"), "+.3f"),
        (SEEDS, lambda d: next(r["seed"] for r in d["runs"]
                               if r["comparisons"]["grpo-sft"]["intent_kept"]["low"] < 0), "d")]),
    ("beats the reference pipeline on one seed of {}", [(SEEDS, lambda d: len(d["runs"]), "words")]),
    # make demo-toy (demo_toy.json)
    ("about {}: {} s in `make bench-demo-toy`", [(TOY, lambda d: half_minutes(d["wall_s"]["median"]), "s"),
                                                (TOY, at("wall_s", "median"), ".0f")]),
    # What has run where: gpu-check (gpu_check.json)
    ("(peak {} GiB allocated)", [(GPU, at("memory_8b", "peak_allocated_gib"), ".1f")]),
    ("all {} checks pass", [(GPU, checks_passed, "words")]),
    # the pretrained model, today's defaults (levers 33 + 34 on four folds, seed_grid_mentwarm_4folds.json)
    ("cross-validation folds (each fold's conversations held out, {}-{} turns a fold) and three GRPO seeds per fold "
     "({} runs, {} turns;", [(GRIDM, fold_turns(min), "d"), (GRIDM, fold_turns(max), "d"),
                             (GRIDM, at("pooled", "runs"), "d"), (GRIDM, at("pooled", "turns"), ",d")]),
    ("GRPO reaches {} Recall@5 and is **above the reference pipeline**, {} [{}, {}], over conversations [{}, {}] "
     "(MRR {}, over conversations [{}, {}]), with an interval over conversations above zero on {} fold of the 4", [
        (GRIDM, at("pooled", "grpo_recall@5"), ".3f"), *diff_ci(GRIDM, "pooled", "grpo_minus_reference"),
        (GRIDM, at("pooled", "grpo_minus_reference", "group_low"), "+.3f"),
        (GRIDM, at("pooled", "grpo_minus_reference", "group_high"), "+.3f"),
        (GRIDM, at("pooled", "grpo_minus_reference_mrr", "diff"), "+.3f"),
        (GRIDM, at("pooled", "grpo_minus_reference_mrr", "group_low"), "+.3f"),
        (GRIDM, at("pooled", "grpo_minus_reference_mrr", "group_high"), "+.3f"), (GRIDM, folds_above_reference, "s")]),
    ("on the folds' validation conversations, which no phase reads, {} (over conversations [{}, {}]), and test and "
     "validation pooled ({} turns) {} (over conversations [{}, {}])", [
        (GRIDMV, at("pooled", "grpo_minus_reference", "diff"), "+.3f"),
        (GRIDMV, at("pooled", "grpo_minus_reference", "group_low"), "+.3f"),
        (GRIDMV, at("pooled", "grpo_minus_reference", "group_high"), "+.3f"),
        (GRIDMB, at("pooled", "turns"), ",d"), (GRIDMB, at("pooled", "grpo_minus_reference", "diff"), "+.3f"),
        (GRIDMB, at("pooled", "grpo_minus_reference", "group_low"), "+.3f"),
        (GRIDMB, at("pooled", "grpo_minus_reference", "group_high"), "+.3f")]),
    ("It is not above its own warm-up ({} [{}, {}])", diff_ci(GRIDM, "pooled", "grpo_minus_warmup")),
    ("lifted the warm-up by {} over the previous defaults' (over conversations [{}, {}]) and GRPO by {} (over "
     "conversations [{}, {}])", [
        (GRIDM, at("against", "pooled", "warmup_lever_minus_baseline", "diff"), "+.3f"),
        (GRIDM, at("against", "pooled", "warmup_lever_minus_baseline", "group_low"), "+.3f"),
        (GRIDM, at("against", "pooled", "warmup_lever_minus_baseline", "group_high"), "+.3f"),
        (GRIDM, at("against", "pooled", "lever_minus_baseline", "diff"), "+.3f"),
        (GRIDM, at("against", "pooled", "lever_minus_baseline", "group_low"), "+.3f"),
        (GRIDM, at("against", "pooled", "lever_minus_baseline", "group_high"), "+.3f")]),
    ("GRPO reaches {}x concat_last3 on context-dependent turns, keeps the customer's question on {} % of turns (the "
     "mean of the runs; {} folds are under 97 %), and {} % of its groups are flat", [
        (GRIDM, at("pooled", "ctx_dep_x_concat_last3"), ".2f"),
        (GRIDM, lambda d: 100 * d["pooled"]["intent_kept_mean_of_runs"], ".1f"), (GRIDM, folds_under_97, "words"),
        (GRIDM, lambda d: 100 * d["pooled"]["flat_groups_mean_of_runs"], ".0f")]),
    ("The previous defaults on the same folds were level with the reference ({} [{}, {}])",
     diff_ci(GRIDW, "pooled", "grpo_minus_reference")),
    ("where the same fold's warm-up differs by up to {} Recall@5", [(GRIDW, machine_warmup_gap, ".3f")]),
    ("Those runs decoded at most {} tokens a reply, which cut the rewrites of long turns; decoded with {} (lever 38, "
     "now the default budget), the same {} models gain {} to {} Recall@5, every interval over conversations above "
     "zero, GRPO is above the reference by {} to {} for each GRPO seed (over conversations, lower ends {} to {};", [
        (M48, at("settings", "args", "max_response_length"), "d"),
        (B96_EVALS[0], at("settings", "max_new_tokens"), "d"), (GRIDM, at("pooled", "runs"), "d"),
        (B96_GAIN[0], over(B96_GAIN, min, "diff"), "+.3f"), (B96_GAIN[0], over(B96_GAIN, max, "diff"), "+.3f"),
        (B96_REF[0], over(B96_REF, min, "diff"), "+.3f"), (B96_REF[0], over(B96_REF, max, "diff"), "+.3f"),
        (B96_REF[0], over(B96_REF, min, "conversation_low"), "+.3f"),
        (B96_REF[0], over(B96_REF, max, "conversation_low"), "+.3f")]),
    ("every run keeps the question on at least {} % of its test turns ({} % of the validation turns at the lowest)", [
        (B96_EVALS[0], least_intent_96(B96_EVALS), ".1f"), (B96_VAL[0], least_intent_96(B96_VAL), ".1f")]),
    # the previous defaults on three seeded splits (seed_grid_restricted.json), and the restricted head against the full
    ("per split ({} runs; `benchmarks/seed_grid.py`", [(GRIDR, at("pooled", "runs"), "d")]),
    ("({}-{} held-out turns each)", [(GRIDR, lambda d: min(v["turns"] for v in d["pooled_by_split"].values()), "d"),
                                     (GRIDR, lambda d: max(v["turns"] for v in d["pooled_by_split"].values()), "d")]),
    ("above its warm-up by {} Recall@5 [{}, {}] (over conversations [{}, {}]), reaches {}x concat_last3", [
        *diff_ci(GRIDR, "pooled", "grpo_minus_warmup"),
        (GRIDR, at("pooled", "grpo_minus_warmup", "group_low"), "+.3f"),
        (GRIDR, at("pooled", "grpo_minus_warmup", "group_high"), "+.3f"),
        (GRIDR, at("pooled", "ctx_dep_x_concat_last3"), ".2f")]),
    ("is level with the reference pipeline ({} [{}, {}] over all turns; above it on split 2 only) and keeps the "
     "customer's question on {} % of turns (today's intent check); on split 1 it is not above its warm-up "
     "({} [{}, {}])", [
        *diff_ci(GRIDR, "pooled", "grpo_minus_reference"),
        (GRIDR, lambda d: 100 * d["pooled"]["intent_kept_mean_of_runs"], ".1f"),
        *diff_ci(GRIDR, "pooled_by_split", "1", "grpo_minus_warmup")]),
    ("On each split's {} validation conversations, which no phase reads and no lever was chosen on "
     "(`benchmarks/val_eval.py`), the same runs are {} above the reference; test and validation pooled ({} turns), "
     "GRPO is above it by {} Recall@5 with an interval over conversations of [{}, {}] (MRR {} [{}, {}];", [
        (OLDPUB, at("data", "conversations", "val"), "d"),
        (GRIDV, at("pooled", "grpo_minus_reference", "diff"), "+.3f"),
        (GRIDB, at("pooled", "turns"), ",d"), (GRIDB, at("pooled", "grpo_minus_reference", "diff"), "+.3f"),
        (GRIDB, at("pooled", "grpo_minus_reference", "group_low"), "+.3f"),
        (GRIDB, at("pooled", "grpo_minus_reference", "group_high"), "+.3f"),
        (GRIDB, at("pooled", "grpo_minus_reference_mrr", "diff"), "+.3f"),
        (GRIDB, at("pooled", "grpo_minus_reference_mrr", "group_low"), "+.3f"),
        (GRIDB, at("pooled", "grpo_minus_reference_mrr", "group_high"), "+.3f")]),
    ("restricted minus full head is {} [{}, {}] over three paired GRPO seeds", [
        *diff_ci(VOCAB_S0, "against", "pooled", "lever_minus_baseline")]),
    ("(lever 24, {} runs, earlier code, `benchmarks/results/seed_grid_lever24.json`) reached {} Recall@5 pooled "
     "against {}; a GRPO step is {}x faster in bf16", [
        (GRID24, at("pooled", "runs"), "d"), (GRID24, at("pooled", "grpo_recall@5"), ".3f"),
        (GRIDR, at("pooled", "grpo_recall@5"), ".3f"),
        (VOCAB_STEP, at("summary", "bfloat16", "speedup", "step"), ".2f")]),
    # before lever 24: attention-only adapters (seed_grid.json), and the lever against them
    ("({} runs, four GRPO seeds per split", [(GRID, lambda d: len(d["runs"]), "d")]),
    ("{} [{}, {}] above the warm-up, {}x, level with the reference at {} [{}, {}], {} of {} runs", [
        *diff_ci(GRID, "pooled", "grpo_minus_warmup"), (GRID, at("pooled", "ctx_dep_x_concat_last3"), ".2f"),
        *diff_ci(GRID, "pooled", "ctx_dep_grpo_minus_reference"), (GRID, goals_met, "d"),
        (GRID, lambda d: len(d["runs"]), "d")]),
    # today's defaults from scratch, 4 folds x 3 GRPO seeds (seed_grid_defaults96_g789.json)
    ("Run from scratch with {} tokens a reply on four of the ten cross-validation folds x three GRPO seeds ({} runs, "
     "{} turns;", [(PUB, at("settings", "args", "max_response_length"), "d"), (GRID96, at("pooled", "runs"), "d"),
                   (GRID96, at("pooled", "turns"), "d")]),
    ("GRPO reaches {} Recall@5, **{} above the reference pipeline** (over conversations [{}, {}]; MRR {}, over "
     "conversations [{}, {}]), keeps the question on {}-{} % of each fold's turns (the mean of its runs), and is **not "
     "above its own warm-up**: {} (over conversations [{}, {}]; above it on {} fold of the {}, with an interval across "
     "zero); {} % of its groups are flat", [
        (GRID96, at("pooled", "grpo_recall@5"), ".3f"), (GRID96, at("pooled", "grpo_minus_reference", "diff"), "+.3f"),
        (GRID96, at("pooled", "grpo_minus_reference", "group_low"), "+.3f"),
        (GRID96, at("pooled", "grpo_minus_reference", "group_high"), "+.3f"),
        (GRID96, at("pooled", "grpo_minus_reference_mrr", "diff"), "+.3f"),
        (GRID96, at("pooled", "grpo_minus_reference_mrr", "group_low"), "+.3f"),
        (GRID96, at("pooled", "grpo_minus_reference_mrr", "group_high"), "+.3f"),
        (GRID96, lambda d: 100 * min(v["intent_kept_mean_of_runs"] for v in d["pooled_by_split"].values()), ".1f"),
        (GRID96, lambda d: 100 * max(v["intent_kept_mean_of_runs"] for v in d["pooled_by_split"].values()), ".1f"),
        (GRID96, at("pooled", "grpo_minus_warmup", "diff"), "+.3f"),
        (GRID96, at("pooled", "grpo_minus_warmup", "group_low"), "+.3f"),
        (GRID96, at("pooled", "grpo_minus_warmup", "group_high"), "+.3f"),
        (GRID96, lambda d: sum(v["grpo_minus_warmup"]["diff"] > 0 and v["grpo_minus_warmup"]["low"] <= 0
                               for v in d["pooled_by_split"].values()), "d"),
        (GRID96, lambda d: len(d["pooled"]["splits"]), "d"),
        (GRID96, lambda d: 100 * d["pooled"]["flat_groups_mean_of_runs"], ".0f")]),
    ("moving a run by up to {})", [(GRID, max_seed_spread, ".3f")]),
    ("lift split 0 by {} Recall@5 [{}, {}] ({}-{} against {}-{})", [
        *diff_ci(GRID24, "against", "by_split", "0", "lever_minus_baseline"),
        (GRID24, lambda d: split_range(0)(d)[0], ".3f"), (GRID24, lambda d: split_range(0)(d)[1], ".3f"),
        (GRID, lambda d: split_range(0)(d)[0], ".3f"), (GRID, lambda d: split_range(0)(d)[1], ".3f")]),
    ("their gain is not shown ({} [{}, {}])", diff_ci(GRID24, "against", "pooled", "lever_minus_baseline")),
    # the published adapters' run (benchmarks/published/gemma3-270m-kdconv-travel, its card from the same file)
    ("(fold {} of {}, GRPO seed {}, bf16; {} + {} MB)", [(PUB, at("settings", "args", "fold"), "d"),
                                                        (PUB, at("settings", "args", "folds"), "d"),
                                                        (PUB, grpo_seed, "d"),
                                                   (PUB, at("adapters", "warmup", "size_mb"), ".1f"),
                                                   (PUB, at("adapters", "grpo", "size_mb"), ".1f")]),
    ("On the {} held-out turns: warm-up {} Recall@5, GRPO {}, GRPO - warm-up {} [{}, {}], "
     "GRPO - reference {} [{}, {}]", [
        (PUB, at("final_eval", "grpo", "n"), "d"), (PUB, at("final_eval", "warmup", "recall@5"), ".3f"),
        (PUB, at("final_eval", "grpo", "recall@5"), ".3f"), *diff_ci(PUB, "comparisons", "grpo-warmup", "recall@5"),
        *diff_ci(PUB, "comparisons", "grpo-reference", "recall@5")]),
    ("{}x concat_last3 on context-dependent turns, intent kept on {} % of turns, {} % of GRPO's groups flat", [
        (PUB, ctx_dep_x, ".2f"), (PUB, lambda d: 100 * d["final_eval"]["grpo"]["intent_kept"], ".1f"),
        (PUB, lambda d: 100 * d["phases"]["grpo"]["per_step"]["zero_std_group_frac_mean"], ".0f")]),
    ("(the run: {} min {} s on an AMD AVX512-BF16 CPU", [
        (PUB, lambda d: int(d["wall_time_s"] // 60), "d"), (PUB, lambda d: int(d["wall_time_s"] % 60), "d")]),
]  # fmt: skip

# Numbers in README's results paragraphs that no results file holds, and why.
UNTIED: dict[str, str] = {
    "200": "the demo's catalogue size: a property of the bundled data (tests/apps/query_rewrite/demo)",
    "480": "the demo's GRPO steps: configs/query_rewrite_demo.yaml (trainer.total_steps)",
    "2": "'2-core': the machine's description",
    "512": "'AVX512-BF16': the CPU's instruction set",
    "16": "'AVX512-BF16': the CPU's instruction set",
    "40": "minutes on an AVX2-only EPYC, and 40 GRPO steps: one run seen, no results file; the recipe's steps",
    "32": "'float32'",
    "5": "5 of the product's 8 documents: a property of the demo's catalogue; 'intent kept on 95 %'; and the latest "
    "5 names in the prompt: the bench's --mentions default",
    "8": "8 documents per product in the demo's catalogue",
    "95": "95 % intervals and the intent goal (95 % of turns): definitions, not results",
    "0": "'above 0' / 'below 0' / split 0: thresholds and names",
    "1": "seed 1, 'above on 1': counted in the phrase's own holes where it is a result",
    "3": "'3 seeds' and ConvSearch-R1: counted in the phrase's own holes where it is a result",
    "2026-11-28": "the gpu-check's date: gpu_check.json holds no date",
    "4": "4 GRPO steps of the gpu-check: its recipe (benchmarks/gpu_check.py)",
    "8B": "the Qwen3-8B shape",
    "270": "Gemma 3 270M: the model's name",
    "320": "320 characters of history: the recipe's setting",
    "24": "lever 24: the lever's number",
    "34": "lever 34: the lever's number",
    "33": "lever 33: the lever's number",
    "38": "lever 38: the lever's number",
    # the real-model run's time: measured on runs whose JSON files are spread over experiments/results/ (one
    # with KDCONV_TEST, float32 and AVX2 runs): not tied to one results file yet
    "65": "a run's minutes with KDCONV_TEST (bf16): a lever run's wall time, not tied yet",
    "29": "minutes of that run's KDCONV_TEST eval: not tied yet",
    "1,702": "turns of the KDCONV_TEST file (KdConv's test.json, outside the repository)",
    "63-70": "minutes of two runs sharing the cores: not tied yet",
    "84": "float32 minutes with KDCONV_TEST: not tied yet",
    "46": "float32 minutes without it: not tied yet",
    "17": "warm-up minutes before SFT's left padding: not tied yet",
    "13": "warm-up minutes after it: not tied yet",
    "60-72": "% of flat groups over the runs: per-run rollout metrics, not in one results file",
    "0.04-0.07": "the seed grid's resolution: a reading of the grid, not a number it holds",
}  # fmt: skip


def readme() -> str:
    return " ".join((REPO / "README.md").read_text(encoding="utf-8").split())


WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def show(value: Any, fmt: str) -> str:
    """`value` as README writes it: a format spec, or ``words`` (a count up to ten in words)."""
    return WORDS[value] if fmt == "words" else format(value, fmt)


def render(template: str, holes: list[Hole]) -> str:
    return template.format(*(show(value(load(file)), fmt) for file, value, fmt in holes))


@pytest.mark.parametrize(("template", "holes"), CLAIMS, ids=[c[0][:48] for c in CLAIMS])
def test_readme_states_the_results_files_numbers(template: str, holes: list[Hole]) -> None:
    phrase = render(template, holes)
    assert phrase in readme(), f"README should say {phrase!r} ({', '.join(sorted({h[0] for h in holes}))})"


def test_the_check_fails_when_a_result_changes(tmp_path: Path) -> None:
    """The rendering reads the file: the same phrase from a changed copy is not in README."""
    claim = ("(peak {} GiB allocated)", [(GPU, at("memory_8b", "peak_allocated_gib"), ".1f")])
    changed = json.loads((REPO / GPU).read_text(encoding="utf-8"))
    changed["memory_8b"]["peak_allocated_gib"] += 1.0
    copy = tmp_path / "gpu_check.json"
    copy.write_text(json.dumps(changed), encoding="utf-8")
    assert render(*claim) in readme()
    assert render(claim[0], [(str(copy), *claim[1][0][1:])]) not in readme()


RESULTS_PARAGRAPHS = [
    ("## What `make demo` shows", "## Your own run"),
    ("**On a GPU, only", "**The trained rewriter"),
    ("**The trained rewriter, published**", "## Documentation"),
]
NUMBER = re.compile(r"(?<![\w.-])(\d{4}-\d\d-\d\d|\d[\d,]*(?:\.\d+)?(?:-\d[\d,.]*\d|B)?)")


def test_every_number_in_the_results_paragraphs_is_tied_or_explained() -> None:
    text = readme()
    spans = []
    for template, holes in CLAIMS:
        phrase = render(template, holes)
        start = text.find(phrase)
        if start >= 0:
            spans.append((start, start + len(phrase)))
    loose = []
    for begin, end in RESULTS_PARAGRAPHS:
        lo_, hi_ = text.index(begin), text.index(end)
        for m in NUMBER.finditer(text, lo_, hi_):
            number = m.group(1).rstrip(".,")
            inside = any(a <= m.start() < b for a, b in spans)
            code = text.count("`", lo_, m.start()) % 2 == 1  # a path or command, not a claim
            if not inside and not code and number not in UNTIED:
                loose.append(f"{number!r} at ...{text[max(lo_, m.start() - 40) : m.end() + 20]}...")
    assert loose == [], "tie each to its results file in CLAIMS, or say in UNTIED why it cannot be"
