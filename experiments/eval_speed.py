"""Wall and CPU time of ``queryrl eval``'s greedy generation alone, for one model on the first rows of a data file.

    python experiments/eval_speed.py --model runs/levers/hist320_gold_s0/warmup \
      --data runs/levers/mlp_g7_s0/data/test.parquet --rows 64 --threads 1 --out replies.json

What it times is :func:`queryrl.apps.query_rewrite.eval.generation.generate_replies` (model load, prompt encoding,
the fast decode path, decoding the replies), greedy, ``--max-new-tokens`` 48, micro-batches of ``--batch``, the
way ``benchmarks/real_model.py`` evaluates (bfloat16 where given). To compare two versions of queryrl, run it from
outside the repository with ``PYTHONPATH`` at a worktree of each commit (``git worktree add /tmp/old COMMIT``) and
alternate them; ``--out`` keeps the replies, to count those that differ.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="a parquet file of the bench's rows")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=None, help="write the replies here (JSON)")
    args = parser.parse_args()

    import pandas as pd
    import torch

    import queryrl
    from queryrl.apps.query_rewrite.eval.generation import generate_replies
    from queryrl.rollout.base import SamplingParams

    torch.set_num_threads(args.threads)
    prompts = [list(p) for p in pd.read_parquet(args.data).head(args.rows).prompt]
    params = SamplingParams(do_sample=False, max_new_tokens=args.max_new_tokens)
    wall, cpu = time.perf_counter(), time.process_time()
    replies = generate_replies(args.model, prompts, params, args.batch, "cpu", args.dtype)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{queryrl.__file__}: {len(prompts)} rows, {args.threads} threads: wall {wall:.1f} s, CPU {cpu:.1f} s")
    if args.out is not None:
        args.out.write_text(json.dumps(replies, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
