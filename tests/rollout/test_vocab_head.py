"""The vocabulary-restricted output head (model.vocab.restrict): exact against the full head where they must agree."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from queryrl.engine.batch import Batch
from queryrl.engine.policy import compute_logprobs
from queryrl.models.vocab import VocabError, head_tokens, restrict_head, template_token_ids, vocab_ids
from queryrl.rollout import HFRollout, SamplingParams
from queryrl.rollout.fast_decode import FastDecoder
from tests.rollout.helpers import GREEDY, build, paths, tiny_config, with_lora

SAMPLE = SamplingParams(do_sample=True, temperature=1.0, max_new_tokens=8, n=3)


def frozen_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).requires_grad_(False).eval()


def kept_with(extra: torch.Tensor, vocab: int, every: int = 3) -> list[int]:
    """Every `every`-th token id and `extra`'s (the full model's choices), sorted."""
    return sorted(set(range(0, vocab, every)) | {int(t) for t in extra.flatten()})


def full_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def wide_gemma(tokenizer: Any) -> nn.Module:
    """Gemma 3 270M's head width (640) over a 16,384-token vocabulary: the kept head (4,096+ rows, >= 2^21
    entries) is as tall and wide as the fast path's skinny-matmul orientation takes (fast_decode.WIDE_RATIO)."""
    config = tiny_config(
        tokenizer, "gemma3", vocab_size=16384, hidden_size=640, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    return build(config).requires_grad_(False)


def test_restricted_logits_are_the_full_heads_rows(tiny_bundle: Any) -> None:
    """(a) the restricted head's logits equal the full head's at the kept ids, in the model's forward and in
    the fast decode's head, on a real model's head width."""
    model = wide_gemma(tiny_bundle.tokenizer)
    ids = torch.randint(0, 16384, (3, 11), generator=torch.Generator().manual_seed(0))
    full = full_logits(model, ids)
    kept = kept_with(torch.tensor([]), 16384, every=4)
    assert len(kept) * 640 >= 1 << 21
    restrict_head(model, kept)
    assert torch.equal(vocab_ids(model), torch.tensor(kept))
    torch.testing.assert_close(full_logits(model, ids), full[..., kept], atol=1e-5, rtol=1e-5)

    decoder = FastDecoder(model)
    weights = decoder._weights()
    h = torch.randn(5, 640)
    head = model.get_output_embeddings().weight
    restricted = decoder._logits(h, weights)
    assert restricted.shape == (5, len(kept))
    full_head = torch.nn.functional.linear(decoder._norm(h, weights.norm), model.model.embed_tokens.weight)
    torch.testing.assert_close(restricted, full_head[:, kept], atol=1e-4, rtol=1e-5)
    assert torch.equal(head, model.model.embed_tokens.weight[kept])  # a copy of the kept rows


def test_greedy_equals_the_full_heads_when_its_choices_are_kept(tiny_bundle: Any, prompts: list[list[int]]) -> None:
    """(c) greedy decoding with the restricted head (fast path and generate) gives the full head's tokens when
    each argmax is kept; the log-probs are the full ones renormalised over the kept ids."""
    tok = tiny_bundle.tokenizer
    model = frozen_copy(tiny_bundle.model)
    full_fast, _ = paths(model, tok)
    expected = full_fast.generate(prompts, GREEDY)
    vocab = model.config.vocab_size
    kept = kept_with(expected.response_ids, vocab)
    restrict_head(model, kept)
    fast, slow = paths(model, tok)
    for out in (fast.generate(prompts, GREEDY), slow.generate(prompts, GREEDY)):
        assert torch.equal(out.response_ids, expected.response_ids)
        # log p over the kept set = log p_full - log (sum over kept of p_full)
        batch = Batch.from_rollout(out)
        full_lp = _full_logprobs_renormalised(tiny_bundle.model, batch, kept)
        mask = out.response_mask.bool()
        torch.testing.assert_close(out.rollout_logprobs[mask], full_lp[mask], atol=1e-4, rtol=0)


def _full_logprobs_renormalised(full_model: nn.Module, batch: Batch, kept: list[int]) -> torch.Tensor:
    """(N, T) log_softmax of the FULL model's logits restricted to `kept` and renormalised, at the responses."""
    input_ids, attention_mask, position_ids = batch.model_inputs()
    t = batch.response_ids.shape[1]
    with torch.no_grad():
        logits = full_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logp = torch.log_softmax(logits[:, -t - 1 : -1].float(), dim=-1)
    norm = torch.logsumexp(logp[..., kept], dim=-1)
    return logp.gather(-1, batch.response_ids[..., None]).squeeze(-1) - norm


@pytest.mark.parametrize("decode", ["auto", "off"])
def test_sampled_logprobs_are_the_renormalised_full_ones(
    tiny_bundle: Any, prompts: list[list[int]], decode: str
) -> None:
    """(b) a sampled response's tokens are kept ids, and its log-probs (the rollout's, and the policy's as the
    update computes them) are log_softmax over the full logits restricted to the kept ids, renormalised."""
    full = with_lora(frozen_copy(tiny_bundle.model))
    model = copy.deepcopy(full)
    vocab = tiny_bundle.model.config.vocab_size
    kept = kept_with(torch.tensor([tiny_bundle.tokenizer.eos_token_id]), vocab, every=5)
    restrict_head(model, kept)
    rollout = HFRollout(model, tiny_bundle.tokenizer, fast_decode=decode)
    assert rollout.decode_path == ("fast" if decode == "auto" else "generate")
    torch.manual_seed(0)
    out = rollout.generate(prompts, SAMPLE)
    mask = out.response_mask.bool()
    assert set(out.response_ids[mask].tolist()) <= set(kept)
    batch = Batch.from_rollout(out)
    policy_lp, _ = compute_logprobs(model, batch, micro_batch_size=4, temperature=1.0, share_prompt=True)
    expected = _full_logprobs_renormalised(full, batch, kept)
    torch.testing.assert_close(policy_lp[mask], expected[mask], atol=1e-4, rtol=0)
    torch.testing.assert_close(out.rollout_logprobs[mask], expected[mask], atol=1e-4, rtol=0)
    with model.disable_adapter():  # the reference (adapters off) scores over the same kept ids
        ref_lp, _ = compute_logprobs(model, batch, micro_batch_size=4, temperature=1.0)
    with full.disable_adapter():
        ref_expected = _full_logprobs_renormalised(full, batch, kept)
    torch.testing.assert_close(ref_lp[mask], ref_expected[mask], atol=1e-4, rtol=0)


def test_head_tokens_maps_ids_and_refuses_a_counted_token_outside(tiny_bundle: Any) -> None:
    model = frozen_copy(tiny_bundle.model)
    tokens = torch.tensor([[4, 10, 7]])
    assert torch.equal(head_tokens(model, tokens), tokens)  # a full head: the ids themselves
    restrict_head(model, [2, 4, 10, 11])
    assert head_tokens(model, tokens).tolist() == [[1, 2, 0]]  # 7 is outside: 0 where it is not scored
    assert head_tokens(model, tokens, torch.tensor([[1.0, 1.0, 0.0]])).tolist() == [[1, 2, 0]]
    with pytest.raises(VocabError, match=r"response tokens \[7\] are outside the kept vocabulary"):
        head_tokens(model, tokens, torch.tensor([[1.0, 1.0, 1.0]]))


def test_restrict_head_refuses_a_trained_head_and_bad_ids(tiny_bundle: Any) -> None:
    trained = copy.deepcopy(tiny_bundle.model)  # full fine-tuning: the tied head is trained
    with pytest.raises(VocabError, match="the output head is trained"):
        restrict_head(trained, [0, 1, 2])
    frozen = frozen_copy(tiny_bundle.model)
    for bad in ([], [3, 2], [1, 1], [0, 10**7]):
        with pytest.raises(VocabError, match="sorted, distinct"):
            restrict_head(frozen, bad)
    restrict_head(frozen, [0, 1])
    with pytest.raises(VocabError, match="restricted already"):
        restrict_head(frozen, [0, 1])


def test_template_tokens_cover_the_chat_markers_and_specials(tiny_bundle: Any) -> None:
    tok = tiny_bundle.tokenizer
    ids = template_token_ids(tok)
    assert {tok.eos_token_id, tok.pad_token_id} <= ids
    turn = tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False)
    assert (
        set(tok(turn, add_special_tokens=False)["input_ids"]) - set(tok("x", add_special_tokens=False)["input_ids"])
        <= ids
    )
