"""Print the benchmark tables of docs/benchmarks.md from the result JSONs (so every number there comes from one).

python benchmarks/readme_tables.py        # markdown on stdout, one section per result file found
"""

from __future__ import annotations

import json
from typing import Any

from common import RESULTS, table


def trl_section(d: dict[str, Any]) -> str:
    """bench-trl: the pairs and the medians."""
    rows = [
        [
            i + 1,
            " then ".join(p["order"]),
            p["queryrl"]["median_step_s"],
            p["trl"]["median_step_s"],
            p["ratio_step_time"],
            p["queryrl"]["peak_rss_mb"],
            p["trl"]["peak_rss_mb"],
            p["ratio_peak_rss"],
        ]
        for i, p in enumerate(d["pairs"])
    ]
    rows.append(
        [
            "**median**",
            "",
            d["median_step_s"]["queryrl"],
            d["median_step_s"]["trl"],
            f"**{d['ratio_step_time_queryrl_over_trl']}**",
            d["median_peak_rss_mb"]["queryrl"],
            d["median_peak_rss_mb"]["trl"],
            f"**{d['ratio_peak_rss_queryrl_over_trl']}**",
        ]
    )
    header = ["pair", "order", "queryrl step s", "TRL step s", "ratio", "queryrl RSS MB", "TRL RSS MB", "RSS ratio"]
    q = d["pairs"][0]["queryrl"].get("median_phases_s")
    phases = ""
    if q:
        qp = {k: [p["queryrl"]["median_phases_s"][k] for p in d["pairs"]] for k in q}
        tp = {k: [p["trl"]["median_phases_s"][k] for p in d["pairs"]] for k in d["pairs"][0]["trl"]["median_phases_s"]}
        med = {f"queryrl {k}": sorted(v)[len(v) // 2] for k, v in qp.items()}
        med |= {f"TRL {k}": sorted(v)[len(v) // 2] for k, v in tp.items()}
        rest = [  # what TRL's step does besides generating, scoring and the loss forward
            p["trl"]["median_step_s"]
            - p["trl"]["median_phases_s"]["gen_and_score"]
            - p["trl"]["median_phases_s"]["loss_forward"]
            for p in d["pairs"]
        ]
        med["TRL backward+optimizer+rest"] = round(sorted(rest)[len(rest) // 2], 4)
        phases = "\n\nPhases (upper median over the pairs of each run's median, seconds):\n\n" + table(
            list(med), [list(med.values())]
        )
    return table(header, rows) + phases


def decode_section(d: dict[str, Any]) -> str:
    """bench-decode: the pairs and the medians."""
    from decode_paths import decode_table

    return decode_table(d)


def judge_section(d: dict[str, Any]) -> str:
    """bench-judge: one row per mode."""
    rows = [
        [m, v["step_s"], v["gen_s"], v["reward_wait_s"], v["reward_wait_latencies"], v.get("reward_wait_calls")]
        for m, v in d["summary"].items()
    ]
    head = ["mode", "step s", "gen s", "reward_wait s", "reward_wait / latency", "reward_wait / one call"]
    return (
        f"Latency {d['latency_ms']} ms; one call alone {d.get('single_call_s')} s; "
        f"{d['settings']['samples_per_step']} judge calls per step.\n\n" + table(head, rows)
    )


def scaling_section(d: dict[str, Any]) -> str:
    """bench-scaling: one table per axis with its slopes."""
    parts = []
    for axis, data in d["axes"].items():
        rows = [[p[axis], p["step_s"], p["gen_s"], p["update_actor_s"], p["peak_rss_mb"]] for p in data["points"]]
        parts.append(
            f"{axis}: step time slope {data['slope_step_s']['per_unit']} s per unit "
            f"(log-log {data['slope_step_s']['loglog']}), peak RSS slope "
            f"{data['slope_peak_rss_mb']['per_unit']} MB per unit\n\n"
            + table([axis, "step s", "gen s", "update_actor s", "peak RSS MB"], rows)
        )
    return "\n\n".join(parts)


def judge_calls_section(d: dict[str, Any]) -> str:
    """bench-judge-calls: one row per step and the totals."""
    keys = ("samples", "made", "dedupe", "dedupe_cache")
    rows = [[r["step"], *(r[k] for k in keys), r["rag_candidate_calls"]] for r in d["per_step"]]
    rows.append(["**total**", *(d["totals"][k] for k in keys), ""])
    head = ["step", "samples", "judge calls made", "with dedupe", "with dedupe + cache", "RAG candidate calls"]
    return table(head, rows)


REAL_SYSTEMS = ("concat_last3", "reference", "zero_shot", "ref_sft", "warmup", "grpo")
REAL_DIFFS = ("grpo-warmup", "warmup-zero_shot", "grpo-concat_last3", "grpo-reference", "warmup-ref_sft")


def _diff(c: dict[str, Any] | None, metric: str = "recall@5") -> str:
    if not c or metric not in c:
        return "-"
    m = c[metric]
    return f"{m['diff']:+.3f} [{m['low']:+.3f}, {m['high']:+.3f}]"


def real_model_section(runs: list[dict[str, Any]]) -> str:
    """bench-real, one row per (run, system): held-out Recall@5 (all, context-dependent), format, intent kept;
    then one row per run with the paired differences of Recall@5."""
    rows = []
    for d in runs:
        seed = d["data"]["split_seed"]
        for name in REAL_SYSTEMS:
            m = d["final_eval"].get(name)
            if m is None:
                continue
            ci = f"{m['recall@5']:.3f} [{m['recall@5_low']:.3f}, {m['recall@5_high']:.3f}]"
            rows.append(
                [seed, name, ci, f"{m['ctx_dep_recall@5']:.3f}", f"{m['format_ok']:.3f}", f"{m['intent_kept']:.3f}"]
            )
    out = [table(["split seed", "system", "Recall@5 [95 % CI]", "ctx-dep Recall@5", "format", "intent kept"], rows)]
    diffs = []
    for d in runs:
        ctx = {k: d["final_eval"][k]["ctx_dep_recall@5"] for k in ("grpo", "concat_last3", "reference")}
        ratio = f"{ctx['grpo'] / ctx['concat_last3']:.2f}x" if ctx["concat_last3"] else "-"
        diffs.append(
            [
                d["data"]["split_seed"],
                d["data"]["eval_rows"],
                *(_diff(d["comparisons"].get(k)) for k in REAL_DIFFS),
                ratio,
                f"{ctx['grpo']:.3f} / {ctx['reference']:.3f}",
            ]
        )
    head = ["split seed", "rows", *REAL_DIFFS, "ctx-dep grpo / concat_last3", "ctx-dep grpo / reference"]
    out.append(table(head, diffs))
    return "\n\n".join(out)


def main() -> None:
    seeds = sorted(RESULTS.glob("real_model_*_seed*.json"))
    if seeds:
        names = ", ".join(p.name for p in seeds)
        print(f"<!-- {names} -->\n{real_model_section([json.loads(p.read_text()) for p in seeds])}\n")
    for name, render in (
        ("trl_vs_queryrl.json", trl_section),
        ("decode_paths.json", decode_section),
        ("judge_overlap.json", judge_section),
        ("scaling.json", scaling_section),
        ("judge_calls.json", judge_calls_section),
    ):
        path = RESULTS / name
        if path.is_file():
            print(f"<!-- {name} -->\n{render(json.loads(path.read_text()))}\n")


if __name__ == "__main__":
    main()
