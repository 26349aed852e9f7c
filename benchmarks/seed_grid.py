"""The rewriter's goals over GRPO seeds and split seeds: how many runs meet them, and the recipe's pooled effect.

One GRPO run per split cannot tell a lever under about 0.02 Recall@5 from the GRPO seed (the log's "GRPO's own
spread"). This reads a grid of ``benchmarks/real_model.py`` results, each a JSON whose run folder
(``settings.args.work``) still holds its per-turn eval rows (``--rows`` below), and prints, as JSON:

- per run (split seed, GRPO seed): each goal met or not: GRPO - warm-up and GRPO - reference Recall@5 (and MRR
  against the reference) with paired intervals above zero (over turns, and over conversations), context-dependent
  Recall@5 at least 2.2x concat_last3's, intent kept on at least 97 % of turns, the median GRPO query at most 1.5x the
  reference's in characters (no query stuffing), and at most 30 % of the run's GRPO groups flat (every sample of the
  group scored alike: the result's ``phases.grpo.per_step.zero_std_group_frac_mean``);
- per goal, in how many runs it is met;
- per split and over all splits, the recipe's effect with the GRPO seed averaged out: each turn's GRPO score is the
  mean over that split's GRPO seeds, paired with the split's warm-up (one warm-up per split, shared by its GRPO
  runs) and with the reference; intervals by the eval's paired bootstrap over turns and by a cluster bootstrap over
  conversations (:func:`~queryrl.apps.query_rewrite.metrics.paired_bootstrap` with ``groups``). Over all
  splits a cluster is one conversation of one split: the split seeds draw their held-out conversations from one
  KdConv file, so a conversation can be held out in two splits, with a different model each time.

    python benchmarks/seed_grid.py experiments/results/real_model_bf16_gold_entity_hist320_s0.json \\
      experiments/results/real_model_bf16_grposeed8_s0.json ... --out benchmarks/results/seed_grid.json

A lever on the grid unit: ``--against BASELINE_JSONS...`` (the recipe's grid) adds, per split
and over the splits both grids hold, the lever's GRPO score minus the baseline's, each turn's score averaged over
that grid's GRPO seeds on that split (paired over turns and over conversations, as above), per GRPO seed held by
both, the two runs' difference (the same seed orders the same turns and seeds the sampler alike), and the lever's
warm-up minus the baseline's (one warm-up per split and grid; zero where the lever leaves the warm-up as it is).

The held-out turns read (``--rows``): ``test``, the bench's final eval (``eval/eval_samples.jsonl``; the default, and
the turns the log's levers were chosen on); ``val``, the split's validation conversations, which no phase of the bench
reads and no lever was chosen on (``eval_val/eval_samples.jsonl``, written by ``benchmarks/val_eval.py``); ``both``,
each run's test turns and then its validation turns, pooled (a cluster is still one conversation of one split: the
two sets hold different conversations). Every per-run and pooled figure is then over those turns.

A turn is context-dependent when it has an earlier message (``turn > 0``; the eval's own rule for rows without a
kind), checked against each eval's ``ctx_dep_n`` in the result (``final_eval``, ``val_eval``).

A run whose folder is gone is read from the per-turn scores its result kept (``turn_rows``, written by the bench and
``val_eval.py``; ``benchmarks/turn_rows.py``): the same pairing, with the intent as the eval recorded it (the run's
``rows_source`` says which).

The intent-kept rate is read again from each GRPO query with today's offline check
(:func:`~queryrl.apps.query_rewrite.eval.intent.offline_intents` on the run's ``data/test.parquet`` or
``data/val.parquet``): runs evaluated
before a change of the check (lever 22's) would otherwise be read by two versions of it. The recorded rate is kept
beside it (``intent_kept_recorded``); the goal uses today's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from turn_rows import expand, identical_logged_groups, query_chars

from queryrl.apps.query_rewrite.metrics import paired_bootstrap

RATIO_GOAL = 2.2  # context-dependent Recall@5 at least this many times concat_last3's
INTENT_GOAL = 0.97
LENGTH_GOAL = 1.5  # the median GRPO query at most this many times the reference's, in characters
FLAT_GOAL = 0.30  # at most this share of a run's GRPO groups flat


class GridError(ValueError):
    """A result, or a run folder it names, that the grid cannot read: one line naming which (exit 2)."""


def _grpo_seed(work: Path, result: dict[str, Any]) -> int:
    """``trainer.seed`` of the GRPO run, from the config the run saved (``grpo_run/config.yaml``), or where the run
    folder is gone from the bench's overrides in the result (the last ``trainer.seed=`` given)."""
    import yaml

    config = work / "grpo_run" / "config.yaml"
    if config.is_file():
        return int(yaml.safe_load(config.read_text(encoding="utf-8"))["trainer"]["seed"])
    given = [o for o in result["settings"]["args"].get("overrides") or [] if o.startswith("trainer.seed=")]
    if not given:
        raise GridError(f"{work}: no grpo_run/config.yaml and no trainer.seed= in the result's overrides")
    return int(given[-1].partition("=")[2])


