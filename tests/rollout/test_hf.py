"""The ``hf`` rollout backend on the tiny model: padding, EOS masking, ordering, log-probs, determinism.

Every test runs three times: on the fast decode path (``fast_decode="auto"``, which the tiny Qwen2 takes),
on its static step (``"graph"``: ``decode_graph="on"``, run eagerly on a CPU) and on transformers'
``generate`` (``"off"``).
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from queryrl.rollout import HFRollout, RolloutOutput, SamplingParams
from queryrl.rollout.graph_decode import GraphDecoder
from tests.rollout.helpers import with_lm_head_bias

GREEDY = SamplingParams(do_sample=False, max_new_tokens=8)
FAST_DECODE = "auto"


@pytest.fixture(autouse=True, params=["auto", "graph", "off"])
def fast_decode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The decode path every ``rollout(...)`` of the test takes."""
    monkeypatch.setattr(sys.modules[__name__], "FAST_DECODE", request.param)
    return str(request.param)


def rollout(model: nn.Module, tokenizer: Any, micro_batch_size: int = 64) -> HFRollout:
    if FAST_DECODE == "graph":
        return HFRollout(model, tokenizer, micro_batch_size=micro_batch_size, decode_graph="on")
    return HFRollout(model, tokenizer, micro_batch_size=micro_batch_size, fast_decode=FAST_DECODE)


def reference_logprobs(model: nn.Module, out: RolloutOutput, temperature: float) -> Tensor:
    """The slow reference: one full forward pass over prompt + response, as the trainer will do.

    Returns (N, T) ``log_softmax(logits / temperature)`` at the response tokens, 0 on padding.
    """
    p = out.prompt_ids.shape[1]
    input_ids = torch.cat([out.prompt_ids, out.response_ids], dim=1)  # (N, P + T)
    attention_mask = torch.cat([out.prompt_mask, out.response_mask.long()], dim=1)  # (N, P + T)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (N, P + T)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logprobs = torch.log_softmax(logits[:, p - 1 : -1].float() / temperature, dim=-1)  # (N, T, V)
    return logprobs.gather(-1, out.response_ids[..., None]).squeeze(-1) * out.response_mask  # (N, T)


def first_eos(row: list[int], eos: int) -> int | None:
    return row.index(eos) if eos in row else None


def test_both_decode_paths_are_tested(fast_decode: str, tiny_bundle: Any) -> None:
    expected = {"auto": "fast", "graph": "fast", "off": "generate"}[fast_decode]
    backend = rollout(tiny_bundle.model, tiny_bundle.tokenizer)
    assert backend.decode_path == expected
    assert isinstance(backend._fast_decoder(), GraphDecoder) == (fast_decode == "graph")


