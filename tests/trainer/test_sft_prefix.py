"""``sft.share_prefix_forward``: the prompts' common leading tokens (the system prompt) run once a micro-batch, and the
loss and its gradients are the whole batch's forward's, on every architecture queryrl serves."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from queryrl.models.vocab import restrict_head
from queryrl.padding import MIN_SHARED_PREFIX
from queryrl.trainer.sft import accumulate_gradients, evaluate_loss
from queryrl.trainer.sft_batch import (
    SFTExample,
    collate,
    collate_shared,
    micro_batch,
    shared_prefix_length,
    sum_target_loss,
)
from tests.rollout.helpers import PREFIX_ARCHS, SHORT_WINDOW_ARCHS, lora_arch, with_lora

CPU = torch.device("cpu")
PAD = 0


def examples(vocab: int, prefix: int = 20, seed: int = 0) -> list[SFTExample]:
    """Four rows: one `prefix`-token system prompt, then 3 to 12 tokens of their own and targets of 2 to 6
    tokens, so the rests (and the whole rows) differ in length and the sliding windows of ARCHS (3, 4) are
    shorter than every row."""
    gen = torch.Generator().manual_seed(seed)
    head = torch.randint(3, vocab, (prefix,), generator=gen).tolist()
    rows = []
    for i, (own, target) in enumerate([(3, 6), (12, 2), (7, 4), (5, 5)]):
        rest = torch.randint(3, vocab, (own,), generator=gen).tolist()
        rows.append(SFTExample(head + rest, torch.randint(3, vocab, (target,), generator=gen).tolist(), "x", i))
    return rows


def loss_and_grads(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, int, list[Tensor]]:
    """The summed target loss of `batch`, its token count and the trainable parameters' gradients (cleared)."""
    loss, count = sum_target_loss(model, batch, CPU)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return loss.detach(), count, grads


def embedded_rows(model: nn.Module) -> tuple[list[tuple[int, ...]], Any]:
    """Record the (rows, positions) of every call of the input embedding."""
    calls: list[tuple[int, ...]] = []
    embed = model.get_input_embeddings()  # type: ignore[operator]
    handle = embed.register_forward_hook(lambda _m, args, _out: calls.append(tuple(args[0].shape)))
    return calls, handle


def test_the_prefix_is_what_every_prompt_starts_with_less_one_token() -> None:
    rows = [SFTExample([1, 2, 3, 4, 5], [9], "x", 0), SFTExample([1, 2, 3, 7], [9], "x", 1)]
    assert shared_prefix_length(rows) == 3
    assert shared_prefix_length([rows[0], SFTExample([1, 2], [9], "x", 2)]) == 1  # the shortest keeps one own token
    assert shared_prefix_length([rows[0], SFTExample([8, 2], [9], "x", 2)]) == 0
    assert collate_shared(rows, PAD, min_prefix=3) is not None
    assert collate_shared(rows, PAD, min_prefix=4) is None  # too short to pay
    assert collate_shared(rows[:1], PAD, min_prefix=1) is None  # one row: nothing to share


@pytest.mark.parametrize("window", [None, 40, 8])
def test_the_shared_layout_holds_every_token_once_with_its_own_positions(window: int | None) -> None:
    """Left-padded rests (targets end in the last column) where no sliding window is shorter than the laid-out
    rows (none, 40); right-padded ones (every row next to the prefix) where one is (8)."""
    rows = examples(50)
    batch = collate_shared(rows, PAD, window)
    assert batch is not None
    c = batch["prefix_ids"].shape[1]
    assert c == 20 >= MIN_SHARED_PREFIX
    for i, e in enumerate(rows):
        mask = batch["attention_mask"][i].bool()
        assert batch["prefix_ids"][0].tolist() + batch["input_ids"][i][mask].tolist() == e.prompt_ids + e.target_ids
        assert batch["position_ids"][i][mask].tolist() == list(range(c, len(e.prompt_ids) + len(e.target_ids)))
        labelled = batch["labels"][i][batch["labels"][i] != -100].tolist()
        assert labelled == e.target_ids
    left = bool(batch["attention_mask"][:, -1].all())
    assert left == (window != 8)
    assert bool(batch["attention_mask"][:, 0].all()) == (window == 8)


