"""``rollout.quantize=int8`` against full precision on the real-model bench's GRPO run, paired; and the rollout gap
of int8 schemes on its samples.

    python benchmarks/int8_rollout.py --model runs/models/gemma3-270m \
        --data runs/bench_real_defaults/data/train.parquet   # -> benchmarks/results/int8_rollout.json

Each run is ``queryrl train`` with ``configs/query_rewrite_kdconv.yaml`` and the GRPO settings of
``benchmarks/real_model.py`` (:func:`real_model.grpo_settings`: LoRA 16 on every projection, the restricted head,
4 prompts x 4, 48-token answers, `--threads` torch threads) on `--data`, the embedded RAG over the KdConv travel
knowledge base, `--steps` steps, no validation and no checkpoint. Per dtype (float32, and bfloat16 as mixed
precision over float32 weights) the runs alternate none, int8, int8, none, ... (`--pairs` pairs), so that a change
of the machine's load falls on both arms alike; ``--avx2`` adds a float32 pair with oneDNN, ATen and MKL capped at
AVX2 (``ONEDNN_MAX_CPU_ISA`` etc.: the int8 kernels of a CPU without VNNI, whose saturation makes the weights
7-bit). The JSON holds every run's per-step ``timing_s/{gen,ref,update_actor,step}``, response lengths and
``training/rollout_probs_diff_{mean,max}`` (|p_rollout - p_train| over the trained tokens, from the update's own
log-probs: the gap the int8 rollout opens), the machine and the load average before and after.

``schemes``: the first float32 run's saved prompts (``samples/step_*.jsonl``) sampled again (4 each, seeded)
with the int8 fast path under three schemes, each gap against the float32 forward: ``per_tensor``
(``torch.ao.quantization.quantize_dynamic``'s: one 7-bit activation scale per call, per-row weights, fbgemm),
``per_row`` (one activation scale per token, no rotation) and ``rotated`` (what ``rollout.quantize=int8`` does).
Compare only numbers of one file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import write_json  # noqa: E402
from real_model import parse_args as bench_args  # noqa: E402
from vocab_head import cpu_summary, fresh_work, short_grpo_run, short_run_parser  # noqa: E402

PHASES = ("gen", "ref", "update_actor", "step")
GAP = ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max")
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def run_once(args: argparse.Namespace, dtype: str, quantize: str, index: int, avx2: bool) -> dict[str, Any]:
    """One ``queryrl train`` run; its per-step phase times, response lengths and rollout gap."""
    name = f"{'avx2_' if avx2 else ''}{dtype}_{quantize}_{index}"
    given = {"--model": args.model, "--threads": args.threads, "--grpo-steps": args.steps}
    bench = bench_args([str(x) for pair in given.items() for x in pair])
    env = os.environ | (AVX2 if avx2 else {})
    rows, wall = short_grpo_run(args, name, dtype, bench, [f"rollout.quantize={quantize}"], env)
    steps = {p: [round(float(r[f"timing_s/{p}"]), 3) for r in rows] for p in PHASES}
    lengths = [round(float(r["response_length/mean"]), 2) for r in rows]
    return {
        "name": name,
        "dtype": dtype,
        "quantize": quantize,
        "avx2": avx2,
        "wall_s": round(wall, 1),
        "steps_s": steps,
        "mean_s": {p: round(statistics.fmean(v), 3) for p, v in steps.items()},
        "response_length_per_step": lengths,
        # gen time per generated token: the arms sample responses of other lengths
        "gen_ms_per_token": round(1000 * sum(steps["gen"]) / sum(16 * x for x in lengths), 2),
        "rollout_probs_diff_mean_per_step": [r.get(GAP[0]) for r in rows],
        "rollout_probs_diff_max_per_step": [r.get(GAP[1]) for r in rows],
        "weight_levels": _weight_levels(env),
    }


def _weight_levels(env: dict[str, str]) -> int:
    """The int8 weights' levels (127, or 63 where the GEMM saturates) in a process with `env`."""
    code = "from queryrl.rollout.int8 import weight_levels; print(weight_levels())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=REPO)
    return int(out.stdout.strip())


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm (dtype, AVX2 cap): each quantize setting's mean over its runs, none / int8 (the speed-up), the gaps."""
    out: dict[str, Any] = {}
    for arm in sorted({(r["dtype"], r["avx2"]) for r in runs}):
        mine = {q: [r for r in runs if (r["dtype"], r["avx2"]) == arm and r["quantize"] == q] for q in ("none", "int8")}
        means = {
            q: {p: round(statistics.fmean(r["mean_s"][p] for r in rs), 3) for p in PHASES} for q, rs in mine.items()
        }
        per_token = {q: round(statistics.fmean(r["gen_ms_per_token"] for r in rs), 2) for q, rs in mine.items()}
        gaps = {
            q: {
                "mean": statistics.fmean(x for r in rs for x in r["rollout_probs_diff_mean_per_step"]),
                "max": max(x for r in rs for x in r["rollout_probs_diff_max_per_step"]),
            }
            for q, rs in mine.items()
        }
        out[f"{arm[0]}{'_avx2' if arm[1] else ''}"] = {
            **means,
            "speedup": {p: round(means["none"][p] / means["int8"][p], 2) for p in PHASES},
            "gen_ms_per_token": per_token,
            "rollout_probs_diff": gaps,
        }
    return out


