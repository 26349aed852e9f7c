"""Generation CPU time of a LoRA policy right after an adapter change, with the queryrl of a given checkout.

    python experiments/generation_after_step.py REPO MODEL_FOLDER CALLS [--profile]

Measures a generation lever across commits: REPO is a checkout (e.g. a worktree of an earlier commit)
whose ``queryrl`` is imported instead of the installed one; MODEL_FOLDER a causal LM (e.g.
``runs/bench_models/qwen2-0.5b-shape-random-l24`` that ``make bench-trl-real`` builds). LoRA r16 on all
seven projections; each call adds 1e-4 to every ``lora_B`` first (as an optimizer step changes the
adapters), then samples 2 prompts of 200 tokens x 4 samples x 32 tokens with ``HFRollout``; one thread.
Prints the checkout's queryrl, the decode path and the CPU seconds of each call; with ``--profile``, the last
call runs under ``torch.profiler`` and the 12 ops with the most CPU time are printed by input shape.
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    repo, folder, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    profile = "--profile" in sys.argv[4:]
    # the installed (editable) queryrl is found by a meta-path finder before sys.path: drop it
    sys.meta_path = [f for f in sys.meta_path if "editable" not in f"{type(f).__module__}.{type(f).__name__}".lower()]
    sys.path.insert(0, repo)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import queryrl
    from queryrl.rollout.base import SamplingParams
    from queryrl.rollout.hf import HFRollout

    if not str(queryrl.__file__).startswith(repo):
        raise SystemExit(f"imported {queryrl.__file__}, not the checkout {repo}")
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
        LoraConfig(r=16, lora_alpha=32, target_modules=targets),
    )
    rollout = HFRollout(model, tokenizer, micro_batch_size=8)
    prompts = [list(range(5, 205)), list(range(7, 207))]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=32)
    rollout.generate(prompts, params)
    seconds: list[float] = []
    for _ in range(calls):
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.add_(1e-4)
        profiler = torch.profiler.profile(record_shapes=True) if profile and len(seconds) == calls - 1 else None
        start = time.process_time()
        if profiler is None:
            rollout.generate(prompts, params)
        else:
            with profiler:
                rollout.generate(prompts, params)
        seconds.append(round(time.process_time() - start, 2))
        if profiler is not None:
            averages = profiler.key_averages(group_by_input_shape=True)
            print(averages.table(sort_by="self_cpu_time_total", row_limit=12, max_shapes_column_width=50))
    print(queryrl.__file__, rollout.decode_path, seconds)


if __name__ == "__main__":
    main()
