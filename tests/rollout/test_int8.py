"""``rollout.quantize=int8``: the int8 GEMM within its rounding bound, greedy decoding unchanged where the margins
allow, sampled log-probs within a stated gap of the trainer's float32 ones, both decode paths computing the same
int8 function, the copies made once while LoRA steps show, and the option's one-line refusals."""

from __future__ import annotations

import itertools
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from queryrl.config import ConfigError, load_config
from queryrl.engine.batch import Batch
from queryrl.engine.policy import compute_logprobs
from queryrl.models.vocab import restrict_head
from queryrl.rollout import HFRollout, RolloutOutput, SamplingParams, make_rollout
from queryrl.rollout.int8 import Int8Copies, Int8Linear, base_linears, hadamard, weight_levels
from queryrl.rollout.vllm import config_engine
from tests.rollout.helpers import arch_model, with_lm_head_bias, with_lora, within_rounding_bound

REPO = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(do_sample=False, max_new_tokens=12, n=1)
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=24, n=8)


@pytest.fixture(scope="module")
def sharp_lora(tiny_bundle: Any) -> nn.Module:
    """The tiny model with 8x sharper logits (greedy margins clear of int8's rounding) under LoRA."""
    tok = tiny_bundle.tokenizer
    return with_lora(with_lm_head_bias(tiny_bundle.model, tok.eos_token_id, 0.0, sharpen=8.0))


def rollout(model: nn.Module, tok: Any, prompts: list[list[int]], params: SamplingParams, **kw: Any) -> RolloutOutput:
    torch.manual_seed(0)
    return HFRollout(model, tok, **kw).generate(prompts, params)


def test_the_int8_gemm_is_within_its_rounding_bound() -> None:
    """Random layers with a few outlier input channels (as a transformer's activations have): within the bound
    above, closer than without the rotation, any input dtype in and out."""
    torch.manual_seed(0)
    w, bias = torch.randn(96, 256), torch.randn(96)
    x = torch.randn(5, 256)
    x[:, [3, 70, 200]] *= 40  # outlier channels
    q = Int8Linear(w, bias)
    assert q.block == 128
    assert within_rounding_bound(q, x, w, bias)
    err = (q(x) - F.linear(x, w, bias)).abs().mean()
    assert float(err) > 0  # it is int8, not a float copy
    flat = Int8Linear.__new__(Int8Linear)  # the same copy without the rotation
    flat.__dict__ |= q.__dict__ | {"block": 1}
    flat.scale = (w.abs().amax(1) / weight_levels()).clamp(min=1e-12)
    flat.weight_t = torch.round(w / flat.scale[:, None]).to(torch.int8).t()
    # the mean error without it: 4.0x with 8-bit weights, 2.2x with 7-bit ones (oneDNN capped to AVX2)
    assert float((flat(x) - F.linear(x, w, bias)).abs().mean()) > 1.5 * float(err)
    w_odd = torch.randn(7, 24)
    odd = Int8Linear(w_odd)  # 24 inputs: blocks of 8
    assert odd.block == 8
    assert within_rounding_bound(odd, torch.randn(3, 24), w_odd, torch.zeros(7))
    half = q(x.bfloat16())
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), q(x.bfloat16().float()).bfloat16().float(), atol=0, rtol=0)
    assert q(x.view(5, 1, 256)).shape == (5, 1, 96)
    torch.testing.assert_close(hadamard(128) @ hadamard(128).t(), torch.eye(128), atol=1e-6, rtol=0)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN's x86 ISA cap")
