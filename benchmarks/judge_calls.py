"""Judge calls per step of the query-rewrite reward on KdConv rollouts: as made, deduplicated, cached.

    queryrl prepare kdconv --input travel/dev.json --kb travel/kb_travel.json --out DIR
    queryrl sft --config configs/query_rewrite_demo.yaml data.train_files=[DIR/dev.parquet] ...   # a policy
    python benchmarks/judge_calls.py --model SFT_FOLDER --data DIR/dev.parquet --corpus DIR/corpus.jsonl

Trains the query-rewrite preset (``configs/query_rewrite_demo.yaml``) for ``--steps`` steps from
`--model` on the KdConv rows, with the embedded RAG service over the KdConv corpus and the
``openai`` judge pointed at a loopback judge server (``queryrl.testing.judge_server``, a constant
rubric verdict, "same" at 20 of 40 for both) that records every request. Per step it reports: the samples, the judge
requests the reward made (``made``: one per parseable sample, what queryrl does today), the distinct
request bodies among them (``dedupe``: identical rewrites of a prompt give identical judge
messages, so one call each would do), and the distinct bodies never sent in an earlier step
(``dedupe_cache``: a verdict cache across steps), with the RAG candidate calls the reward made after
its own sharing of identical rewrites (``rag/candidate_calls``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, machine, one_thread, table, write_json

CONFIG = REPO / "configs" / "query_rewrite_demo.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the policy: a Hugging Face model folder (e.g. an SFT run)")
    parser.add_argument("--data", required=True, help="KdConv rows from `queryrl prepare kdconv`")
    parser.add_argument("--corpus", required=True, help="the RAG corpus: corpus.jsonl from `queryrl prepare kdconv`")
    parser.add_argument("--policy-note", default="", help="how --model was made (recorded in the results)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS / "judge_calls.json")
    args = parser.parse_args()
    one_thread()
    from queryrl.config import load_config
    from queryrl.testing.judge_server import make_app, running_server
    from queryrl.trainer.loop import Trainer

    bodies: list[str] = []

    def recording_judge(messages: list[dict[str, Any]]) -> str:
        bodies.append(hashlib.sha256(json.dumps(messages, ensure_ascii=False, sort_keys=True).encode()).hexdigest())
        side = {"quality": 8, "relevance": 4, "completeness": 4, "retrieval": 4, "sum": 20}
        return json.dumps({"better": "same", "score": {"8b": side, "32b": side}})

    rows_out: list[dict[str, Any]] = []
    seen: set[str] = set()
    with running_server(make_app(recording_judge), max_lifetime_s=3600) as url, tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"model.path={args.model}",
            f"data.train_files=[{args.data}]",
            "data.val_files=[]",
            f"data.train_batch_size={args.batch}",
            f"actor.ppo_mini_batch_size={args.batch}",
            f"rollout.n={args.n}",
            f"trainer.total_steps={args.steps}",
            f"trainer.seed={args.seed}",
            f"trainer.output_dir={tmp}",
            "trainer.experiment_name=calls",
            "trainer.logger=[jsonl]",
            "trainer.plot=false",
            "trainer.save_every=0",
            "trainer.save_samples=0",
            "trainer.resume=disable",
            "app.query_rewrite.judge.backend=openai",
            f"app.query_rewrite.judge.base_url={url}",
            "app.query_rewrite.judge.model=judge",
            "app.query_rewrite.judge.api_key_env=null",
            f"app.query_rewrite.rag.corpus={args.corpus}",
        ]
        with Trainer(load_config(CONFIG, overrides)) as trainer:
            for step in range(1, args.steps + 1):
                before = len(bodies)
                metrics = trainer.fit(max_steps=step)
                made = bodies[before:]
                distinct = set(made)
                rows_out.append(
                    {
                        "step": step,
                        "samples": args.batch * args.n,
                        "made": len(made),
                        "dedupe": len(distinct),
                        "dedupe_cache": len(distinct - seen),
                        "rag_candidate_calls": metrics.get("rag/candidate_calls"),
                        "score_mean": metrics.get("critic/score/mean"),
                    }
                )
                seen |= distinct
                print(rows_out[-1], flush=True)
    totals = {k: sum(r[k] for r in rows_out) for k in ("samples", "made", "dedupe", "dedupe_cache")}
    results = {
        "per_step": rows_out,
        "totals": totals,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"},
        "machine": machine() | {"shared": True},
    }
    write_json(args.out, results)
    print()
    print(
        table(
            ["step", "samples", "judge calls made", "with dedupe", "with dedupe + cache", "RAG candidate calls"],
            [
                [r["step"], r["samples"], r["made"], r["dedupe"], r["dedupe_cache"], r["rag_candidate_calls"]]
                for r in rows_out
            ],
        )
    )
    print(f"\nwrote {args.out}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
