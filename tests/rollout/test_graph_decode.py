"""The static decode step (``rollout.decode_graph``) against the fast path's dynamic one: the same greedy tokens
and log-probs (float32) on Qwen2, Llama and Gemma 3 (sliding-window layers) with LoRA, left-padded prompts of
different lengths and rows that finish early; seeded sampling; the kept graph's buffers across calls.

On a CPU the step runs eagerly, the same code a CUDA graph records (gpu-check times the graph on a GPU; the
last test here runs where CUDA is visible).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

from queryrl.config import ConfigError, load_config
from queryrl.engine.batch import Batch
from queryrl.engine.policy import compute_logprobs
from queryrl.rollout import HFRollout, SamplingParams, make_rollout
from queryrl.rollout.base import left_pad
from queryrl.rollout.fast_decode import FastDecoder
from queryrl.rollout.graph_decode import SLOT_MULTIPLE, GraphDecoder, graph_on
from queryrl.rollout.vllm import config_engine
from tests.rollout.helpers import GREEDY, arch_model, assert_same_greedy, build, tiny_config, with_lm_head_bias
from tests.rollout.helpers import with_lora as lora_copy

# EOS bias on the lm_head that makes greedy rows of the five prompts end at different steps (or not at all
# within 12 tokens): Qwen2 [6, 3, -, -, 5], Llama [0, -, 0, 1, 8], Gemma 3 [-, -, 1, 6, -] (EOS at those indices)
EARLY_EOS = {"qwen2": 0.55, "llama": 0.7, "gemma3": 0.4}
LONG = SamplingParams(do_sample=False, max_new_tokens=12, n=1)


def lora_model(tokenizer: Any, name: str, eos_bias: float = 0.0) -> nn.Module:
    base = build(tiny_config(tokenizer)) if name == "qwen2" else arch_model(tokenizer, name)
    return lora_copy(with_lm_head_bias(base, tokenizer.eos_token_id, eos_bias))


def decode(decoder: FastDecoder, prompts: list[list[int]], params: SamplingParams, tok: Any) -> tuple[Tensor, Tensor]:
    ids, mask = left_pad(prompts, tok.pad_token_id)
    return decoder.generate(ids, mask, params, tok.eos_token_id, tok.pad_token_id)


def assert_same(a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor]) -> None:
    assert torch.equal(a[0], b[0])
    torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(EARLY_EOS))
def test_static_step_equals_the_dynamic_one(name: str, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """Greedy tokens equal, log-probs within 1e-5; rows end at different steps and the output stops where the
    last row ended, as the dynamic path's."""
    tok = tiny_bundle.tokenizer
    model = lora_model(tok, name, EARLY_EOS[name])
    dynamic = decode(FastDecoder(model), prompts, LONG, tok)
    static = decode(GraphDecoder(model), prompts, LONG, tok)
    assert_same(static, dynamic)
    ends = {int((r == tok.eos_token_id).nonzero()[0]) if (r == tok.eos_token_id).any() else None for r in dynamic[0]}
    assert len(ends) >= 3, ends  # rows finishing early, at different steps
    # and without the EOS bias: every row runs to the limit
    model = lora_model(tok, name)
    assert_same(decode(GraphDecoder(model), prompts, LONG, tok), decode(FastDecoder(model), prompts, LONG, tok))