def test_shapes_dtypes_and_padding(eos_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    tok = tiny_bundle.tokenizer
    torch.manual_seed(0)
    out = rollout(eos_model, tok, micro_batch_size=4).generate(prompts, SamplingParams(n=3, max_new_tokens=8))
    n_rows, p = len(prompts) * 3, max(len(x) for x in prompts)
    assert len(out) == n_rows
    assert out.prompt_ids.shape == out.prompt_mask.shape == (n_rows, p)
    t = out.response_ids.shape[1]
    assert 1 <= t <= 8
    assert out.response_mask.shape == out.rollout_logprobs.shape == (n_rows, t)
    assert out.prompt_index.shape == out.truncated.shape == (n_rows,)
    assert out.prompt_ids.dtype == out.prompt_mask.dtype == out.response_ids.dtype == out.prompt_index.dtype
    assert out.prompt_ids.dtype == torch.long
    assert out.response_mask.dtype == out.rollout_logprobs.dtype == torch.float32
    assert out.truncated.dtype == torch.bool
    for row in range(n_rows):
        prompt = prompts[int(out.prompt_index[row])]
        assert out.prompt_ids[row, p - len(prompt) :].tolist() == prompt  # left-padded
        assert (out.prompt_ids[row, : p - len(prompt)] == tok.pad_token_id).all()
        assert out.prompt_mask[row].tolist() == [0] * (p - len(prompt)) + [1] * len(prompt)
    off = out.response_mask == 0
    assert (out.response_ids[off] == tok.pad_token_id).all()
    assert (out.rollout_logprobs[off] == 0).all()
    assert (out.rollout_logprobs[~off] < 0).all()
    assert out.response_mask[:, 0].all()  # every response has at least one token


def test_response_mask_ends_at_the_first_eos(eos_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    eos = tiny_bundle.tokenizer.eos_token_id
    torch.manual_seed(1)
    out = rollout(eos_model, tiny_bundle.tokenizer).generate(prompts, SamplingParams(n=4, max_new_tokens=8))
    lengths = []
    rows = zip(out.response_ids.tolist(), out.response_mask.tolist(), out.truncated.tolist(), strict=True)
    for ids, mask, truncated in rows:
        e = first_eos(ids, eos)
        if e is None:  # no EOS: every one of the max_new_tokens generated tokens counts
            assert truncated
            assert len(ids) == 8
            assert mask == [1.0] * 8
            lengths.append(8)
        else:
            assert not truncated
            assert mask == [1.0] * (e + 1) + [0.0] * (len(ids) - e - 1)
            lengths.append(e + 1)
    # the seeded case has both kinds, and EOS at several positions
    assert any(out.truncated.tolist())
    assert not all(out.truncated.tolist())
    assert len(set(lengths)) >= 4
    assert out.response_lengths.tolist() == lengths


def test_certain_eos_stops_after_one_token(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    tok = tiny_bundle.tokenizer
    model = with_lm_head_bias(tiny_bundle.model, tok.eos_token_id, 100.0)
    out = rollout(model, tok).generate(prompts, GREEDY)
    assert out.response_ids.tolist() == [[tok.eos_token_id]] * len(prompts)
    assert out.response_mask.tolist() == [[1.0]] * len(prompts)
    assert not out.truncated.any()
    assert torch.allclose(out.rollout_logprobs, torch.zeros(len(prompts), 1), atol=1e-6)  # p(EOS) = 1


def test_rows_are_prompt_major(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    n = 3
    torch.manual_seed(0)
    out = rollout(tiny_bundle.model, tiny_bundle.tokenizer, micro_batch_size=4).generate(
        prompts, SamplingParams(n=n, max_new_tokens=4)
    )
    assert out.prompt_index.tolist() == [i for i in range(len(prompts)) for _ in range(n)]
    for row in range(len(out)):
        real = out.prompt_ids[row][out.prompt_mask[row].bool()]
        assert real.tolist() == prompts[row // n]


def test_samples_of_one_prompt_differ(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    n = 4
    torch.manual_seed(0)
    out = rollout(tiny_bundle.model, tiny_bundle.tokenizer).generate(prompts, SamplingParams(n=n, max_new_tokens=6))
    for i in range(len(prompts)):
        group = {tuple(r) for r in out.response_ids[i * n : (i + 1) * n].tolist()}
        assert len(group) == n


@pytest.mark.parametrize("model_name", ["base", "sharp"])
def test_greedy_is_deterministic_and_micro_batch_invariant(
    model_name: str, tiny_bundle: Any, sharp_model: nn.Module, prompts: list[list[int]]
) -> None:
    model = tiny_bundle.model if model_name == "base" else sharp_model
    outs = [rollout(model, tiny_bundle.tokenizer, mb).generate(prompts, GREEDY) for mb in (64, 64, 1, 2, 3)]
    for out in outs[1:]:
        assert torch.equal(out.response_ids, outs[0].response_ids)
        assert torch.equal(out.response_mask, outs[0].response_mask)
        torch.testing.assert_close(out.rollout_logprobs, outs[0].rollout_logprobs, atol=1e-5, rtol=0)
    assert torch.equal(outs[0].rollout_logprobs, outs[1].rollout_logprobs)  # same call twice: bitwise


def test_left_padding_gives_the_same_greedy_continuation_as_alone(
    sharp_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    backend = rollout(sharp_model, tiny_bundle.tokenizer)
    batched = backend.generate(prompts, GREEDY)
    for i, prompt in enumerate(prompts):
        alone = backend.generate([prompt], GREEDY)
        assert alone.prompt_mask.all()  # no padding at all
        length = int(alone.response_mask.sum())
        assert batched.response_ids[i, :length].tolist() == alone.response_ids[0, :length].tolist()
        assert int(batched.response_mask[i].sum()) == length
        torch.testing.assert_close(
            batched.rollout_logprobs[i, :length], alone.rollout_logprobs[0, :length], atol=1e-5, rtol=0
        )


@pytest.mark.parametrize(
    ("model_name", "params"),
    [
        ("base", SamplingParams(temperature=1.0, max_new_tokens=8, n=2)),
        ("base", SamplingParams(temperature=0.7, max_new_tokens=8, n=2)),
        ("eos", SamplingParams(temperature=1.0, max_new_tokens=8, n=2)),
        ("eos", SamplingParams(temperature=0.7, max_new_tokens=8, n=2)),
        # truncation changes what is sampled, never the recorded log-probs (verl's convention)
        ("sharp", SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=8, n=2)),
        ("sharp", SamplingParams(do_sample=False, temperature=0.0, max_new_tokens=8)),  # greedy: T = 1
    ],
)
def test_rollout_logprobs_match_a_full_forward_pass(
    model_name: str,
    params: SamplingParams,
    tiny_bundle: Any,
    sharp_model: nn.Module,
    eos_model: nn.Module,
    prompts: list[list[int]],
) -> None:
    model = {"base": tiny_bundle.model, "sharp": sharp_model, "eos": eos_model}[model_name]
    torch.manual_seed(0)
    out = rollout(model, tiny_bundle.tokenizer, micro_batch_size=4).generate(prompts, params)
    expected = reference_logprobs(model, out, params.logprob_temperature)
    torch.testing.assert_close(out.rollout_logprobs, expected, atol=1e-4, rtol=0)
    if model_name == "eos":  # the case covers responses of mixed lengths (right padding in the reference)
        assert len(set(out.response_lengths.tolist())) > 1


def test_top_k_1_sampling_equals_greedy(sharp_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    backend = rollout(sharp_model, tiny_bundle.tokenizer)
    greedy = backend.generate(prompts, GREEDY)
    torch.manual_seed(0)
    top1 = backend.generate(prompts, SamplingParams(top_k=1, max_new_tokens=GREEDY.max_new_tokens))
    assert torch.equal(top1.response_ids, greedy.response_ids)
    # at temperature 1 the recorded log-probs are those of the untruncated distribution, as greedy's
    torch.testing.assert_close(top1.rollout_logprobs, greedy.rollout_logprobs, atol=1e-6, rtol=0)


def test_seeded_sampling_is_reproducible(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    backend = rollout(tiny_bundle.model, tiny_bundle.tokenizer, micro_batch_size=4)
    params = SamplingParams(n=2, temperature=0.9, top_p=0.95, max_new_tokens=6)
    runs = []
    for seed in (123, 123, 124):
        torch.manual_seed(seed)
        runs.append(backend.generate(prompts, params))
    assert torch.equal(runs[0].response_ids, runs[1].response_ids)
    assert torch.equal(runs[0].rollout_logprobs, runs[1].rollout_logprobs)
    assert not torch.equal(runs[0].response_ids, runs[2].response_ids)


def test_chunks_concatenate_to_generate(eos_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    backend = rollout(eos_model, tiny_bundle.tokenizer, micro_batch_size=3)
    params = SamplingParams(n=2, do_sample=False, max_new_tokens=8)
    chunks = list(backend.generate_chunks(prompts, params))
    assert [len(c) for c in chunks] == [3, 3, 3, 1]  # 5 prompts x 2 samples, by sequence
    assert chunks[1].prompt_index.tolist() == [1, 2, 2]  # absolute, and a prompt may straddle two chunks
    whole = backend.generate(prompts, params)
    joined = RolloutOutput.concat(chunks, tiny_bundle.tokenizer.pad_token_id)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "prompt_index", "truncated"):
        assert torch.equal(getattr(joined, name), getattr(whole, name)), name
    torch.testing.assert_close(joined.rollout_logprobs, whole.rollout_logprobs, atol=1e-6, rtol=0)


def test_update_weights_copies_from_another_module(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    tok = tiny_bundle.tokenizer
    generator = copy.deepcopy(tiny_bundle.model)
    trained = copy.deepcopy(tiny_bundle.model)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in trained.parameters():
            param.add_(0.05 * torch.randn_like(param))
    backend = rollout(generator, tok)
    before = backend.generate(prompts, GREEDY)
    backend.update_weights(trained)
    after = backend.generate(prompts, GREEDY)
    expected = rollout(trained, tok).generate(prompts, GREEDY)
    assert not torch.equal(before.response_ids, after.response_ids)
    assert torch.equal(after.response_ids, expected.response_ids)
    assert backend.model is generator  # copied in place, not replaced
    for name, value in trained.state_dict().items():
        assert torch.equal(generator.state_dict()[name], value), name


def test_update_weights_is_a_no_op_when_colocated(tiny_bundle: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = rollout(tiny_bundle.model, tiny_bundle.tokenizer)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the colocated model must not be copied onto itself")

    monkeypatch.setattr(tiny_bundle.model, "load_state_dict", fail)
    backend.update_weights(tiny_bundle.model)


def test_update_weights_is_strict(tiny_bundle: Any) -> None:
    backend = rollout(copy.deepcopy(tiny_bundle.model), tiny_bundle.tokenizer)
    with pytest.raises(RuntimeError, match="state_dict"):
        backend.update_weights(nn.Linear(2, 2))


def test_generation_restores_train_mode(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    model = copy.deepcopy(tiny_bundle.model).train()
    model.model.layers[0].eval()  # a submodule's own mode is restored too, not just the root's
    seen: list[bool] = []
    model.model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    out = rollout(model, tiny_bundle.tokenizer).generate(prompts[:2], SamplingParams(n=2, max_new_tokens=3))
    assert seen
    assert not any(seen)  # generated in eval mode (no dropout)
    assert model.training
    assert model.model.training
    assert not model.model.layers[0].training
    assert model.model.layers[1].training
    assert not out.rollout_logprobs.requires_grad


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # inside peft
def test_peft_model(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    from peft import LoraConfig, get_peft_model

    tok = tiny_bundle.tokenizer
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft_model = get_peft_model(copy.deepcopy(tiny_bundle.model), cfg)
    # LoRA B starts at zero: the adapted model is the base model until trained
    base = rollout(tiny_bundle.model, tok).generate(prompts, GREEDY)
    adapted = rollout(peft_model, tok).generate(prompts, GREEDY)
    assert torch.equal(adapted.response_ids, base.response_ids)
    torch.testing.assert_close(adapted.rollout_logprobs, base.rollout_logprobs, atol=1e-5, rtol=0)
    # and the log-probs match a full forward pass of the peft model once the adapters do something
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    torch.manual_seed(0)
    out = rollout(peft_model, tok).generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=6))
    torch.testing.assert_close(out.rollout_logprobs, reference_logprobs(peft_model, out, 0.7), atol=1e-4, rtol=0)
    assert not torch.equal(rollout(peft_model, tok).generate(prompts, GREEDY).response_ids, base.response_ids)


def test_no_eos_runs_to_max_new_tokens(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    tok = tiny_bundle.tokenizer
    model = with_lm_head_bias(tiny_bundle.model, tok.eos_token_id, -100.0)  # EOS impossible
    torch.manual_seed(0)
    out = rollout(model, tok).generate(prompts, SamplingParams(n=2, max_new_tokens=5))
    assert out.response_ids.shape[1] == 5
    assert out.truncated.all()
    assert out.response_mask.all()


def test_empty_prompt_is_an_error(tiny_bundle: Any) -> None:
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        rollout(tiny_bundle.model, tiny_bundle.tokenizer).generate([[1, 2], []], GREEDY)


def test_no_prompts_give_an_empty_output(tiny_bundle: Any) -> None:
    assert len(rollout(tiny_bundle.model, tiny_bundle.tokenizer).generate([], GREEDY)) == 0


def test_the_models_generation_config_does_not_change_sampling(
    sharp_model: nn.Module, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    """A checkpoint's generation_config (Qwen ships repetition_penalty, top_k, ...) adds no processors."""
    tok = tiny_bundle.tokenizer
    opinionated = copy.deepcopy(sharp_model)
    gen = opinionated.generation_config  # type: ignore[union-attr]
    gen.repetition_penalty, gen.no_repeat_ngram_size, gen.top_k, gen.top_p = 1.5, 2, 3, 0.5
    gen.min_new_tokens, gen.suppress_tokens = 4, [tok.eos_token_id]
    params = SamplingParams(n=2, temperature=0.8, max_new_tokens=8)
    outs = []
    for model in (sharp_model, opinionated):
        torch.manual_seed(0)
        outs.append(rollout(model, tok).generate(prompts, params))
    assert torch.equal(outs[0].response_ids, outs[1].response_ids)
    assert torch.equal(outs[0].rollout_logprobs, outs[1].rollout_logprobs)
