"""queryrl.padding, and the two concats that use it: prompts padded on the left, responses on the right."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from queryrl.engine.batch import Batch
from queryrl.padding import cat_padded, pad_to
from queryrl.rollout import RolloutOutput

PAD = 9


def _reference_pad(x: Tensor, width: int, value: float, left: bool) -> Tensor:
    """Element by element, the slow way: the rows of `x`, with `value` filling the missing columns."""
    out = []
    for row in x.tolist():
        fill = [value] * (width - len(row))
        out.append(fill + row if left else row + fill)
    return torch.tensor(out, dtype=x.dtype).reshape(x.shape[0], width)


def test_pad_to_by_hand() -> None:
    ids = torch.tensor([[1, 2], [3, 4]])
    assert pad_to(ids, 4, PAD, left=True).tolist() == [[PAD, PAD, 1, 2], [PAD, PAD, 3, 4]]
    assert pad_to(ids, 3, PAD, left=False).tolist() == [[1, 2, PAD], [3, 4, PAD]]
    assert pad_to(ids, 2, PAD, left=True) is ids  # nothing to add: no copy


@pytest.mark.parametrize("dtype", [torch.long, torch.float32, torch.bool])
@pytest.mark.parametrize("left", [True, False])
def test_cat_padded_matches_the_reference(dtype: torch.dtype, left: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randint(0, 5, (rows, cols), generator=gen).to(dtype) for rows, cols in [(2, 3), (1, 5), (3, 1)]]
    value = 0 if dtype == torch.bool else PAD
    out = cat_padded(parts, 6, value, left=left)
    assert out.dtype == dtype
    assert out.shape == (6, 6)
    assert torch.equal(out, torch.cat([_reference_pad(p, 6, value, left) for p in parts]))


def test_padding_never_crops() -> None:
    with pytest.raises(ValueError, match="cannot pad 3 columns to 2"):
        pad_to(torch.zeros(1, 3), 2, 0, left=False)


def _rollout(prompts: list[list[int]], responses: list[list[int]]) -> RolloutOutput:
    p, t = max(map(len, prompts)), max(map(len, responses))
    return RolloutOutput(
        prompt_ids=torch.tensor([[PAD] * (p - len(x)) + x for x in prompts]),
        prompt_mask=torch.tensor([[0] * (p - len(x)) + [1] * len(x) for x in prompts]),
        response_ids=torch.tensor([x + [PAD] * (t - len(x)) for x in responses]),
        response_mask=torch.tensor([[1.0] * len(x) + [0.0] * (t - len(x)) for x in responses]),
        rollout_logprobs=torch.tensor([[-0.5] * len(x) + [0.0] * (t - len(x)) for x in responses]),
        prompt_index=torch.arange(len(prompts)),
        truncated=torch.zeros(len(prompts), dtype=torch.bool),
    )


def test_rollout_and_batch_concat_pad_alike() -> None:
    a = _rollout([[1, 2], [3]], [[4, 5, 6], [7]])
    b = _rollout([[1, 2, 3, 4]], [[8, 8]])
    from_rollouts = Batch.from_rollout(RolloutOutput.concat([a, b], PAD))
    from_batches = Batch.concat([Batch.from_rollout(a), Batch.from_rollout(b)], PAD)
    assert from_rollouts.prompt_ids.tolist() == [[PAD, PAD, 1, 2], [PAD, PAD, PAD, 3], [1, 2, 3, 4]]
    assert from_rollouts.response_ids.tolist() == [[4, 5, 6], [7, PAD, PAD], [8, 8, PAD]]
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_attention_mask", "response_mask"):
        assert torch.equal(getattr(from_rollouts, name), getattr(from_batches, name)), name
    assert torch.equal(from_rollouts.rollout_logprobs, from_batches.rollout_logprobs)  # type: ignore[arg-type]


def test_pad_responses_to_restores_the_width() -> None:
    batch = Batch.from_rollout(_rollout([[1]], [[4, 5, 6]]))
    assert batch.pad_responses_to(5, torch.ones(1, 3), fill=-1.0).tolist() == [[1, 1, 1, -1, -1]]
