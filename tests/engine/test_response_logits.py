"""Logits only for the response: same log-probs and gradients as the full-logits forward, fewer LM-head rows."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

from queryrl.algos import entropy_from_logits
from queryrl.engine.batch import Batch
from queryrl.engine.policy import (
    compute_logprobs,
    forward_logprobs,
    keeps_logits,
    logprobs_from_logits,
    response_logits,
)
from queryrl.trainer.sft_batch import IGNORE_INDEX, SFTExample, collate, sum_target_loss
from tests.engine.helpers import TEMPERATURE, full_logprobs, load


def make_batch(vocab: int, seed: int = 0) -> Batch:
    """4 sequences: left-padded prompts of 3..6 tokens (P = 6), right-padded responses of 2..5 (T = 5)."""
    gen = torch.Generator().manual_seed(seed)
    n, p, t = 4, 6, 5
    prompt_mask = torch.zeros(n, p, dtype=torch.long)
    response_mask = torch.zeros(n, t)
    for i, (pl, tl) in enumerate([(6, 5), (3, 2), (5, 4), (4, 3)]):
        prompt_mask[i, p - pl :] = 1
        response_mask[i, :tl] = 1
    prompt_ids = torch.randint(3, vocab, (n, p), generator=gen) * prompt_mask
    response_ids = torch.randint(3, vocab, (n, t), generator=gen) * response_mask.long()
    return Batch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_attention_mask=response_mask.long(),
        response_mask=response_mask,
        group_ids=torch.tensor([0, 0, 1, 1]),
    )


def lm_head_rows(model: nn.Module) -> tuple[list[int], Any]:
    """Record how many positions each call of the output projection sees."""
    rows: list[int] = []
    head = model.get_output_embeddings()  # type: ignore[operator]
    handle = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[1]))
    return rows, handle


def test_logprobs_and_gradients_match_full_logits(policy: Any) -> None:
    model = policy.model
    assert keeps_logits(model)  # peft passes logits_to_keep through to the Qwen2 forward
    batch = make_batch(len(policy.tokenizer))
    params = [p for p in model.parameters() if p.requires_grad]

    ref = full_logprobs(model, batch)
    (ref * batch.response_mask).sum().backward()
    ref_grads = [p.grad.clone() for p in params if p.grad is not None]
    model.zero_grad(set_to_none=True)

    rows, handle = lm_head_rows(model)
    logprobs, _ = forward_logprobs(model, batch, TEMPERATURE, with_entropy=False)
    handle.remove()
    (logprobs * batch.response_mask).sum().backward()

    assert rows == [batch.response_ids.shape[1] + 1]  # T + 1 rows, not P + T
    torch.testing.assert_close(logprobs, ref, atol=1e-6, rtol=0)
    for param, expected in zip(params, ref_grads, strict=True):
        torch.testing.assert_close(param.grad, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, TEMPERATURE])
def test_the_update_metric_path_gives_the_two_pass_logprobs_entropy_and_gradients(
    policy: Any, temperature: float
) -> None:
    """The update's forward (entropy as a metric) takes log-probs and entropy from one log_softmax, and at
    temperature 1 skips the division: equal, to float rounding, to gather - logsumexp and softmax entropy of
    the logits divided by the temperature, and so are the gradients."""
    model = policy.model
    batch = make_batch(len(policy.tokenizer), seed=2)
    params = [p for p in model.parameters() if p.requires_grad]
    mask = batch.response_mask.bool()

    logits = response_logits(model, batch, 1.0) / temperature  # the old path: always divided
    ref = logprobs_from_logits(logits, batch.response_ids)
    ref_entropy = entropy_from_logits(logits.detach().float())
    (ref * batch.response_mask).sum().backward()
    ref_grads = [p.grad.clone() for p in params if p.grad is not None]
    model.zero_grad(set_to_none=True)

    logprobs, entropy = forward_logprobs(model, batch, temperature, with_entropy=True, entropy_grad=False)
    assert entropy is not None
    assert not entropy.requires_grad
    (logprobs * batch.response_mask).sum().backward()
    torch.testing.assert_close(logprobs[mask], ref[mask], atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy[mask], ref_entropy[mask], atol=1e-5, rtol=0)
    grads = [p.grad for p in params if p.grad is not None]
    assert len(grads) == len(ref_grads)
    for got, expected in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_compute_logprobs_micro_batched_matches_full(policy: Any) -> None:
    batch = make_batch(len(policy.tokenizer), seed=1)
    with torch.no_grad():
        ref = full_logprobs(policy.model.eval(), batch)
    out, _ = compute_logprobs(policy.model, batch, micro_batch_size=3, temperature=TEMPERATURE)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(out[mask], ref[mask], atol=1e-6, rtol=0)


def test_lora_reference_keeps_logits_too(model_cache: Any) -> None:
    """The LoRA reference (adapters disabled) goes through the same path."""
    policy = load(model_cache, 4)
    batch = make_batch(len(policy.tokenizer), seed=2)
    with torch.no_grad(), policy.model.disable_adapter():
        ref = full_logprobs(policy.model, batch)
        out, _ = compute_logprobs(policy.model, batch, micro_batch_size=4, temperature=TEMPERATURE)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)


class NoKeepLM(nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` (a custom model): every position is projected."""

    def __init__(self, vocab: int = 11, hidden: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lm_head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, **kwargs: Any) -> Any:
        hidden = self.embed(input_ids).cumsum(dim=1)  # causal: position i sees tokens <= i
        return type("Out", (), {"logits": self.lm_head(hidden)})()


def test_model_without_logits_to_keep_is_sliced_after() -> None:
    torch.manual_seed(0)
    model = NoKeepLM()
    assert not keeps_logits(model)  # **kwargs alone is not trusted to honour logits_to_keep
    batch = make_batch(11)
    logprobs, _ = forward_logprobs(model, batch, TEMPERATURE, with_entropy=False)
    torch.testing.assert_close(logprobs, full_logprobs(model, batch), atol=0, rtol=0)


def full_sft_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    logits = model(**inputs, use_cache=False).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def test_sft_loss_projects_targets_only(policy: Any) -> None:
    model = policy.model
    vocab = len(policy.tokenizer)
    gen = torch.Generator().manual_seed(3)
    examples = [
        SFTExample(torch.randint(3, vocab, (pl,), generator=gen).tolist(), list(range(5, 5 + tl)), "s", i)
        for i, (pl, tl) in enumerate([(7, 3), (4, 5), (9, 2)])
    ]
    batch = collate(examples, pad_id=0)  # L = 11, left-padded: every target ends in column 10, the longest has 5
    params = [p for p in model.parameters() if p.requires_grad]
    ref = full_sft_loss(model, batch)
    ref.backward()
    ref_grads = [p.grad.clone() for p in params if p.grad is not None]
    model.zero_grad(set_to_none=True)

    rows, handle = lm_head_rows(model)
    loss, tokens = sum_target_loss(model, batch, torch.device("cpu"))
    handle.remove()
    loss.backward()

    assert tokens == 10
    assert rows == [5 + 1]  # columns 5 .. 10 (the last is dropped), not all 11
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-6)
    for param, expected in zip(params, ref_grads, strict=True):
        torch.testing.assert_close(param.grad, expected, atol=1e-6, rtol=0)