@pytest.mark.parametrize("arch", PREFIX_ARCHS)
def test_every_architecture_gives_the_whole_forwards_loss_and_gradients(arch: str, tiny_bundle: Any) -> None:
    """With LoRA adapters on Qwen2 (also with a sliding layer), Llama and Gemma 3 (sliding windows shorter than
    the rows, and one longer: ``gemma3_wide``): the shared-prefix loss and the adapters' gradients equal the
    left-padded whole batch's, and the prefix goes through the model once."""
    tok = tiny_bundle.tokenizer
    model = lora_arch(tiny_bundle, arch)
    rows = examples(len(tok), seed=3)
    expected, count, expected_grads = loss_and_grads(model, collate(rows, PAD))
    shared = micro_batch(model, rows, PAD, share_prefix=True)
    assert "prefix_ids" in shared
    sliding = arch in SHORT_WINDOW_ARCHS  # windows of 3-4 tokens: right-padded rests
    assert bool(shared["attention_mask"][:, -1].all()) == (not sliding)
    calls, handle = embedded_rows(model)
    loss, shared_count, grads = loss_and_grads(model, shared)
    handle.remove()
    assert calls == [(1, 20), (4, shared["input_ids"].shape[1])]
    assert shared_count == count == sum(len(e.target_ids) for e in rows)
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-5)
    assert len(grads) == len(expected_grads) > 0
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, atol=1e-5, rtol=1e-4)


def test_a_restricted_head_shares_the_prefix_too(tiny_bundle: Any) -> None:
    model = with_lora(copy.deepcopy(tiny_bundle.model)).train()
    rows = examples(len(tiny_bundle.tokenizer), seed=5)
    used = {t for e in rows for t in [*e.prompt_ids, *e.target_ids]} | {PAD}
    restrict_head(model, sorted(used | set(range(0, int(model.config.vocab_size), 11))))
    expected, _, expected_grads = loss_and_grads(model, collate(rows, PAD))
    loss, _, grads = loss_and_grads(model, micro_batch(model, rows, PAD, share_prefix=True))
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-5)
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, atol=1e-5, rtol=1e-4)


def test_an_optimizer_batch_and_the_validation_loss_are_the_same_either_way(tiny_bundle: Any) -> None:
    """accumulate_gradients and evaluate_loss with sft.share_prefix on and off: the same mean loss, token
    count and gradients, over micro-batches of 3 (the last one a single row, which runs whole)."""
    model = with_lora(copy.deepcopy(tiny_bundle.model)).train()
    rows = examples(len(tiny_bundle.tokenizer), seed=7) + examples(len(tiny_bundle.tokenizer), seed=7)[:3]
    results = []
    for share in (False, True):
        loss, tokens = accumulate_gradients(model, rows, 3, PAD, CPU, share_prefix=share)
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        results.append((loss, tokens, grads, evaluate_loss(model, rows, 3, PAD, CPU, share_prefix=share)))
    (loss0, tokens0, grads0, val0), (loss1, tokens1, grads1, val1) = results
    assert tokens0 == tokens1
    assert loss1 == pytest.approx(loss0, abs=1e-5)
    assert val1 == pytest.approx(val0, abs=1e-5)
    for a, b in zip(grads1, grads0, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_gradient_checkpointing_runs_the_whole_batch(tiny_bundle: Any) -> None:
    """transformers turns the key/value cache off under gradient checkpointing: the micro-batch stays whole."""
    model = with_lora(copy.deepcopy(tiny_bundle.model)).train()
    model.activation_checkpointing_enable()  # type: ignore[operator]
    assert "prefix_ids" not in micro_batch(model, examples(len(tiny_bundle.tokenizer)), PAD, share_prefix=True)
    assert "prefix_ids" not in micro_batch(
        with_lora(copy.deepcopy(tiny_bundle.model)), examples(50), PAD, share_prefix=False
    )
