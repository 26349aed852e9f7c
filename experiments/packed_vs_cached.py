"""The two prompt-sharing forwards timed against each other: the cached one (`shared_prompt_response_logits`,
without gradient checkpointing) and the packed one (`packed_prompt_response_logits`, what runs under it).

    python experiments/packed_vs_cached.py                      # the tiny model: 8 prompts x 8, 24 + 32 tokens
    python experiments/packed_vs_cached.py --prompt 200 --response 32 --prompts 2 --samples 4 --model DIR

One thread, the model in training mode, random prompts and responses; per path the median CPU time of a forward,
the log-probs and a backward (8 calls, the first 2 left out), two rounds alternating the paths. JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence

import torch


def main(argv: Sequence[str] | None = None) -> int:
    from queryrl.config import load_config
    from queryrl.engine.batch import Batch
    from queryrl.engine.policy import (
        logprobs_from_logits,
        packed_prompt_response_logits,
        prompt_groups,
        shared_prompt_response_logits,
    )
    from queryrl.models import load_policy

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=24, help="prompt tokens")
    parser.add_argument("--response", type=int, default=32, help="response tokens")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--model", default=None, help="a model folder (default: the built-in tiny Qwen2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_config("configs/toy_grpo.yaml", [f"model.path={args.model}"] if args.model else [])
    policy = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False)
    model = policy.model.train()
    vocab = len(policy.tokenizer)
    gen = torch.Generator().manual_seed(0)
    order = torch.arange(args.prompts).repeat_interleave(args.samples)
    n = len(order)
    ones = torch.ones(n, args.response)
    batch = Batch(
        prompt_ids=torch.randint(3, vocab, (args.prompts, args.prompt), generator=gen)[order],
        prompt_mask=torch.ones(n, args.prompt, dtype=torch.long),
        response_ids=torch.randint(3, vocab, (n, args.response), generator=gen),
        response_attention_mask=ones.long(),
        response_mask=ones,
        group_ids=order,
    )
    groups = prompt_groups(batch)
    assert groups is not None
    paths = {"cached": shared_prompt_response_logits, "packed": packed_prompt_response_logits}
    medians: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(2):
        for name, forward in paths.items():
            times = []
            for _ in range(8):
                start = time.process_time()
                logprobs = logprobs_from_logits(forward(model, batch, *groups), batch.response_ids)
                (logprobs * batch.response_mask).sum().backward()
                model.zero_grad(set_to_none=True)
                times.append(time.process_time() - start)
            medians[name].append(round(statistics.median(times[2:]), 4))
    print(json.dumps({"settings": vars(args), "median_cpu_s_per_round": medians}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