def test_sliding_window_layers_see_only_their_window(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """Qwen2 with a sliding second layer (window 4, shorter than every prompt): equal to the dynamic path; with
    the window's mask dropped the log-probs differ, so the test would see a wrong window."""
    tok = tiny_bundle.tokenizer
    model = lora_copy(arch_model(tok, "qwen2_sliding"))
    dynamic = decode(FastDecoder(model), prompts, LONG, tok)
    assert_same(decode(GraphDecoder(model), prompts, LONG, tok), dynamic)
    unwindowed = GraphDecoder(model)
    original = unwindowed._weights

    def no_window() -> Any:
        w = original()
        for layer in w.layers:
            layer.window = None
        return w

    unwindowed._weights = no_window  # type: ignore[method-assign]
    wrong = decode(unwindowed, prompts, LONG, tok)
    assert not torch.allclose(wrong[1][:, 1:], dynamic[1][:, 1:], atol=1e-3)


def test_rollout_with_a_kept_graph_across_calls_and_adapter_steps(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """``decode_graph=on`` through HFRollout: a smaller last micro-batch reuses the buffers (padded rows), other
    prompt widths reuse them, and after an optimizer step on the adapters the static path still equals the
    dynamic one (the adapters are copied into the graph's buffers)."""
    tok = tiny_bundle.tokenizer
    model = lora_model(tok, "llama", EARLY_EOS["llama"])
    params = SamplingParams(do_sample=False, max_new_tokens=12, n=3)  # 15 rows: 4 + 4 + 4 + 3
    static = HFRollout(model, tok, micro_batch_size=4, decode_graph="on")
    dynamic = HFRollout(model, tok, micro_batch_size=4)
    decoder = static._fast_decoder()
    assert isinstance(decoder, GraphDecoder)
    assert not isinstance(dynamic._fast_decoder(), GraphDecoder)
    assert_same_greedy(static.generate(prompts, params), dynamic.generate(prompts, params))
    kept = decoder._static
    assert kept is not None
    assert kept.rows == 4
    narrower = SamplingParams(do_sample=False, max_new_tokens=12, n=4)  # 8 rows of two prompts, narrower
    assert_same_greedy(static.generate(prompts[:2], narrower), dynamic.generate(prompts[:2], narrower))
    assert decoder._static is kept
    adapters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(adapters, lr=0.01)
    for param in adapters:
        param.grad = torch.randn_like(param)
    before = static.generate(prompts, params)
    optimizer.step()
    after = static.generate(prompts, params)
    assert decoder._static is kept  # same base weights: the same buffers, the new adapters copied in
    assert_same_greedy(after, dynamic.generate(prompts, params))
    assert not torch.equal(after.rollout_logprobs, before.rollout_logprobs)


def test_new_buffers_when_the_shapes_or_weights_change(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    tok = tiny_bundle.tokenizer
    model = lora_model(tok, "qwen2")
    decoder = GraphDecoder(model)
    decode(decoder, prompts, GREEDY, tok)
    first = decoder._static
    assert first is not None
    assert first.slots % SLOT_MULTIPLE == 0
    decode(decoder, prompts[:1], GREEDY, tok)  # 1 row of 5: the kept buffers would be mostly padding
    assert decoder._static is not first
    assert decoder._static is not None
    assert decoder._static.rows == 1
    second = decoder._static
    with model.disable_adapter():  # type: ignore[operator]
        off = decode(decoder, prompts[:1], GREEDY, tok)
        assert decoder._static is not second  # no adapters: other weights
        assert_same(off, decode(FastDecoder(model), prompts[:1], GREEDY, tok))


def test_seeded_sampling_is_reproducible_and_its_logprobs_are_the_trainers(
    tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    tok = tiny_bundle.tokenizer
    model = lora_model(tok, "gemma3", 0.4)
    backend = HFRollout(model, tok, decode_graph="on")
    params = SamplingParams(n=4, temperature=0.7, top_k=30, top_p=0.9, max_new_tokens=10)
    torch.manual_seed(0)
    out = backend.generate(prompts, params)
    torch.manual_seed(0)
    again = backend.generate(prompts, params)
    assert torch.equal(out.response_ids, again.response_ids)
    assert torch.equal(out.rollout_logprobs, again.rollout_logprobs)
    torch.manual_seed(1)
    assert not torch.equal(backend.generate(prompts, params).response_ids, out.response_ids)
    assert len({tuple(r) for r in out.response_ids.tolist()}) > len(prompts)  # sampled, not one row per prompt
    logprobs, _ = compute_logprobs(model, Batch.from_rollout(out), micro_batch_size=8, temperature=0.7)
    torch.testing.assert_close(out.rollout_logprobs, logprobs * out.response_mask, atol=1e-5, rtol=0)


def test_decode_graph_modes_and_config(tiny_bundle: Any) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert [graph_on(m, cpu) for m in ("off", "on", "auto")] == [False, True, False]
    assert [graph_on(m, cuda) for m in ("off", "on", "auto")] == [False, True, True]
    with pytest.raises(ValueError, match="decode_graph must be one of"):
        HFRollout(tiny_bundle.model, tiny_bundle.tokenizer, decode_graph="yes")
    cfg = load_config(None, ["rollout.decode_graph=on"])
    assert cfg.rollout.decode_graph == "on"
    backend = make_rollout("hf", tiny_bundle.model, tiny_bundle.tokenizer, engine=config_engine(cfg.rollout))
    assert isinstance(backend, HFRollout)
    assert isinstance(backend._fast_decoder(), GraphDecoder)
    assert load_config(None, []).rollout.decode_graph == "off"
    with pytest.raises(ConfigError, match=r"rollout\.decode_graph"):
        load_config(None, ["rollout.decode_graph=always"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (gpu-check runs it on a lent GPU)")
def test_cuda_graph_replays_the_dynamic_paths_tokens(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    tok = tiny_bundle.tokenizer
    model = lora_model(tok, "gemma3", EARLY_EOS["gemma3"]).cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    decoder = GraphDecoder(model)
    dynamic = decode(FastDecoder(model), prompts, LONG, tok)
    assert_same(decode(decoder, prompts, LONG, tok), dynamic)
    assert_same(decode(decoder, prompts, LONG, tok), dynamic)
    assert decoder.captures == 1
