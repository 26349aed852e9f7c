"""What a rollout engine receives (queryrl.rollout.sync) and the vllm backend against the CPU stand-in of vLLM 0.32.

The weights must be plain full tensors equal to the merged model, ``W + scaling * B @ A``, in new
tensors; the trainer's parameters must not change by a single bit. The stand-in engine
(tests/rollout/fake_vllm) loads them the way vLLM's default loader does and generates with its
own copy, so its greedy tokens show what a real engine would sample after the sync.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from queryrl.models.loading import set_compute_dtype
from queryrl.rollout import SamplingParams, make_rollout
from queryrl.rollout.sync import rollout_weights
from tests.rollout.helpers import with_lora

GREEDY = SamplingParams(n=1, do_sample=False, max_new_tokens=8)


def merged_reference(model: nn.Module) -> dict[str, torch.Tensor]:
    """The plain state dict of `model` with its adapters merged, computed the slow way: a copy, merged by peft."""
    if not hasattr(model, "peft_config"):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    merged = copy.deepcopy(model).merge_and_unload()  # type: ignore[operator]
    return {k: v.detach().clone() for k, v in merged.state_dict().items()}


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_full_model_weights_are_its_state_dict_in_new_tensors(tiny_bundle: Any) -> None:
    model = tiny_bundle.model
    before = snapshot(model)
    weights = dict(rollout_weights(model))
    assert weights.keys() == model.state_dict().keys()  # tied weights under each name, as the state dict has them
    params = {p.data_ptr() for p in model.parameters()}
    for name, value in weights.items():
        assert torch.equal(value, before[name]), name
        assert value.data_ptr() not in params  # a copy: an engine writing into it cannot reach the trainer
    assert_bitwise(snapshot(model), before)


def test_lora_weights_are_the_merged_base_and_the_trainer_is_untouched(tiny_bundle: Any) -> None:
    model = with_lora(tiny_bundle.model)
    before = snapshot(model)
    reference = merged_reference(model)
    weights = dict(rollout_weights(model))
    assert weights.keys() == reference.keys()  # the plain model's names: what vLLM's load_weights expects
    worst = max((weights[k] - reference[k]).abs().max().item() for k in reference)
    assert worst < 1e-6
    base = tiny_bundle.model.state_dict()
    q = next(k for k in weights if k.endswith("q_proj.weight"))
    assert (weights[q] - base[q]).abs().max().item() > 1e-3  # the adapter is in
    assert_bitwise(snapshot(model), before)


def test_lora_in_mixed_precision_is_merged_in_float32_and_cast_to_the_engine_dtype(tiny_bundle: Any) -> None:
    model = with_lora(copy.deepcopy(tiny_bundle.model).to(torch.bfloat16))
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # peft's layout: float32 adapters over a bf16 base
    before = snapshot(model)
    weights = dict(rollout_weights(model, torch.bfloat16))
    assert {v.dtype for v in weights.values() if v.is_floating_point()} == {torch.bfloat16}
    layer: Any = model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj")  # type: ignore[union-attr]
    expected = layer.base_layer.weight.float() + layer.scaling["default"] * (
        layer.lora_B["default"].weight.float() @ layer.lora_A["default"].weight.float()
    )
    assert torch.equal(weights["model.layers.0.self_attn.q_proj.weight"], expected.to(torch.bfloat16))
    assert_bitwise(snapshot(model), before)


def test_disabled_adapters_give_the_base_weights(tiny_bundle: Any) -> None:
    model = with_lora(tiny_bundle.model)
    with model.disable_adapter():  # type: ignore[operator]
        weights = dict(rollout_weights(model))
    assert_bitwise(weights, dict(tiny_bundle.model.state_dict()))


@pytest.mark.parametrize(
    ("extra", "message"), [({"use_dora": True}, "DoRA"), ({"lora_bias": True}, "lora_bias")], ids=["dora", "lora_bias"]
)
def test_adapters_that_are_not_one_matrix_are_refused_with_the_layer(
    tiny_bundle: Any, extra: dict[str, Any], message: str
) -> None:
    model = with_lora(tiny_bundle.model, **extra)
    with pytest.raises(ValueError, match=message) as info:
        dict(rollout_weights(model))
    assert "layers.0.self_attn.q_proj" in str(info.value)


def test_merged_adapters_are_refused(tiny_bundle: Any) -> None:
    model = with_lora(tiny_bundle.model)
    model.merge_adapter()  # type: ignore[operator]
    with pytest.raises(ValueError, match="merged"):
        dict(rollout_weights(model))


# --- the vllm backend on the stand-in -----------------------------------------------------------------


def test_the_stand_in_refuses_a_shard_as_vllms_loader_does(fake_vllm: Any, tiny_bundle: Any) -> None:
    """What the FSDP bug looked like: half a weight handed to a full-size parameter."""
    model = fake_vllm.StandInModel(str(tiny_bundle.path), torch.float32)
    name, weight = next(iter(rollout_weights(tiny_bundle.model)))
    with pytest.raises(AssertionError, match="Attempted to load weight"):
        model.load_weights([(name, weight[: weight.shape[0] // 2])])


def test_vllm_backend_syncs_lora_weights_and_generates_like_the_merged_model(
    fake_vllm: Any, tiny_bundle: Any, prompts: list[list[int]]
) -> None:
    model = with_lora(tiny_bundle.model, scale=0.2)  # adapters strong enough to change greedy tokens
    before = snapshot(model)
    backend = make_rollout("vllm", model, tiny_bundle.tokenizer, micro_batch_size=2)
    (llm,) = fake_vllm.LLM.instances
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.kwargs["dtype"] == "float32"
    assert llm.calls[:3] == ["apply_model", "reset_prefix_cache", "sleep(1)"]  # start-up: the trainer's weights
    reference = merged_reference(model)
    engine = llm.model.lm.state_dict()
    assert max((engine[k] - reference[k]).abs().max().item() for k in reference) < 1e-6
    assert_bitwise(snapshot(model), before)

    out = backend.generate(prompts, GREEDY)
    assert out.prompt_index.tolist() == list(range(len(prompts)))
    merged = copy.deepcopy(model).merge_and_unload().eval()  # type: ignore[operator]
    base_out = make_rollout("hf", tiny_bundle.model, tiny_bundle.tokenizer, fast_decode="off").generate(prompts, GREEDY)
    hf_out = make_rollout("hf", merged, tiny_bundle.tokenizer, fast_decode="off").generate(prompts, GREEDY)
    assert torch.equal(out.response_ids, hf_out.response_ids)  # the engine samples what the trained model would
    assert not torch.equal(hf_out.response_ids, base_out.response_ids)  # the adapters matter to the tokens
    torch.testing.assert_close(out.rollout_logprobs, hf_out.rollout_logprobs, atol=1e-5, rtol=0)

    with torch.no_grad():  # an optimizer step on the adapters
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(0.05 * torch.randn_like(p))
    stepped = snapshot(model)
    backend.update_weights(model)
    reference = merged_reference(model)
    engine = llm.model.lm.state_dict()
    assert max((engine[k] - reference[k]).abs().max().item() for k in reference) < 1e-6
    assert_bitwise(snapshot(model), stepped)
    assert llm.asleep  # asleep again while the trainer trains


def test_vllm_backend_runs_in_the_compute_dtype(fake_vllm: Any, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    model = with_lora(tiny_bundle.model)
    set_compute_dtype(model, torch.bfloat16)
    make_rollout("vllm", model, tiny_bundle.tokenizer)
    (llm,) = fake_vllm.LLM.instances
    assert llm.kwargs["dtype"] == "bfloat16"
    assert next(llm.model.lm.parameters()).dtype == torch.bfloat16


def test_sampling_is_seeded_by_torch(fake_vllm: Any, tiny_bundle: Any, prompts: list[list[int]]) -> None:
    backend = make_rollout("vllm", tiny_bundle.model, tiny_bundle.tokenizer, micro_batch_size=8)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6)
    torch.manual_seed(5)
    a = backend.generate(prompts, params)
    torch.manual_seed(5)
    b = backend.generate(prompts, params)
    assert torch.equal(a.response_ids, b.response_ids)
    assert a.prompt_index.tolist() == [i for i in range(len(prompts)) for _ in range(3)]
    assert bool((a.rollout_logprobs <= 0).all())


def test_the_multiprocess_engine_is_refused_naming_the_variable(
    fake_vllm: Any, tiny_bundle: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1 runs vLLM's engine in another process"):
        make_rollout("vllm", tiny_bundle.model, tiny_bundle.tokenizer)
    assert fake_vllm.LLM.instances == []


def test_an_unsupported_vllm_version_is_refused(
    fake_vllm: Any, tiny_bundle: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_vllm, "__version__", "0.33.0")
    with pytest.raises(
        RuntimeError, match=r"vLLM 0\.33\.0 is installed; queryrl's vllm backend supports vLLM <0\.33,>=0\.32"
    ):
        make_rollout("vllm", tiny_bundle.model, tiny_bundle.tokenizer)