# --rows: each eval's folder, data file and summary in the result JSON
ROWS = {"test": ("eval", "test.parquet", "final_eval"), "val": ("eval_val", "val.parquet", "val_eval")}


def _load(path: Path, rows_from: Sequence[str] = ("test",)) -> dict[str, Any]:
    """One run of the grid: its result, and the per-turn rows of the evals `rows_from` names (``test``: the bench's
    final eval, ``val``: ``benchmarks/val_eval.py``'s eval of the validation conversations), in that order."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
        args = result["settings"]["args"]
        work, split = Path(args["work"]), split_label(args)
        summaries = {name: result[ROWS[name][2]]["grpo"] for name in rows_from}
        counted = {name: summary["ctx_dep_n"] for name, summary in summaries.items()}
    except (OSError, ValueError) as exc:
        raise GridError(f"{path}: not readable as JSON ({exc})") from None
    except (KeyError, TypeError) as exc:
        raise GridError(f"{path}: not a benchmarks/real_model.py result (no {exc} in it)") from None
    rows: list[dict[str, Any]] = []
    kept, recorded, evaluated = 0.0, 0.0, 0
    kept_rows = result.get("turn_rows") or {}
    from_result = False
    for name in rows_from:
        folder, data, _ = ROWS[name]
        samples = work / folder / "eval_samples.jsonl"
        if samples.is_file():
            records = [json.loads(line) for line in samples.read_text(encoding="utf-8").splitlines() if line.strip()]
            now = _intent_kept_now(work / "data" / data, records)
        elif kept_rows.get(name):  # the run folder is gone: the rows the result kept, the intent as recorded
            records, from_result = expand(kept_rows[name]), True
            now = summaries[name]["intent_kept"]
        else:
            raise GridError(
                f"{path}: its run folder has no {samples} and the result no turn_rows.{name} (the grid needs each "
                "run's per-turn rows)"
            )
        gold = [r for r in records if r.get("gold")]
        dependent = sum(r["turn"] > 0 for r in gold)
        if dependent != counted[name]:
            raise GridError(f"{path}: {dependent} turns with history but its {name} eval counted {counted[name]}")
        rows += gold
        kept += now * len(records)
        recorded += summaries[name]["intent_kept"] * len(records)
        evaluated += len(records)
    logged = work / "grpo_run" / "samples"
    return {
        "path": str(path),
        "split": split,
        "grpo_seed": _grpo_seed(work, result),
        "rows": rows,
        "rows_source": "result" if from_result else "run folder",
        "ran_on": f"{(result.get('machine') or {}).get('cpu', 'unknown CPU')}, {result.get('compute_dtype', '?')}",
        "intent_kept": kept / evaluated,
        "intent_kept_recorded": recorded / evaluated,
        "flat_groups": (result.get("phases", {}).get("grpo", {}).get("per_step") or {}).get("zero_std_group_frac_mean"),
        "identical_groups": (
            identical_logged_groups(logged) if logged.is_dir() else result.get("grpo_identical_logged_groups")
        ),
    }


def split_label(args: dict[str, Any]) -> int | str:
    """A run's split: its seed (``--seed``), or for a fold split (``--fold K --folds N``) ``"fold K/N"`` (with
    ``", seed S"`` for a seed other than 0): the folds of one seed hold disjoint test conversations."""
    seed = int(args["seed"])
    if args.get("fold") is None:
        return seed
    return f"fold {args['fold']}/{args.get('folds', 10)}" + (f", seed {seed}" if seed else "")


def _intent_kept_now(data: Path, records: list[dict[str, Any]]) -> float:
    """The share of every evaluated turn (gold or not; `records`: the eval's rows) whose GRPO query today's
    offline check keeps."""
    from queryrl.apps.query_rewrite.eval.intent import offline_intents
    from queryrl.apps.query_rewrite.eval.samples import load_samples

    samples = load_samples(str(data), max_samples=len(records))
    if [s.contexts[-1]["content"] for s in samples] != [r["last_turn"] for r in records]:
        raise GridError(f"{data} does not hold the evaluated turns in the same order")
    verdicts = offline_intents(samples, [r["systems"]["grpo"]["query"] for r in records])
    return sum(v.kept for v in verdicts) / len(verdicts)


def _scores(
    rows: list[dict[str, Any]], system: str, dependent_only: bool = False, metric: str = "recall@5"
) -> np.ndarray:
    return np.array([r["systems"][system][metric] for r in rows if r["turn"] > 0 or not dependent_only])


def _length_ratio(rows: list[dict[str, Any]]) -> float:
    """The median GRPO query's length over the median reference query's, in characters."""
    grpo = float(np.median([query_chars(r["systems"]["grpo"]) for r in rows]))
    return grpo / float(np.median([query_chars(r["systems"]["reference"]) for r in rows]))


BOOTSTRAP = {"n_boot": 1000}  # replicates of every interval (the eval's); --boot changes it for one invocation


def _interval(a: np.ndarray, b: np.ndarray, groups: list[str]) -> dict[str, float]:
    p = paired_bootstrap(a.tolist(), b.tolist(), groups=groups, n_boot=BOOTSTRAP["n_boot"])
    return {k: round(p[k], 4) for k in ("diff", "low", "high", "group_low", "group_high")} | {"n": int(p["n"])}


def _run_goals(run: dict[str, Any]) -> dict[str, Any]:
    rows = run["rows"]
    groups = [r["conversation_id"] for r in rows]
    vs_warmup = _interval(_scores(rows, "grpo"), _scores(rows, "warmup"), groups)
    vs_ref = _interval(_scores(rows, "grpo"), _scores(rows, "reference"), groups)
    vs_ref_mrr = _interval(_scores(rows, "grpo", metric="mrr"), _scores(rows, "reference", metric="mrr"), groups)
    dep = {s: float(_scores(rows, s, dependent_only=True).mean()) for s in ("grpo", "concat_last3", "reference")}
    ratio, vs_reference = dep["grpo"] / dep["concat_last3"], dep["grpo"] - dep["reference"]
    length, flat = _length_ratio(rows), run["flat_groups"]
    return {
        "split": run["split"],
        "grpo_seed": run["grpo_seed"],
        "result": run["path"],
        "grpo_recall@5": round(float(_scores(rows, "grpo").mean()), 4),
        "grpo_minus_warmup": vs_warmup,
        "grpo_minus_reference": vs_ref,
        "grpo_minus_reference_mrr": vs_ref_mrr,
        "ctx_dep_x_concat_last3": round(ratio, 3),
        "ctx_dep_grpo_minus_reference": round(vs_reference, 4),
        "intent_kept": round(run["intent_kept"], 4),
        "intent_kept_recorded": round(run["intent_kept_recorded"], 4),
        "rows_source": run["rows_source"],
        "median_query_x_reference": round(length, 3),
        "flat_groups": None if flat is None else round(flat, 4),
        "identical_logged_groups": None if run["identical_groups"] is None else round(run["identical_groups"], 4),
        "goals": {
            "above_warmup_turns": vs_warmup["low"] > 0,
            "above_warmup_conversations": vs_warmup["group_low"] > 0,
            "above_reference_conversations": vs_ref["group_low"] > 0,
            "mrr_above_reference_conversations": vs_ref_mrr["group_low"] > 0,
            "ctx_dep_2.2x_concat_last3": ratio >= RATIO_GOAL,
            "intent_kept_97": run["intent_kept"] >= INTENT_GOAL,
            "median_query_within_1.5x_reference": length <= LENGTH_GOAL,
            "flat_groups_at_most_30": flat is not None and flat <= FLAT_GOAL,
        },
    }


def _turn_key(row: dict[str, Any]) -> tuple[str, int, int]:
    """Which turn a row is: its conversation, its turn in it and its index in the eval's file."""
    return str(row["conversation_id"]), int(row["turn"]), int(row["index"])


def _seed_mean(runs: list[dict[str, Any]], split: int | str) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Each turn's GRPO Recall@5 averaged over the GRPO seeds of `split` in `runs`, and the turns' rows."""
    mine = [r for r in runs if r["split"] == split]
    return np.mean([_scores(r["rows"], "grpo") for r in mine], axis=0), mine[0]["rows"]


def _pooled(runs: list[dict[str, Any]], splits: list[Any]) -> dict[str, Any]:
    """The GRPO seeds averaged per turn within each split; the splits' turns then pooled."""
    grpo, warmup, reference, concat, groups, dep = [], [], [], [], [], []
    grpo_mrr, reference_mrr = [], []
    for split in splits:
        mine = [r for r in runs if r["split"] == split]
        base = mine[0]["rows"]
        for r in mine[1:]:
            if [_turn_key(x) for x in r["rows"]] != [_turn_key(x) for x in base]:
                raise GridError(f"{r['path']} and {mine[0]['path']} (split {split}) do not hold the same turns")
            for system in ("warmup", "reference", "concat_last3"):
                if not np.array_equal(_scores(r["rows"], system), _scores(base, system)):
                    raise GridError(f"{r['path']}: its {system} differs from {mine[0]['path']}'s on split {split}")
        grpo.append(_seed_mean(runs, split)[0])
        grpo_mrr.append(np.mean([_scores(r["rows"], "grpo", metric="mrr") for r in mine], axis=0))
        reference_mrr.append(_scores(base, "reference", metric="mrr"))
        warmup.append(_scores(base, "warmup"))
        reference.append(_scores(base, "reference"))
        concat.append(_scores(base, "concat_last3"))
        groups += [f"{split}:{x['conversation_id']}" for x in base]
        dep.append(np.array([x["turn"] > 0 for x in base]))
    g, w, ref, c, d = (np.concatenate(v) for v in (grpo, warmup, reference, concat, dep))
    dep_groups = [x for x, keep in zip(groups, d, strict=True) if keep]
    mine = [r for r in runs if r["split"] in splits]
    flats = [r["flat_groups"] for r in mine if r["flat_groups"] is not None]
    same = [r["identical_groups"] for r in mine if r["identical_groups"] is not None]
    return {
        "splits": splits,
        "runs": sum(r["split"] in splits for r in runs),
        "turns": int(g.size),
        "grpo_recall@5": round(float(g.mean()), 4),
        "grpo_minus_warmup": _interval(g, w, groups),
        "grpo_minus_reference": _interval(g, ref, groups),
        "grpo_minus_reference_mrr": _interval(np.concatenate(grpo_mrr), np.concatenate(reference_mrr), groups),
        "ctx_dep_x_concat_last3": round(float(g[d].mean() / c[d].mean()), 3),
        "ctx_dep_grpo_minus_reference": _interval(g[d], ref[d], dep_groups),
        "intent_kept_mean_of_runs": round(float(np.mean([r["intent_kept"] for r in mine])), 4),
        "median_query_x_reference_median_of_runs": round(float(np.median([_length_ratio(r["rows"]) for r in mine])), 3),
        "flat_groups_mean_of_runs": round(float(np.mean(flats)), 4) if flats else None,
        "identical_logged_groups_mean_of_runs": round(float(np.mean(same)), 4) if same else None,
    }


def against(runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    """The lever's grid (`runs`) against the recipe's (`baseline`) on the splits both hold: per split and pooled,
    GRPO minus GRPO with each grid's seeds averaged per turn; per GRPO seed both hold, run minus run."""
    splits = sorted({r["split"] for r in runs} & {r["split"] for r in baseline})
    if not splits:
        raise GridError("--against: the two grids share no split seed")
    lever, base, lever_warm, base_warm, groups, out = [], [], [], [], [], {}
    for split in splits:
        mine, rows = _seed_mean(runs, split)
        theirs, base_rows = _seed_mean(baseline, split)
        if [_turn_key(x) for x in rows] != [_turn_key(x) for x in base_rows]:
            raise GridError(f"split {split}: the lever's runs and the baseline's do not hold the same turns")
        # one warm-up per split and grid (its GRPO seeds share it): a lever that changes the warm-up shows it here
        warm, base_warm_split = _scores(rows, "warmup"), _scores(base_rows, "warmup")
        split_groups = [f"{split}:{x['conversation_id']}" for x in rows]
        seeds = sorted({r["grpo_seed"] for r in runs if r["split"] == split})
        same_seed = {}
        for seed in seeds:
            a, b = ([r for r in g if r["split"] == split and r["grpo_seed"] == seed] for g in (runs, baseline))
            if a and b:
                pair = (_scores(a[0]["rows"], "grpo"), _scores(b[0]["rows"], "grpo"))
                same_seed[str(seed)] = _interval(*pair, split_groups)
        out[str(split)] = {
            "lever_seeds": seeds,
            "baseline_seeds": sorted({r["grpo_seed"] for r in baseline if r["split"] == split}),
            "lever_recall@5": round(float(mine.mean()), 4),
            "baseline_recall@5": round(float(theirs.mean()), 4),
            "lever_minus_baseline": _interval(mine, theirs, split_groups),
            "same_seed": same_seed,
            "lever_warmup_recall@5": round(float(warm.mean()), 4),
            "baseline_warmup_recall@5": round(float(base_warm_split.mean()), 4),
            "warmup_lever_minus_baseline": _interval(warm, base_warm_split, split_groups),
        }
        lever.append(mine)
        base.append(theirs)
        lever_warm.append(warm)
        base_warm.append(base_warm_split)
        groups += split_groups
    pooled = _interval(np.concatenate(lever), np.concatenate(base), groups)
    pooled_warm = _interval(np.concatenate(lever_warm), np.concatenate(base_warm), groups)
    return {
        "by_split": out,
        "pooled": {"splits": splits, "lever_minus_baseline": pooled, "warmup_lever_minus_baseline": pooled_warm},
    }


def _iv(x: dict[str, float], conversations: bool = True) -> str:
    text = f"{x['diff']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"
    return text + (f" / [{x['group_low']:+.3f}, {x['group_high']:+.3f}]" if conversations else "")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def markdown(out: dict[str, Any]) -> str:
    """The log's tables: one row per run, then the pooled rows (per split and over all)."""
    head = (
        "| split, GRPO seed | GRPO Recall@5 | GRPO - warm-up: turns / conversations "
        "| GRPO - reference: turns / conversations | ctx-dep x concat_last3 | intent kept | median query x reference "
        "| flat groups | of the logged groups, one response |\n"
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"
    )
    rows = [
        f"| {r['split']}, {r['grpo_seed']} | {r['grpo_recall@5']:.3f} | {_iv(r['grpo_minus_warmup'])} "
        f"| {_iv(r['grpo_minus_reference'])} | {r['ctx_dep_x_concat_last3']:.2f}x | {100 * r['intent_kept']:.1f} % "
        f"| {r['median_query_x_reference']:.2f}x | {_pct(r['flat_groups'])} | {_pct(r['identical_logged_groups'])} |"
        for r in out["runs"]
    ]
    pooled = [("split " + k, v) for k, v in out["pooled_by_split"].items()] + [("all splits", out["pooled"])]
    head2 = (
        "| GRPO seeds averaged per turn | runs | turns | GRPO Recall@5 | GRPO - warm-up: turns / conversations "
        "| GRPO - reference: turns / conversations | MRR, GRPO - reference | ctx-dep x concat_last3 "
        "| intent kept (mean of runs) | median query x reference | flat groups | of the logged groups, one response |\n"
        "| --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"
    )
    rows2 = [
        f"| {name} | {p['runs']} | {p['turns']} | {p['grpo_recall@5']:.3f} | {_iv(p['grpo_minus_warmup'])} "
        f"| {_iv(p['grpo_minus_reference'])} | {_iv(p['grpo_minus_reference_mrr'])} "
        f"| {p['ctx_dep_x_concat_last3']:.2f}x | {100 * p['intent_kept_mean_of_runs']:.1f} % "
        f"| {p['median_query_x_reference_median_of_runs']:.2f}x | {_pct(p['flat_groups_mean_of_runs'])} "
        f"| {_pct(p['identical_logged_groups_mean_of_runs'])} |"
        for name, p in pooled
    ]
    met = ", ".join(f"{k} {v}" for k, v in out["goals_met"].items())
    lines = [head, *rows, "", head2, *rows2, "", f"Runs meeting each goal: {met}."]
    ran_on = out.get("ran_on", [])
    if len(ran_on) > 1:
        lines.append(f"The runs ran on more than one CPU or dtype: {'; '.join(ran_on)}.")
    if "against" in out:
        lines += [
            "",
            "| lever - baseline, GRPO Recall@5 | lever seeds | baseline seeds | lever | baseline "
            "| seeds averaged per turn: turns / conversations | same GRPO seed, run - run "
            "| warm-ups: lever, baseline | warm-up lever - baseline: turns / conversations |",
            "| --- | --- | --- | ---: | ---: | --- | --- | --- | --- |",
        ]
        for split, a in out["against"]["by_split"].items():
            same = "; ".join(f"{k}: {_iv(v, False)}" for k, v in a["same_seed"].items())
            lines.append(
                f"| split {split} | {a['lever_seeds']} | {a['baseline_seeds']} | {a['lever_recall@5']:.3f} "
                f"| {a['baseline_recall@5']:.3f} | {_iv(a['lever_minus_baseline'])} | {same} "
                f"| {a['lever_warmup_recall@5']:.3f}, {a['baseline_warmup_recall@5']:.3f} "
                f"| {_iv(a['warmup_lever_minus_baseline'])} |"
            )
        pooled_against = out["against"]["pooled"]
        lines.append(
            f"| all shared splits | | | | | {_iv(pooled_against['lever_minus_baseline'])} | | "
            f"| {_iv(pooled_against['warmup_lever_minus_baseline'])} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+", help="benchmarks/real_model.py result JSONs")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--markdown", action="store_true", help="print the log's tables instead of the JSON")
    parser.add_argument("--against", type=Path, nargs="+", default=None, help="the baseline grid's result JSONs")
    parser.add_argument(
        "--rows",
        choices=("test", "val", "both"),
        default="test",
        help="the held-out turns read: the final eval's (test, default), the validation conversations' "
        "(val: benchmarks/val_eval.py), or both, pooled",
    )
    parser.add_argument(
        "--boot",
        type=int,
        default=1000,
        help="bootstrap replicates of every interval (default 1000, the eval's; more: the bounds move less with the "
        "bootstrap's own resampling)",
    )
    args = parser.parse_args(argv)
    if args.boot < 100:
        print(f"seed_grid: --boot must be at least 100 replicates, got {args.boot}", file=sys.stderr)
        return 2
    BOOTSTRAP["n_boot"] = args.boot
    rows_from = ("test", "val") if args.rows == "both" else (args.rows,)
    try:
        runs = [_load(p, rows_from) for p in args.results]
        baseline = [_load(p, rows_from) for p in args.against or []]
        out = {"rows": args.rows, "bootstrap_replicates": args.boot} | grid_summary(runs, baseline)
    except GridError as exc:
        print(f"seed_grid: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(out, ensure_ascii=False, indent=1)
    print(markdown(out) if args.markdown else text)
    if args.out is not None:
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        tmp.replace(args.out)
    return 0


def grid_summary(runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run, per goal and pooled (see the module docstring); with `baseline` runs, the lever against them."""
    if len({type(r["split"]) for r in [*runs, *baseline]}) > 1:
        raise GridError("the results mix seeded splits and fold splits (--fold): compare like with like")
    per_run = [_run_goals(r) for r in runs]
    goals = list(per_run[0]["goals"])
    splits = sorted({r["split"] for r in runs})
    by_split: dict[int | str, list[int]] = defaultdict(list)
    for r in runs:
        by_split[r["split"]].append(r["grpo_seed"])
    out = {
        "grid": {str(s): sorted(v) for s, v in sorted(by_split.items())},
        # the CPUs and compute dtypes its runs ran on: more than one is a confound the pooled numbers carry
        "ran_on": sorted({r.get("ran_on", "unknown") for r in [*runs, *baseline]}),
        "runs": per_run,
        "goals_met": {g: f"{sum(r['goals'][g] for r in per_run)} of {len(per_run)}" for g in goals},
        "pooled_by_split": {str(s): _pooled(runs, [s]) for s in splits},
        "pooled": _pooled(runs, splits),
    }
    if baseline:
        out["against"] = against(runs, baseline)
    return out


if __name__ == "__main__":
    sys.exit(main())