def test_without_vnni_weights_use_seven_bits_and_stay_exact() -> None:
    """oneDNN capped to AVX2 (no VNNI: saturating int16 pair sums, as on a float32-only CPU): the self-test picks
    7-bit weights, and the int8 layer keeps its bound there (8-bit weights would not: the GEMM saturates)."""
    code = (
        "import torch, torch.nn.functional as F\n"
        "from queryrl.rollout.int8 import Int8Linear, weight_levels\n"
        "from tests.rollout.helpers import within_rounding_bound\n"
        "torch.manual_seed(0)\n"
        "w, b, x = torch.randn(64, 256), torch.randn(64), torch.randn(16, 256) * 3\n"
        "print(weight_levels(), within_rounding_bound(Int8Linear(w, b), x, w, b))\n"
        "a, k = torch.full((16, 64), 127, dtype=torch.int8), torch.full((64, 8), 127, dtype=torch.int8)\n"
        "print(bool((torch._int_mm(a, k) == 127 * 127 * 64).all()))\n"
    )
    env = os.environ | {"ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["63", "True", "False"]


@pytest.mark.parametrize("fast_decode", ["auto", "off"])
def test_greedy_int8_equals_full_precision(
    fast_decode: str, sharp_lora: nn.Module, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """On the sharpened tiny model (top-token margins far above int8's logit error) greedy tokens are the same, and
    the recorded log-probs move by less than 0.05 (measured max 0.01)."""
    tok = tiny_bundle.tokenizer
    full = rollout(sharp_lora, tok, prompts, GREEDY, fast_decode=fast_decode)
    int8 = rollout(sharp_lora, tok, prompts, GREEDY, fast_decode=fast_decode, quantize="int8")
    assert torch.equal(full.response_ids, int8.response_ids)
    gap = (full.rollout_logprobs - int8.rollout_logprobs).abs()
    assert 0 < float(gap.max()) < 0.05


def test_both_decode_paths_compute_the_same_int8_function(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """Gemma 3's layout with LoRA (near-uniform logits, so int8 changes its greedy tokens): the fast path's int8
    copies and ``generate``'s swapped-in ones give the same tokens and log-probs, unlike full precision. Within
    0.01, not float rounding: the paths' float ops (norms, fused or separate projections) differ in their last
    bits, which can flip an activation's int8 rounding (1e-6 apart here with 8-bit weights, 5e-3 with 7-bit)."""
    tok = tiny_bundle.tokenizer
    model = with_lora(arch_model(tok, "gemma3"))
    fast = rollout(model, tok, prompts, GREEDY, quantize="int8")
    slow = rollout(model, tok, prompts, GREEDY, quantize="int8", fast_decode="off")
    assert torch.equal(fast.response_ids, slow.response_ids)
    torch.testing.assert_close(fast.rollout_logprobs, slow.rollout_logprobs, atol=0.01, rtol=0)
    full = rollout(model, tok, prompts, GREEDY)
    assert not torch.equal(full.response_ids, fast.response_ids)


def test_sampled_probs_diff_against_the_trainer_is_bounded(
    sharp_lora: nn.Module, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """``training/rollout_probs_diff``'s quantity for int8 samples against the float32 forward the update runs:
    mean < 0.005 and max < 0.05 over 960 sampled tokens (mean probability 0.6).

    Measured 0.0007 and 0.005 with 8-bit weights (VNNI), 0.001 and 0.008 with 7-bit ones (oneDNN capped to AVX2);
    the sampled tokens' log-probs moved by at most 0.05 and 0.10, and |dp| = p |e^(d log p) - 1| <= p (e^0.1 - 1)
    < 0.11 p. The bound leaves 5x room over both kernels; :func:`within_rounding_bound` is each layer's exact one.
    Full precision (the same code, quantize=none) is the control: the gap is then float rounding, < 1e-4."""
    tok = tiny_bundle.tokenizer

    def gap(**kw: Any) -> Tensor:
        out = rollout(sharp_lora, tok, prompts, SAMPLED, **kw)
        logprobs, _ = compute_logprobs(sharp_lora, Batch.from_rollout(out), 64, SAMPLED.temperature)
        return (out.rollout_logprobs.exp() - logprobs.exp()).abs()[out.response_mask > 0]

    full, int8 = gap(), gap(quantize="int8")
    assert float(full.max()) < 1e-4
    assert 0 < float(int8.mean()) < 0.005
    assert float(int8.max()) < 0.05


@pytest.mark.parametrize("fast_decode", ["auto", "off"])
def test_copies_are_made_once_while_lora_steps_show(
    fast_decode: str, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """Three rollouts with an adapter step between them make the int8 copies once; each step changes what is
    sampled (the adapters are read live); a change of a base weight makes that layer's copy again."""
    tok = tiny_bundle.tokenizer
    model = with_lora(with_lm_head_bias(tiny_bundle.model, tok.eos_token_id, 0.0, sharpen=8.0), scale=0.0)
    backend = HFRollout(model, tok, fast_decode=fast_decode, quantize="int8")
    layers = len(base_linears(model, model.get_output_embeddings()))
    start = Int8Linear.built
    first = backend.generate(prompts, GREEDY)
    made = Int8Linear.built - start
    assert 0 < made <= layers  # the fast path fuses QKV and gate/up: fewer copies than layers
    outputs = [first]
    for seed in (1, 2):
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(torch.randn_like(p) * 0.5)  # in place, as an optimizer step
        outputs.append(backend.generate(prompts, GREEDY))
    assert Int8Linear.built - start == made
    for a, b in itertools.pairwise(outputs):
        assert not torch.equal(a.rollout_logprobs, b.rollout_logprobs)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "base_layer" in n and "down_proj" in n).mul_(1.5)
    backend.generate(prompts, GREEDY)
    assert Int8Linear.built - start > made


def test_generate_swaps_back_and_skips_head_and_adapters(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """``generate``'s copies are swapped in for the call only; the output head (a restricted one too) and the LoRA
    A/B layers are never among them; the module's state dict is unchanged after the call."""
    tok = tiny_bundle.tokenizer
    model = with_lora(with_lm_head_bias(tiny_bundle.model, tok.eos_token_id, 0.0, sharpen=8.0))
    head = restrict_head(model, sorted({t for p in prompts for t in p} | {tok.eos_token_id, tok.pad_token_id}))
    found = base_linears(model, head)
    names = {n for n, m in model.named_modules() if any(m is layer for _, _, layer in found)}
    assert names
    assert all("base_layer" in n for n in names)
    assert len(found) == 7 * model.config.num_hidden_layers
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = rollout(model, tok, prompts, GREEDY, quantize="int8", fast_decode="off")
    fast = rollout(model, tok, prompts, GREEDY, quantize="int8")
    assert torch.equal(out.response_ids, fast.response_ids)  # the restricted head on both paths
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    copies = Int8Copies()
    with pytest.raises(RuntimeError, match="inside"), copies.swapped_in(model, head):
        raise RuntimeError("inside")
    assert all(getattr(parent, name) is layer for parent, name, layer in found)


def test_the_option_is_checked_in_one_line(tmp_path: Any, tiny_bundle: Any) -> None:
    tok = tiny_bundle.tokenizer
    cfg = load_config(None, ["rollout.quantize=int8", "trainer.device=cpu"])
    assert config_engine(cfg.rollout) == {"decode_graph": "off", "quantize": "int8"}
    backend = make_rollout("hf", tiny_bundle.model, tok, 8, None, "auto", None, engine=config_engine(cfg.rollout))
    assert isinstance(backend, HFRollout)
    assert backend.quantize
    assert not HFRollout(tiny_bundle.model, tok).quantize
    for overrides, message in (
        (["rollout.quantize=int4"], r"rollout.quantize='int4' is not one of: none, int8"),
        (["rollout.quantize=int8", "rollout.backend=vllm"], "needs rollout.backend=hf on a CPU"),
        (["rollout.quantize=int8", "trainer.device=cuda"], "needs rollout.backend=hf on a CPU"),
        (["rollout.quantize=int8", "rollout.decode_graph=on"], "and rollout.decode_graph=off"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)
    with pytest.raises(ValueError, match=r"runs on a CPU only"):
        HFRollout(tiny_bundle.model, tok, device=torch.device("cuda"), quantize="int8")
    with pytest.raises(ValueError, match=r"set rollout\.decode_graph=off"):
        HFRollout(tiny_bundle.model, tok, decode_graph="on", quantize="int8")
    with pytest.raises(ValueError, match="must be one of none, int8"):
        HFRollout(tiny_bundle.model, tok, quantize="int4")
