"""Each distinct prompt run once (``actor.share_prompt_forward``): the full forward's log-probs and
gradients, with the prompt's positions computed once per group instead of once per sample."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from queryrl.engine.batch import Batch
from queryrl.engine.policy import (
    can_pack_prompt,
    can_share_prompt,
    compute_logprobs,
    forward_logprobs,
    packed_prompt_response_logits,
    prompt_groups,
    shared_prompt_response_logits,
)
from queryrl.padding import shared_prefix
from tests.engine.helpers import TEMPERATURE, full_logprobs, load
from tests.rollout.helpers import ARCHS, PREFIX_ARCHS, SHORT_WINDOW_ARCHS, arch_model, lora_arch, with_lora


def grouped_batch(vocab: int, seed: int = 0, t: int = 5) -> Batch:
    """3 prompts (6, 3, 5 real tokens, left-padded to 6) x 3 samples each, rows interleaved (not
    grouped), right-padded responses of 1..t tokens."""
    gen = torch.Generator().manual_seed(seed)
    p = 6
    prompts = []
    for length in (6, 3, 5):
        mask = torch.zeros(p, dtype=torch.long)
        mask[p - length :] = 1
        prompts.append((torch.randint(3, vocab, (p,), generator=gen) * mask, mask))
    order = [0, 1, 2, 0, 1, 2, 2, 0, 1]
    n = len(order)
    response_mask = torch.zeros(n, t)
    for i in range(n):
        response_mask[i, : 1 + (i % t)] = 1
    return Batch(
        prompt_ids=torch.stack([prompts[k][0] for k in order]),
        prompt_mask=torch.stack([prompts[k][1] for k in order]),
        response_ids=torch.randint(3, vocab, (n, t), generator=gen) * response_mask.long(),
        response_attention_mask=response_mask.long(),
        response_mask=response_mask,
        group_ids=torch.tensor(order),
    )


def embedded_rows(model: nn.Module) -> tuple[list[tuple[int, int]], Any]:
    """Record the (rows, positions) of every call of the input embedding."""
    calls: list[tuple[int, int]] = []
    embed = model.get_input_embeddings()  # type: ignore[operator]
    handle = embed.register_forward_hook(lambda _m, args, _out: calls.append(tuple(args[0].shape)))
    return calls, handle


def _full_forward(model: nn.Module, batch: Batch) -> tuple[Tensor, list[Tensor]]:
    """The full forward's log-probs and the trainable parameters' gradients of their masked sum (then cleared)."""
    params = [p for p in model.parameters() if p.requires_grad]
    ref = full_logprobs(model, batch)
    (ref * batch.response_mask).sum().backward()
    ref_grads = [p.grad.clone() for p in params if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return ref, ref_grads


def _assert_matches(model: nn.Module, batch: Batch, logprobs: Tensor, ref: Tensor, ref_grads: list[Tensor]) -> None:
    """`logprobs` (a shared path's) equal the full forward's `ref` on the response tokens, and the gradients of
    their masked sum equal `ref_grads`."""
    (logprobs * batch.response_mask).sum().backward()
    mask = batch.response_mask.bool()
    torch.testing.assert_close(logprobs[mask], ref[mask], atol=1e-5, rtol=0)
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert len(grads) == len(ref_grads) > 0
    for grad, expected in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-4)


def test_prompt_groups_finds_the_distinct_prompts() -> None:
    batch = grouped_batch(50)
    groups = prompt_groups(batch)
    assert groups is not None
    rows, inverse = groups
    assert len(rows) == 3
    for i in range(len(batch)):  # each row maps to a representative with the same prompt
        assert torch.equal(batch.prompt_ids[rows[inverse[i]]], batch.prompt_ids[i])
        assert batch.group_ids[rows[inverse[i]]] == batch.group_ids[i]
    assert prompt_groups(batch.select([0, 1, 2])) is None  # all distinct: nothing to share


def test_same_logprobs_and_gradients_as_the_full_forward(policy: Any) -> None:
    model = policy.model
    batch = grouped_batch(len(policy.tokenizer))
    ref, ref_grads = _full_forward(model, batch)

    calls, handle = embedded_rows(model)
    logprobs, _ = forward_logprobs(model, batch, TEMPERATURE, with_entropy=False, share_prompt=True)
    handle.remove()
    # the 3 distinct prompts (6 positions), then the 9 responses without their last token
    assert calls == [(3, 6), (9, batch.response_ids.shape[1] - 1)]
    _assert_matches(model, batch, logprobs, ref, ref_grads)


def test_one_token_responses_need_no_second_pass(policy: Any) -> None:
    batch = grouped_batch(len(policy.tokenizer), seed=1, t=1)
    with torch.no_grad():
        ref = full_logprobs(policy.model, batch)
        calls, handle = embedded_rows(policy.model)
        out, _ = forward_logprobs(policy.model, batch, TEMPERATURE, with_entropy=False, share_prompt=True)
        handle.remove()
    assert calls == [(3, 6)]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_micro_batched_and_reference_paths(policy: Any) -> None:
    """``compute_logprobs`` (old and reference log-probs) shares within each micro-batch; a micro-batch
    whose prompts are all distinct takes the plain path."""
    batch = grouped_batch(len(policy.tokenizer), seed=2)
    with torch.no_grad():
        ref = full_logprobs(policy.model.eval(), batch)
    for micro in (2, 4, 9):
        out, _ = compute_logprobs(policy.model, batch, micro, TEMPERATURE, share_prompt=True)
        mask = batch.response_mask.bool()
        torch.testing.assert_close(out[mask], ref[mask], atol=1e-5, rtol=0)


def checkpointed(model: nn.Module) -> nn.Module:
    """`model` in training mode with transformers' per-layer gradient checkpointing on."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def test_gradient_checkpointing_shares_in_one_packed_forward(model_cache: Any) -> None:
    """transformers turns the cache off under gradient checkpointing: the prompts are shared in one packed
    forward instead (each distinct prompt followed by its samples' responses), with the same numbers."""
    policy = load(model_cache, 0)
    model = checkpointed(policy.model)
    assert not can_share_prompt(model)
    assert can_pack_prompt(model)
    batch = grouped_batch(len(policy.tokenizer), seed=3)
    calls, handle = embedded_rows(model)
    out, _ = forward_logprobs(model, batch, TEMPERATURE, with_entropy=False, share_prompt=True)
    handle.remove()
    assert calls == [(3, 6 + 3 * batch.response_ids.shape[1])]  # 3 prompts, each with its 3 responses
    ref: Tensor = full_logprobs(model, batch)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(out[mask], ref[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_grpo_step_ends_with_the_same_parameters(
    tmp_path: Path, model_cache: Path, checkpointing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One GRPO step with the KL loss (old, reference and policy log-probs all take the shared path; with
    gradient checkpointing the packed one)."""
    import queryrl.engine.policy as policy_module
    from queryrl.trainer.loop import Trainer
    from tests.helpers import make_cfg, params

    packed_calls: list[int] = []
    packed = policy_module.packed_prompt_response_logits

    def counted(*args: Any) -> Tensor:
        packed_calls.append(1)
        return packed(*args)

    monkeypatch.setattr(policy_module, "packed_prompt_response_logits", counted)
    starts, ends, losses = [], [], []
    for share in (False, True):
        cfg = make_cfg(
            tmp_path / str(share),
            model_cache,
            "trainer.total_steps=1",
            "actor.use_kl_loss=true",
            "actor.ppo_micro_batch_size=16",
            f"actor.share_prompt_forward={str(share).lower()}",
            f"model.gradient_checkpointing={str(checkpointing).lower()}",
        )
        trainer = Trainer(cfg)
        starts.append(params(trainer.c.policy.model))
        metrics = trainer.fit()
        ends.append(params(trainer.c.policy.model))
        losses.append((metrics["actor/pg_loss"], metrics["actor/kl_loss"]))
    assert bool(packed_calls) == checkpointing  # the packed path runs exactly where the cache cannot
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)
    changed = [k for k in ends[0] if not torch.equal(ends[0][k], ends[1][k])]
    assert changed  # float rounding differs: the two paths really ran different code
    # Adam's first step is about lr * sign(gradient), so an entry whose gradient is ~0 may move either
    # way: compare the whole update, not each entry
    plain = torch.cat([(ends[0][k] - starts[0][k]).flatten() for k in starts[0]])
    shared = torch.cat([(ends[1][k] - starts[1][k]).flatten() for k in starts[1]])
    assert all(torch.equal(starts[0][k], starts[1][k]) for k in starts[0])
    assert plain.norm() > 0
    assert (shared - plain).norm() / plain.norm() < 1e-3


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_fast_decode_architecture_with_lora_shares_exactly(arch: str, tiny_bundle: Any) -> None:
    """Sharing is on by default, so it must hold on every architecture queryrl serves: Qwen2 (also with
    a sliding-window layer), Qwen3, Llama and Gemma 3 (sliding layers with a window shorter than the
    sequences), with LoRA adapters, log-probs and the adapters' gradients as the full forward's."""
    model = with_lora(arch_model(tiny_bundle.tokenizer, arch)).train()
    batch = grouped_batch(len(tiny_bundle.tokenizer), seed=4)
    ref, ref_grads = _full_forward(model, batch)
    assert can_share_prompt(model)
    calls, handle = embedded_rows(model)
    logprobs, _ = forward_logprobs(model, batch, TEMPERATURE, with_entropy=False, share_prompt=True)
    handle.remove()
    assert calls == [(3, 6), (9, batch.response_ids.shape[1] - 1)]
    _assert_matches(model, batch, logprobs, ref, ref_grads)


def _logprobs_and_grads(model: nn.Module, batch: Batch, logits: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Log-probs of `logits` in their own dtype and the gradients of their masked sum; clears the grads."""
    params = [p for p in model.parameters() if p.requires_grad]
    logprobs = torch.log_softmax(logits, -1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    (logprobs * batch.response_mask).sum().backward()
    grads = [p.grad.clone() for p in params if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return logprobs.detach(), grads


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_architecture_shares_exactly_under_gradient_checkpointing(arch: str, tiny_bundle: Any) -> None:
    """The packed forward on every architecture, with LoRA and per-layer checkpointing, in float64: the
    log-probs and the adapters' gradients of the cached shared path (itself checked against the full forward
    above) to 1e-9, Gemma 3's sliding layers included (their window is shorter than the sequences here)."""
    model = with_lora(arch_model(tiny_bundle.tokenizer, arch)).to(torch.float64).train()
    batch = grouped_batch(len(tiny_bundle.tokenizer), seed=5)
    groups = prompt_groups(batch)
    assert groups is not None
    cached = _logprobs_and_grads(model, batch, shared_prompt_response_logits(model, batch, *groups))
    model = checkpointed(model)
    assert not can_share_prompt(model)
    assert can_pack_prompt(model)
    packed = _logprobs_and_grads(model, batch, packed_prompt_response_logits(model, batch, *groups))
    mask = batch.response_mask.bool()
    torch.testing.assert_close(packed[0][mask], cached[0][mask], atol=1e-9, rtol=0)
    assert len(packed[1]) == len(cached[1]) > 0
    for grad, expected in zip(packed[1], cached[1], strict=True):
        torch.testing.assert_close(grad, expected, atol=1e-9, rtol=1e-9)


def test_packed_forward_without_checkpointing_and_with_one_token(policy: Any) -> None:
    """The packed layout alone (no checkpointing), and one-token responses (only the prompts' last logits)."""
    for t in (5, 1):
        batch = grouped_batch(len(policy.tokenizer), seed=6, t=t)
        groups = prompt_groups(batch)
        assert groups is not None
        with torch.no_grad():
            ref = full_logprobs(policy.model, batch)
            logits = packed_prompt_response_logits(policy.model, batch, *groups) / TEMPERATURE
        out = torch.log_softmax(logits.float(), -1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
        mask = batch.response_mask.bool()
        torch.testing.assert_close(out[mask], ref[mask], atol=1e-5, rtol=0)


def prefixed_batch(vocab: int, seed: int = 0, prefix: int = 20, t: int = 4) -> Batch:
    """`grouped_batch`'s 3 prompts x 3 samples, each prompt after one `prefix`-token system prompt (so 23 to 26
    real tokens, left-padded to 26)."""
    batch = grouped_batch(vocab, seed, t)
    gen = torch.Generator().manual_seed(seed + 100)
    head = torch.randint(3, vocab, (prefix,), generator=gen)
    n, p = batch.prompt_ids.shape
    ids = torch.zeros(n, p + prefix, dtype=torch.long)
    mask = torch.zeros(n, p + prefix, dtype=torch.long)
    for i in range(n):
        own = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
        row = torch.cat([head, own])
        ids[i, -len(row) :], mask[i, -len(row) :] = row, 1
    return Batch(
        prompt_ids=ids,
        prompt_mask=mask,
        response_ids=batch.response_ids,
        response_attention_mask=batch.response_attention_mask,
        response_mask=batch.response_mask,
        group_ids=batch.group_ids,
    )


def test_common_prefix_counts_the_real_tokens_every_prompt_starts_with() -> None:
    batch = prefixed_batch(50)
    assert shared_prefix(batch.prompt_ids, batch.prompt_mask) == 20
    plain = grouped_batch(50)
    assert shared_prefix(plain.prompt_ids, plain.prompt_mask) == 0
    same = prefixed_batch(50).prompt_ids[[0, 3]]  # one prompt twice: all but its last token
    assert shared_prefix(same, (same != 0).long()) == int((same[0] != 0).sum()) - 1
    assert shared_prefix(same[:1], (same[:1] != 0).long()) == 0  # one prompt: nothing to share


@pytest.mark.parametrize("arch", PREFIX_ARCHS)
def test_the_prompts_common_prefix_runs_once_with_the_full_forwards_logprobs(arch: str, tiny_bundle: Any) -> None:
    """Prompts that open with one 20-token system prompt: it runs once, each distinct prompt's rest once on it,
    then the samples' responses; log-probs and the LoRA gradients are the full forward's. Where a sliding window
    is shorter than the laid-out prompt (Gemma 3 and Qwen2's sliding layers here, windows of 3-4 tokens) the
    prompts run whole, with the same result."""
    tok = tiny_bundle.tokenizer
    model = lora_arch(tiny_bundle, arch)
    batch = prefixed_batch(len(tok), seed=6)
    ref, ref_grads = _full_forward(model, batch)
    calls, handle = embedded_rows(model)
    logprobs, _ = forward_logprobs(model, batch, TEMPERATURE, with_entropy=False, share_prompt=True)
    handle.remove()
    t = batch.response_ids.shape[1]
    if arch in SHORT_WINDOW_ARCHS:
        assert calls == [(3, 26), (9, t - 1)]
    else:
        assert calls == [(1, 20), (3, 6), (9, t - 1)]
    _assert_matches(model, batch, logprobs, ref, ref_grads)


def test_share_prefix_false_runs_each_distinct_prompt_whole(policy: Any) -> None:
    """``actor.share_prefix_forward=false``: the distinct prompts run once each, whole, as before the option."""
    batch = prefixed_batch(len(policy.tokenizer), seed=2)
    calls, handle = embedded_rows(policy.model)
    with torch.no_grad():
        forward_logprobs(policy.model, batch, TEMPERATURE, with_entropy=False, share_prompt=True, share_prefix=False)
        forward_logprobs(policy.model, batch, TEMPERATURE, with_entropy=False, share_prompt=True)
    handle.remove()
    t = batch.response_ids.shape[1]
    assert calls == [(3, 26), (9, t - 1), (1, 20), (3, 6), (9, t - 1)]


def test_under_fsdp_each_distinct_prompt_runs_whole(policy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every forward of an FSDP module is an all-gather, and two ranks' micro-batches may decide differently about
    a prefix, so a sharded model never takes the prefix path (the ranks then run the same number of forwards)."""
    from queryrl.engine import policy as engine_policy

    monkeypatch.setattr(engine_policy, "_sharded", lambda _model: True)
    batch = prefixed_batch(len(policy.tokenizer), seed=2)
    calls, handle = embedded_rows(policy.model)
    with torch.no_grad():
        forward_logprobs(policy.model, batch, TEMPERATURE, with_entropy=False, share_prompt=True)
    handle.remove()
    assert calls == [(3, 26), (9, batch.response_ids.shape[1] - 1)]
