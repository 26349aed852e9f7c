"""Loss aggregation, and invariance to micro-batching.

The promise: a mini-batch split into micro-batches of any sizes, each trimmed to its own
padded width, with gradients accumulated, gives the same gradient (and optimizer step) as the
whole mini-batch at once, in every aggregation mode — when the mini-batch's LossNormalizer is
passed to every micro-batch. verl's legacy path (each micro-batch normalised by itself, then
scaled by its share of rows) does not have this property (verl issue #5625); a test shows that
too, so the invariance tests are known to be able to fail.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from queryrl.algos import LOSS_AGG_MODES, POLICY_LOSSES, LossNormalizer, agg_loss, value_loss

N, T, V, H = 12, 9, 11, 8
SPLITS = [[12], [6, 6], [5, 4, 3], [1] * 12, [7, 1, 4]]


def ragged_mask(n: int = N, t: int = T, seed: int = 0) -> Tensor:
    """(n, t) right-padded mask with lengths 1..t, plus one fully masked row (a dropped sample)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    lengths[0] = t  # someone uses the full width, so trimming changes widths
    lengths[3] = 0
    return (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).float()


def trim(mask: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """Cut the padding columns a micro-batch does not need (as a packed/dynamic batch would)."""
    width = max(int(mask.sum(dim=-1).max().item()), 1)
    return (mask[:, :width], *(x[:, :width] for x in tensors))


# --- hand-worked aggregation -------------------------------------------------------------------


def test_agg_loss_hand_worked() -> None:
    # loss_mat rows [1, 2, 3] with mask [1, 1, 0] and [4, 5, 6] with mask [1, 0, 0]
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    expected = {
        "token-mean": (1 + 2 + 4) / 3,  # 7 / 3 tokens
        "token-sum": 7.0,
        "seq-mean-token-sum": (3 + 4) / 2,  # sequence sums 3 and 4
        "seq-mean-token-mean": (1.5 + 4) / 2,  # sequence means 1.5 and 4
        "seq-mean-token-sum-norm": (3 + 4) / 2 / 3,  # / horizon T = 3
    }
    for mode, value in expected.items():
        torch.testing.assert_close(agg_loss(loss_mat, mask, mode), torch.tensor(value), msg=mode)


def test_fully_masked_rows_do_not_count_as_sequences() -> None:
    loss_mat = torch.tensor([[2.0, 2.0], [9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    # only row 0 counts: seq-mean over one sequence
    torch.testing.assert_close(agg_loss(loss_mat, mask, "seq-mean-token-sum"), torch.tensor(4.0))
    torch.testing.assert_close(agg_loss(loss_mat, mask, "seq-mean-token-mean"), torch.tensor(2.0))


def test_nan_at_masked_positions_does_not_leak() -> None:
    loss_mat = torch.tensor([[1.0, float("nan")], [3.0, float("inf")]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    for mode in LOSS_AGG_MODES:
        assert torch.isfinite(agg_loss(loss_mat, mask, mode)), mode


def test_unknown_mode_lists_valid_modes() -> None:
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(torch.ones(2, 2), torch.ones(2, 2), "seq-mean")


def test_normalizer_from_mask() -> None:
    mask = ragged_mask()
    norm = LossNormalizer.from_mask(mask)
    assert norm.num_tokens == mask.sum().item()
    assert norm.num_seqs == N - 1  # row 3 is fully masked
    assert norm.horizon == T
    assert LossNormalizer.from_mask(mask, horizon=64).horizon == 64
    with pytest.raises(ValueError, match="horizon"):
        LossNormalizer(num_tokens=1, num_seqs=1, horizon=0)


def test_normalizer_of_the_same_batch_changes_nothing() -> None:
    g = torch.Generator().manual_seed(1)
    loss_mat, mask = torch.randn(N, T, generator=g), ragged_mask()
    for mode in LOSS_AGG_MODES:
        torch.testing.assert_close(
            agg_loss(loss_mat, mask, mode, LossNormalizer.from_mask(mask)), agg_loss(loss_mat, mask, mode), msg=mode
        )


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_dp_size_needs_the_global_counts(mode: str) -> None:
    # verl 0.9.1 raises when dp_size > 1 comes without batch_num_tokens / global_batch_size: this
    # rank's own counts times dp_size is not the global-batch gradient once ranks hold different counts
    g = torch.Generator().manual_seed(2)
    loss_mat, mask = torch.randn(N, T, generator=g), ragged_mask()
    norm = LossNormalizer.from_mask(mask)
    torch.testing.assert_close(agg_loss(loss_mat, mask, mode, norm, dp_size=2), 2 * agg_loss(loss_mat, mask, mode))
    if mode == "token-sum":  # no count to divide by: nothing is missing
        torch.testing.assert_close(agg_loss(loss_mat, mask, mode, dp_size=2), 2 * agg_loss(loss_mat, mask, mode))
        return
    missing = "token count" if mode == "token-mean" else "sequence count"
    with pytest.raises(ValueError, match=f"dp_size=2.*{missing}.*LossNormalizer.from_mask"):
        agg_loss(loss_mat, mask, mode, dp_size=2)
    torch.testing.assert_close(agg_loss(loss_mat, mask, mode, dp_size=1), agg_loss(loss_mat, mask, mode))


# --- micro-batch invariance ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("split", SPLITS, ids=str)
def test_micro_batch_losses_sum_to_the_full_loss_and_gradient(mode: str, split: list[int]) -> None:
    g = torch.Generator().manual_seed(2)
    mask = ragged_mask()
    theta = torch.randn(N, T, generator=g, requires_grad=True)
    target = torch.randn(N, T, generator=g)
    norm = LossNormalizer.from_mask(mask)

    full = agg_loss((theta - target) ** 2, mask, mode, norm)
    (full_grad,) = torch.autograd.grad(full, theta)

    total = torch.zeros(())
    for rows in torch.arange(N).split(split):
        mb_mask, mb_theta, mb_target = trim(mask[rows], theta[rows], target[rows])
        total = total + agg_loss((mb_theta - mb_target) ** 2, mb_mask, mode, norm)
    (acc_grad,) = torch.autograd.grad(total, theta)

    torch.testing.assert_close(total, full)
    torch.testing.assert_close(acc_grad, full_grad)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
def test_verl_legacy_per_micro_batch_normalisation_is_not_invariant(mode: str) -> None:
    """Without a shared normaliser, micro-batching changes the gradient (verl #5625)."""
    g = torch.Generator().manual_seed(2)
    mask = ragged_mask()
    theta = torch.randn(N, T, generator=g, requires_grad=True)
    target = torch.randn(N, T, generator=g)
    (full_grad,) = torch.autograd.grad(agg_loss((theta - target) ** 2, mask, mode), theta)
    total = torch.zeros(())
    for rows in torch.arange(N).split([5, 4, 3]):
        mb_mask, mb_theta, mb_target = trim(mask[rows], theta[rows], target[rows])
        # verl legacy: local normalisation, scaled by the micro-batch's share of rows
        total = total + agg_loss((mb_theta - mb_target) ** 2, mb_mask, mode) * len(rows) / N
    (legacy_grad,) = torch.autograd.grad(total, theta)
    assert not torch.allclose(legacy_grad, full_grad, atol=1e-4)


class TinyPolicy(nn.Module):
    """A policy small enough to check parameters exactly: token ids (N, T) -> logits (N, T, V)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.head = nn.Linear(H, V)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(torch.tanh(self.embed(ids)))


def logprobs_of(model: nn.Module, ids: Tensor) -> Tensor:
    return torch.log_softmax(model(ids), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _step(loss_name: str, mode: str, split: list[int]) -> list[Tensor]:
    """Gradients and parameters after one step of a tiny policy, accumulating over `split`."""
    torch.manual_seed(0)
    model = TinyPolicy()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (N, T), generator=g)
    mask = ragged_mask()
    with torch.no_grad():
        old = logprobs_of(model, ids) + 0.3 * torch.randn(N, T, generator=g)  # off-policy, so clipping happens
    adv = torch.randn(N, 1, generator=g).expand(N, T) * mask
    norm = LossNormalizer.from_mask(mask)
    # SGD: Adam's first step divides by |g|, which would blow float noise on ~0 gradients up
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.zero_grad()
    for rows in torch.arange(N).split(split):
        mb_mask, mb_ids, mb_old, mb_adv = trim(mask[rows], ids[rows], old[rows], adv[rows])
        out = POLICY_LOSSES.get(loss_name)(
            mb_old, logprobs_of(model, mb_ids), mb_adv, mb_mask, loss_agg_mode=mode, normalizer=norm
        )
        out.loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    opt.step()
    return grads + [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("loss_name", ["vanilla", "gspo", "cispo", "gpg"])
def test_accumulated_step_equals_full_batch_step(loss_name: str, mode: str) -> None:
    full = _step(loss_name, mode, [N])
    for split in SPLITS[1:]:
        for a, b in zip(_step(loss_name, mode, split), full, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("loss_name", ["sapo", "geo_mean"])
def test_sequence_level_losses_are_invariant_too(loss_name: str) -> None:
    full = _step(loss_name, "token-mean", [N])
    for split in SPLITS[1:]:
        for a, b in zip(_step(loss_name, "token-mean", split), full, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_is_invariant(mode: str) -> None:
    g = torch.Generator().manual_seed(4)
    mask = ragged_mask()
    vpreds = torch.randn(N, T, generator=g, requires_grad=True)
    returns, values = torch.randn(N, T, generator=g), torch.randn(N, T, generator=g)
    norm = LossNormalizer.from_mask(mask)
    full, _ = value_loss(vpreds, returns, values, mask, 0.2, mode, norm)
    (full_grad,) = torch.autograd.grad(full, vpreds)
    total = torch.zeros(())
    for rows in torch.arange(N).split([5, 4, 3]):
        mb_mask, mb_v, mb_r, mb_old = trim(mask[rows], vpreds[rows], returns[rows], values[rows])
        total = total + value_loss(mb_v, mb_r, mb_old, mb_mask, 0.2, mode, norm)[0]
    (acc_grad,) = torch.autograd.grad(total, vpreds)
    torch.testing.assert_close(acc_grad, full_grad)