def scheme_gaps(args: argparse.Namespace, run: Path) -> dict[str, Any]:
    """The rollout gap of three int8 schemes on `run`'s saved prompts (see the module's notes)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import queryrl.rollout.fast_decode_arch as arch
    import queryrl.rollout.int8 as int8
    from queryrl.engine.batch import Batch
    from queryrl.engine.policy import compute_logprobs
    from queryrl.models.vocab import VOCAB_FILE, read_vocab_ids, restrict_head
    from queryrl.rollout import HFRollout, SamplingParams

    class PerTensor(int8.Int8Linear):
        """quantize_dynamic's DynamicQuantizedLinear: fbgemm, per-row weights, one 7-bit activation scale a call."""

        def __init__(self, weight: Any, bias: Any = None) -> None:
            w = weight.detach().float()
            scale = (w.abs().amax(1) / 127).clamp(min=1e-12).double()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, bias.detach().float() if bias is not None else None)
            self.in_features, self.out_features, self.block = w.shape[1], w.shape[0], 1

        def __call__(self, x: Any) -> Any:
            return torch.ops.quantized.linear_dynamic(x.float(), self.packed, True).to(x.dtype)

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval().requires_grad_(False)
    restrict_head(model, read_vocab_ids(run / VOCAB_FILE))
    texts = {}
    for file in sorted((run / "samples").glob("step_*.jsonl")):
        for line in file.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            texts.setdefault(record["prompt"], record["prompt"])
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts.values()]
    params = SamplingParams(temperature=1.0, n=4, max_new_tokens=48)
    out: dict[str, Any] = {"prompts": len(prompts), "samples_per_prompt": params.n}
    original = (arch.Int8Linear, int8.ROTATION_BLOCK)
    for scheme in ("per_tensor", "per_row", "rotated"):
        arch.Int8Linear = PerTensor if scheme == "per_tensor" else original[0]  # type: ignore[misc]
        int8.ROTATION_BLOCK = 1 if scheme == "per_row" else original[1]
        torch.manual_seed(0)
        sampled = HFRollout(model, tok, quantize="int8").generate(prompts, params)
        logprobs, _ = compute_logprobs(model, Batch.from_rollout(sampled), 8, 1.0)
        mask = sampled.response_mask > 0
        gap = (sampled.rollout_logprobs.exp() - logprobs.exp()).abs()[mask]
        out[scheme] = {
            "mean": round(float(gap.mean()), 5),
            "max": round(float(gap.max()), 4),
            "tokens": int(mask.sum()),
        }
        print(scheme, out[scheme], flush=True)
    arch.Int8Linear, int8.ROTATION_BLOCK = original  # type: ignore[misc]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = short_run_parser(__doc__, "int8_rollout", "none/int8 pairs per dtype, alternating")
    parser.add_argument("--avx2", action="store_true", help="also a float32 pair with the ISA capped at AVX2")
    args = parser.parse_args(argv)
    load_before = fresh_work(args)
    if load_before is None:
        return 2
    arms = [(d, False) for d in args.dtypes.split(",")] + ([("float32", True)] if args.avx2 else [])
    runs = []
    for dtype, avx2 in arms:
        for pair in range(args.pairs):
            for quantize in ("none", "int8") if pair % 2 == 0 else ("int8", "none"):
                runs.append(run_once(args, dtype, quantize, pair, avx2))
                print(json.dumps({k: runs[-1][k] for k in ("name", "mean_s", "gen_ms_per_token")}), flush=True)
    # the machine record and the scheme comparison come from the first float32 run, else the first run
    first = next((r for r in runs if r["dtype"] == "float32" and not r["avx2"]), runs[0])
    result = {
        "command": " ".join(["python", "benchmarks/int8_rollout.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": str(args.model),
        "data": str(args.data),
        "steps": args.steps,
        "threads": args.threads,
        "machine": {
            **cpu_summary(),
            **json.loads((args.work / first["name"] / "machine.json").read_text(encoding="utf-8")),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "summary": summary(runs),
        "schemes": scheme_gaps(args, args.work / first["name"]),
        "runs": runs,
    }
    write_json(args.out, result)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
