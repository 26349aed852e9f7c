"""Unit tests for ``queryrl.algos.advantages``.

Three kinds of test, in the torchtune / cleanRL style:

- hand-worked cases, with the arithmetic in the comments;
- slow, obviously correct reference loops written here (verl's original dict-of-groups code,
  a per-row GAE over the counted tokens only) compared with the vectorised estimators on
  random ragged batches;
- properties that must hold for any input (zero-sum groups, constant groups give 0, masking,
  permutation, id formats).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

import numpy as np
import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from queryrl.algos import RegistryError
from queryrl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    gae,
    gpg,
    group_index,
    group_mean_std,
    grpo,
    grpo_passk,
    grpo_reference,
    opo,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    remax,
    rloo,
)

EPS = 1e-6  # the estimators' default epsilon
WHITEN_EPS = 1e-8  # verl's variance guard in masked_whiten
ALL_NAMES = {
    "gae",
    "grpo",
    "grpo_passk",
    "grpo_reference",
    "rloo",
    "remax",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "opo",
    "gpg",
}
GROUP_ESTIMATORS = ["grpo", "rloo", "opo", "gpg", "grpo_passk"]  # outcome estimators that use groups


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _outcome(scores: Sequence[float], lengths: Sequence[int], t: int) -> tuple[Tensor, Tensor]:
    """(token_rewards, response_mask), (N, T): each score on the last counted token of its row."""
    n = len(scores)
    rewards = torch.zeros(n, t)
    mask = torch.zeros(n, t)
    for i, (score, length) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, :length] = 1.0
        rewards[i, length - 1] = score
    return rewards, mask


def _whiten_reference(x: Tensor, mask: Tensor) -> Tensor:
    """Whitening written out: mean and unbiased variance over the counted entries only."""
    counted = x[mask.bool()]
    return (x - counted.mean()) / torch.sqrt(counted.var(unbiased=True) + WHITEN_EPS)


def _ragged_batch(
    seed: int, *, with_holes: bool = False, constant: float | None = None
) -> tuple[Tensor, Tensor, list[int]]:
    """A random ragged batch: G groups of sizes 1..6, rows shuffled, ids non-contiguous ints.

    Scores are a mix of binary groups (some all-0 or all-1) and continuous ones. With
    `constant`, one extra group of size 2..6 has every score equal to it. With `with_holes`,
    some rows get masked positions inside the response (tool tokens).

    Returns ``(token_rewards (N, T), response_mask (N, T), group_ids)``.
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    t = rng.randint(2, 8)
    num_groups = rng.randint(1, 5)
    ids = rng.sample(range(10, 10_000), num_groups + 1)
    rows: list[tuple[int, float]] = []
    for g in ids[:num_groups]:
        size = rng.randint(1, 6)
        if rng.random() < 0.5:
            scores = [float(rng.random() < 0.5) for _ in range(size)]
        else:
            scores = torch.randn(size, generator=gen).tolist()
        rows += [(g, s) for s in scores]
    if constant is not None:
        rows += [(ids[-1], constant)] * rng.randint(2, 6)
    rng.shuffle(rows)
    n = len(rows)
    lengths = [rng.randint(1, t) for _ in range(n)]
    rewards, mask = _outcome([s for _, s in rows], lengths, t)
    if with_holes:
        for i, length in enumerate(lengths):
            if length >= 3 and rng.random() < 0.5:
                mask[i, rng.randint(1, length - 2)] = 0.0  # never the first or last counted token
    return rewards, mask, [g for g, _ in rows]


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """{id: [row, ...]} in order of appearance."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    return members


def _call(name: str, rewards: Tensor, mask: Tensor, ids: object, **kwargs: object) -> tuple[Tensor, Tensor]:
    """Run estimator `name`, supplying whatever inputs it needs (values, baselines)."""
    n = rewards.shape[0]
    kwargs.setdefault("values", torch.linspace(-1.0, 1.0, rewards.numel()).reshape(rewards.shape))
    kwargs.setdefault("reward_baselines", torch.linspace(0.0, 0.5, n))
    return compute_advantages(name, rewards, mask, group_ids=ids, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# 1. hand-worked numbers
# ---------------------------------------------------------------------------------------------

# Six rows, three groups, interleaved:   row:    0    1    2    3    4    5
HAND_IDS = ["a", "b", "a", "c", "b", "b"]
HAND_SCORES = [1.0, 2.0, 0.0, 0.5, 0.0, 1.0]
HAND_LENGTHS = [2, 4, 3, 1, 1, 3]
HAND_T = 4
# group a = rows {0, 2}: scores {1, 0}, mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.707107
# group b = rows {1, 4, 5}: scores {2, 0, 1}, mean 1, unbiased std sqrt((1 + 1 + 0) / 2) = 1
# group c = row {3}: a group of one, mean 0 and std 1 by convention


def _hand_check(fn: Callable[..., tuple[Tensor, Tensor]], expected_seq: list[float], **kwargs: object) -> None:
    rewards, mask = _outcome(HAND_SCORES, HAND_LENGTHS, HAND_T)
    adv, returns = fn(rewards, mask, group_ids=HAND_IDS, **kwargs)
    expected = torch.tensor(expected_seq).unsqueeze(-1) * mask  # broadcast over counted tokens
    assert_close(adv, expected)
    assert_close(returns, expected)


def test_grpo_hand_worked() -> None:
    _hand_check(
        grpo,
        [
            0.7071058,  # a: (1 - 0.5) / (0.707107 + 1e-6) = 0.707106
            0.999999,  # b: (2 - 1) / (1 + 1e-6)
            -0.7071058,  # a: (0 - 0.5) / (0.707107 + 1e-6)
            0.4999995,  # c: alone, keeps its raw score: 0.5 / (1 + 1e-6)
            -0.999999,  # b: (0 - 1) / (1 + 1e-6)
            0.0,  # b: (1 - 1) / (1 + 1e-6)
        ],
    )


def test_dr_grpo_hand_worked() -> None:
    # norm_adv_by_std=False: r - mean only (Dr.GRPO); the group of one keeps 0.5 undivided.
    _hand_check(grpo, [0.5, 1.0, -0.5, 0.5, -1.0, 0.0], norm_adv_by_std=False)


def test_rloo_hand_worked() -> None:
    _hand_check(
        rloo,
        [
            1.0,  # a: 1 - mean{0} = 1
            1.5,  # b: 2 - mean{0, 1} = 1.5
            -1.0,  # a: 0 - mean{1} = -1
            0.5,  # c: alone, raw score
            -1.5,  # b: 0 - mean{2, 1} = -1.5
            0.0,  # b: 1 - mean{2, 0} = 0
        ],
    )


def test_opo_hand_worked() -> None:
    # baseline = sum(len * r) / sum(len) per group.
    # a: lengths {2, 3}, scores {1, 0}: (2*1 + 3*0) / 5 = 0.4
    # b: lengths {4, 1, 3}, scores {2, 0, 1}: (4*2 + 1*0 + 3*1) / 8 = 11/8 = 1.375
    #    (the unweighted mean would be 1: this case tells the two apart)
    # c: alone, baseline 0
    _hand_check(opo, [1.0 - 0.4, 2.0 - 1.375, 0.0 - 0.4, 0.5, 0.0 - 1.375, 1.0 - 1.375])


def test_gpg_hand_worked() -> None:
    # alpha = N / #(nonzero scores) = 6 / #{1, 2, 0.5, 1} = 6 / 4 = 1.5; A = alpha * (r - mean_g)
    _hand_check(
        gpg,
        [
            0.75,  # a: 1.5 * (1 - 0.5)
            1.5,  # b: 1.5 * (2 - 1)
            -0.75,  # a: 1.5 * (0 - 0.5)
            0.75,  # c: alone, mean 0: 1.5 * 0.5
            -1.5,  # b: 1.5 * (0 - 1)
            0.0,  # b: 1.5 * (1 - 1)
        ],
    )
    # gpg never divides by the std: the flag changes nothing.
    _hand_check(gpg, [0.75, 1.5, -0.75, 0.75, -1.5, 0.0], norm_adv_by_std=False)


def test_grpo_passk_hand_worked() -> None:
    # only the best of each group learns: r_max - r_second, / (std + eps) when normalising.
    # a: best row 0, 1 - 0 = 1, / (0.707107 + 1e-6) = 1.414212
    # b: best row 1, 2 - 1 = 1, / (1 + 1e-6) = 0.999999
    # c: a group of one has no second: 0 (verl raises)
    _hand_check(grpo_passk, [1.4142116, 0.999999, 0.0, 0.0, 0.0, 0.0])
    _hand_check(grpo_passk, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0], norm_adv_by_std=False)


def test_remax_hand_worked() -> None:
    rewards = torch.tensor([[0.1, 0.0, 1.0, 7.0], [0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    baselines = torch.tensor([0.4, 1.5])
    adv, returns = remax(rewards, mask, reward_baselines=baselines)
    # row 0: the 7 sits on a masked token and is dropped; return-to-go [1.1, 1.0, 1.0, 0]
    #        minus the greedy reward 0.4 on counted tokens: [0.7, 0.6, 0.6, 0]
    # row 1: return-to-go [2, 2, 0, 0] minus 1.5: [0.5, 0.5, -1.5, -1.5]
    assert_close(returns, torch.tensor([[1.1, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]]))
    assert_close(adv, torch.tensor([[0.7, 0.6, 0.6, 0.0], [0.5, 0.5, -1.5, -1.5]]))


def test_reinforce_plus_plus_hand_worked_gamma() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0, 2.0], [0.0, 1.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv, returns = reinforce_plus_plus(rewards, mask, gamma=0.5)
    # G_t = r_t + 0.5 * G_{t+1} over counted tokens; a masked position is skipped (return 0):
    # row 0: t=3 masked, its 2 is dropped: G_3 = 0; G_2 = 1, G_1 = 0.5, G_0 = 0.25
    # row 1: G_3 = 1, G_2 = 0 + 0.5 = 0.5, G_1 = 1 + 0.25 = 1.25, G_0 = 0 + 0.625 = 0.625
    assert_close(returns, torch.tensor([[0.25, 0.5, 1.0, 0.0], [0.625, 1.25, 0.5, 1.0]]))
    # whitened over the 7 counted returns {0.25, 0.5, 1, 0.625, 1.25, 0.5, 1}:
    # mean 5.125 / 7 = 0.732143, unbiased std 0.356696; masked positions are 0
    expected = torch.tensor([[-1.35169, -0.65081, 0.75094, 0.0], [-0.30038, 1.45182, -0.65081, 0.75094]])
    assert_close(adv, expected, atol=1e-4, rtol=1e-4)


def test_reinforce_plus_plus_baseline_hand_worked() -> None:
    # group {1, 0} over lengths {1, 2}: r - mean = {0.5, -0.5} on every counted token,
    # counted entries {0.5, -0.5, -0.5}: mean -1/6, unbiased var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3
    rewards, mask = _outcome([1.0, 0.0], [1, 2], 2)
    adv, returns = reinforce_plus_plus_baseline(rewards, mask, group_ids=[7, 7])
    hi = (0.5 + 1 / 6) / math.sqrt(1 / 3 + WHITEN_EPS)  # 1.154700
    lo = (-0.5 + 1 / 6) / math.sqrt(1 / 3 + WHITEN_EPS)  # -0.577350
    expected = torch.tensor([[hi, 0.0], [lo, lo]])
    assert_close(adv, expected)
    assert_close(returns, expected)


def test_gae_hand_worked_with_hole_and_padding() -> None:
    gamma, lam = 0.9, 0.8  # gamma * lam = 0.72
    # row 0: a tool token (hole) at t=1; its reward 5 and value 9 must be ignored.
    # row 1: trailing padding at t=2, 3; rewards 3 and values 8 there must be ignored.
    rewards = torch.tensor([[0.0, 5.0, 0.0, 1.0], [0.0, 1.0, 3.0, 3.0]])
    values = torch.tensor([[0.5, 9.0, 0.6, 0.7], [0.2, 0.4, 8.0, 8.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    adv, returns = gae(rewards, mask, values=values, gamma=gamma, lam=lam)
    # row 0, backwards:
    #   t=3: delta = 1 + 0.9*0 - 0.7 = 0.3;                    A_3 = 0.3
    #   t=2: delta = 0 + 0.9*0.7 - 0.6 = 0.03;                 A_2 = 0.03 + 0.72*0.3 = 0.246
    #   t=1: hole: next value stays V_2 = 0.6, A carries:      A_1 = 0.246
    #   t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04 (V_2 not V_1!); A_0 = 0.04 + 0.72*0.246 = 0.21712
    # row 1:
    #   t=3, 2: masked, nothing yet:                           A = 0
    #   t=1: delta = 1 + 0.9*0 - 0.4 = 0.6;                    A_1 = 0.6
    #   t=0: delta = 0 + 0.9*0.4 - 0.2 = 0.16;                 A_0 = 0.16 + 0.72*0.6 = 0.592
    raw = torch.tensor([[0.21712, 0.246, 0.246, 0.3], [0.592, 0.6, 0.0, 0.0]])
    assert_close(returns, raw + values)  # = [[0.71712, 9.246, 0.846, 1.0], [0.792, 1.0, 8, 8]]
    # whitened over the 5 counted {0.21712, 0.246, 0.3, 0.592, 0.6}: mean 0.391024, std 0.189488
    # (masked positions are whitened too and not zeroed, as in verl)
    expected = torch.tensor([[-0.91776, -0.76535, -0.76535, -0.48037], [1.06063, 1.10285, -2.06359, -2.06359]])
    assert_close(adv, expected, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# slow references, written the obvious way
# ---------------------------------------------------------------------------------------------


def _verl_group_reference(
    name: str, rewards: Tensor, mask: Tensor, group_ids: Sequence[Hashable], norm_adv_by_std: bool = True
) -> Tensor:
    """verl 0.9.1's original python loop over a dict of groups; returns (N, T) advantages."""
    scores = rewards.sum(dim=-1).clone()
    lengths = mask.sum(dim=-1)
    n = scores.shape[0]
    out = torch.zeros(n)
    alpha = n / max(int((scores != 0).sum()), 1)
    for rows in _groups(group_ids).values():
        group = torch.stack([scores[i] for i in rows])
        k = len(rows)
        if name == "grpo_passk":
            if k < 2:
                continue
            top, top_idx = torch.topk(group, 2)
            value = top[0] - top[1]
            if norm_adv_by_std:
                value = value / (torch.std(group) + EPS)
            out[rows[int(top_idx[0])]] = value
            continue
        mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if k == 1 else (group.mean(), group.std())
        for i in rows:
            if name == "grpo":
                out[i] = (scores[i] - mean) / (std + EPS) if norm_adv_by_std else scores[i] - mean
            elif name == "rloo":
                out[i] = scores[i] * k / (k - 1) - mean * k / (k - 1) if k > 1 else scores[i]
            elif name == "gpg":
                out[i] = alpha * (scores[i] - mean)
            elif name == "opo":
                lens = torch.stack([lengths[j] for j in rows])
                baseline = (lens * group).sum() / lens.sum() if k > 1 else torch.tensor(0.0)
                out[i] = scores[i] - baseline
            else:
                raise AssertionError(name)
    return out.unsqueeze(-1) * mask


@pytest.mark.parametrize(
    ("name", "norm"),
    [
        ("grpo", True),
        ("grpo", False),
        ("rloo", True),
        ("opo", True),
        ("gpg", True),
        ("grpo_passk", True),
        ("grpo_passk", False),
    ],
)
def test_group_estimators_match_verl_loop(name: str, norm: bool) -> None:
    for seed in range(20):
        rewards, mask, ids = _ragged_batch(seed)
        adv, returns = compute_advantages(name, rewards, mask, group_ids=ids, norm_adv_by_std=norm)
        expected = _verl_group_reference(name, rewards, mask, ids, norm_adv_by_std=norm)
        assert_close(adv, expected, atol=1e-5, rtol=1e-4, msg=lambda m, s=seed: f"seed {s}: {m}")
        assert_close(returns, adv)


def _gae_reference(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """Raw (un-whitened) GAE, one row at a time over the counted tokens only.

    A masked position takes the advantage of the next counted token to its right (0 after the
    last one): the running advantage carries across holes.
    """
    n, t = rewards.shape
    raw = torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        counted = [j for j in range(t) if mask[i, j] > 0]
        adv_at: dict[int, float] = {}
        running, next_value = 0.0, 0.0
        for j in reversed(counted):
            delta = float(rewards[i, j]) + gamma * next_value - float(values[i, j])
            running = delta + gamma * lam * running
            next_value = float(values[i, j])
            adv_at[j] = running
        carried = 0.0
        for j in reversed(range(t)):
            carried = adv_at.get(j, carried)
            raw[i, j] = carried
    return raw.to(rewards.dtype)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
def test_gae_matches_per_row_reference(gamma: float, lam: float) -> None:
    for seed in range(20):
        rewards, mask, _ = _ragged_batch(seed, with_holes=True)
        gen = torch.Generator().manual_seed(1000 + seed)
        rewards = rewards + 0.1 * torch.randn(rewards.shape, generator=gen)  # dense token rewards too
        values = torch.randn(rewards.shape, generator=gen)
        adv, returns = gae(rewards, mask, values=values, gamma=gamma, lam=lam)
        raw = _gae_reference(rewards, values, mask, gamma, lam)
        assert_close(returns, raw + values, atol=1e-5, rtol=1e-4)
        assert_close(adv, _whiten_reference(raw, mask), atol=1e-4, rtol=1e-4)


def _rpp_reference(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted return-to-go per row over the counted tokens only; masked positions get 0."""
    n, t = rewards.shape
    returns = torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        following = 0.0  # G of the next counted token
        for j in reversed(range(t)):
            if mask[i, j] > 0:
                following = float(rewards[i, j]) + gamma * following
                returns[i, j] = following
    return returns.to(rewards.dtype)


@pytest.mark.parametrize("gamma", [1.0, 0.95, 0.5])
def test_reinforce_plus_plus_matches_reference(gamma: float) -> None:
    for seed in range(20):
        rewards, mask, _ = _ragged_batch(seed, with_holes=True)
        gen = torch.Generator().manual_seed(2000 + seed)
        rewards = rewards + torch.randn(rewards.shape, generator=gen)  # rewards on padding too
        adv, returns = reinforce_plus_plus(rewards, mask, gamma=gamma)
        expected_returns = _rpp_reference(rewards, mask, gamma)
        assert_close(returns, expected_returns, atol=1e-5, rtol=1e-4)
        assert_close(adv, _whiten_reference(expected_returns, mask) * mask, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# 2. properties on random ragged batches
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*GROUP_ESTIMATORS, "reinforce_plus_plus_baseline"])
def test_group_id_formats_agree(name: str) -> None:
    for seed in range(10):
        rewards, mask, ids = _ragged_batch(seed)
        expected, _ = compute_advantages(name, rewards, mask, group_ids=ids)
        for fmt in (
            [f"prompt-{g}" for g in ids],
            torch.tensor(ids),
            np.array(ids),
            tuple(ids),
        ):
            got, _ = compute_advantages(name, rewards, mask, group_ids=fmt)
            assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize(("name", "norm"), [("grpo", True), ("grpo", False), ("rloo", True)])
def test_advantages_sum_to_zero_in_each_group(name: str, norm: bool) -> None:
    checked = 0
    for seed in range(20):
        rewards, mask, ids = _ragged_batch(seed)
        adv, _ = compute_advantages(name, rewards, mask, group_ids=ids, norm_adv_by_std=norm)
        per_seq = adv[:, 0]  # every row counts its first token
        for rows in _groups(ids).values():
            if len(rows) > 1:
                assert_close(per_seq[rows].sum(), torch.tensor(0.0), atol=1e-5, rtol=0)
                checked += 1
    assert checked > 20  # the generator did produce groups of more than one


@pytest.mark.parametrize("name", ["grpo", "rloo", "gpg", "grpo_passk", "opo"])
@pytest.mark.parametrize("norm", [True, False])
def test_constant_group_gives_exactly_zero(name: str, norm: bool) -> None:
    # 0.3 is not exactly representable: summing then dividing need not give 0.3 back.
    for seed in range(10):
        rewards, mask, ids = _ragged_batch(seed, constant=0.3)
        scores = rewards.sum(dim=-1)
        adv, _ = compute_advantages(name, rewards, mask, group_ids=ids, norm_adv_by_std=norm)
        assert not adv.isnan().any()
        constant_rows = [rows for rows in _groups(ids).values() if len(rows) > 1 and (scores[rows] == 0.3).all()]
        assert constant_rows
        for rows in constant_rows:
            assert torch.equal(adv[rows], torch.zeros_like(adv[rows])), (seed, adv[rows])


def test_constant_group_all_zero_scores_no_nan() -> None:
    # every score 0: gpg's alpha = N / max(0, 1); grpo's std 0 -> 0 / (0 + eps).
    rewards, mask = _outcome([0.0] * 4, [1, 2, 3, 4], 4)
    for name in GROUP_ESTIMATORS:
        adv, _ = compute_advantages(name, rewards, mask, group_ids=[1, 1, 2, 2])
        assert torch.equal(adv, torch.zeros(4, 4)), name


def test_opo_constant_group_is_near_zero() -> None:
    # lengths {5, 1}, scores 0.3: baseline (5*0.3 + 1*0.3) / 6 is within an ulp of 0.3.
    rewards, mask = _outcome([0.3, 0.3], [5, 1], 5)
    adv, _ = opo(rewards, mask, group_ids=[0, 0])
    assert not adv.isnan().any()
    assert_close(adv, torch.zeros_like(adv), atol=1e-6, rtol=0)


def test_opo_constant_group_is_exactly_zero() -> None:
    rewards, mask = _outcome([0.3, 0.3], [5, 1], 5)
    adv, _ = opo(rewards, mask, group_ids=[0, 0])
    assert torch.equal(adv, torch.zeros_like(adv)), adv


def test_group_of_one_keeps_raw_score() -> None:
    checked = 0
    for seed in range(20):
        rewards, mask, ids = _ragged_batch(seed)
        scores = rewards.sum(dim=-1)
        g_adv, _ = grpo(rewards, mask, group_ids=ids)
        d_adv, _ = grpo(rewards, mask, group_ids=ids, norm_adv_by_std=False)
        r_adv, _ = rloo(rewards, mask, group_ids=ids)
        o_adv, _ = opo(rewards, mask, group_ids=ids)
        p_adv, _ = grpo_passk(rewards, mask, group_ids=ids)
        for rows in _groups(ids).values():
            if len(rows) != 1:
                continue
            i = rows[0]
            assert_close(g_adv[i], scores[i] / (1 + EPS) * mask[i])  # mean 0, std 1
            assert_close(d_adv[i], scores[i] * mask[i])
            assert_close(r_adv[i], scores[i] * mask[i])
            assert_close(o_adv[i], scores[i] * mask[i])  # baseline 0
            # documented deviation: verl raises for a group of one; here it gets 0
            assert torch.equal(p_adv[i], torch.zeros_like(p_adv[i]))
            checked += 1
    assert checked > 5


@pytest.mark.parametrize("name", sorted(ALL_NAMES - {"gae"}))
def test_zero_at_masked_positions(name: str) -> None:
    # gae is left out on purpose: its whitened advantages are not re-masked (verl does the same).
    # remax gets trailing padding only: its return-to-go is a cumsum that spans a hole, so a
    # tool token inside a response holds the return of what follows it (verl does the same).
    for seed in range(10):
        rewards, mask, ids = _ragged_batch(seed, with_holes=name != "remax")
        adv, _ = _call(name, rewards, mask, ids)
        assert torch.equal(adv[mask == 0], torch.zeros_like(adv[mask == 0])), seed
        assert (adv[mask == 1] != 0).any() or name in {"grpo_passk"}  # not trivially all 0


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg"])
def test_permuting_rows_permutes_advantages(name: str) -> None:
    for seed in range(10):
        rewards, mask, ids = _ragged_batch(seed)
        perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))
        adv, _ = compute_advantages(name, rewards, mask, group_ids=ids)
        adv_p, _ = compute_advantages(name, rewards[perm], mask[perm], group_ids=[ids[i] for i in perm.tolist()])
        assert_close(adv_p, adv[perm])


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "grpo_passk"])
def test_outcome_estimators_ignore_values_baselines_gamma_lam(name: str) -> None:
    rewards, mask, ids = _ragged_batch(3)
    ref, _ = compute_advantages(name, rewards, mask, group_ids=ids)
    got, _ = compute_advantages(
        name,
        rewards,
        mask,
        group_ids=ids,
        values=torch.randn(rewards.shape),
        reward_baselines=torch.randn(rewards.shape[0]),
        gamma=0.5,
        lam=0.3,
    )
    assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_outcome_score_is_the_row_sum_of_token_rewards(name: str) -> None:
    # verl sums every token reward of a row (masked ones included); where in the row the
    # reward sits does not matter. Spread each score over the row: same advantages.
    rewards, mask, ids = _ragged_batch(5)
    t = rewards.shape[1]
    spread = rewards.sum(dim=-1, keepdim=True).expand(-1, t) / t
    a, _ = compute_advantages(name, rewards, mask, group_ids=ids)
    b, _ = compute_advantages(name, spread.contiguous(), mask, group_ids=ids)
    assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_gae_ignores_values_and_rewards_at_masked_positions() -> None:
    # values at masked positions never enter: the next value carries across holes and is 0
    # past the last counted token. Rewards there are discarded with the masked TD-error.
    for seed in range(10):
        rewards, mask, _ = _ragged_batch(seed, with_holes=True)
        if bool(mask.all()):
            continue
        gen = torch.Generator().manual_seed(seed)
        values = torch.randn(rewards.shape, generator=gen)
        junk = torch.randn(rewards.shape, generator=gen) * 100
        masked = mask == 0
        adv, returns = gae(rewards, mask, values=values, gamma=0.99, lam=0.95)
        adv2, returns2 = gae(
            torch.where(masked, junk, rewards), mask, values=torch.where(masked, junk, values), gamma=0.99, lam=0.95
        )
        assert_close(adv2, adv)
        assert_close(returns2[~masked], returns[~masked])


def test_gae_trailing_padding_values_do_not_leak() -> None:
    # the same response with and without two padded positions holding huge values
    rewards = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.5, -1.0]])
    values = torch.tensor([[0.1, 0.2, 0.3], [0.0, -0.4, 0.2]])
    mask = torch.ones(2, 3)
    adv, _ = gae(rewards, mask, values=values, gamma=0.9, lam=0.7)
    pad = torch.full((2, 2), 50.0)
    adv_pad, _ = gae(
        torch.cat([rewards, pad], dim=1),
        torch.cat([mask, torch.zeros(2, 2)], dim=1),
        values=torch.cat([values, pad], dim=1),
        gamma=0.9,
        lam=0.7,
    )
    assert_close(adv_pad[:, :3], adv)


def test_reinforce_plus_plus_ignores_rewards_after_last_counted_token() -> None:
    rewards, mask, _ = _ragged_batch(7)  # trailing padding only, no holes
    assert not bool(mask.all())
    padded = mask == 0
    adv, _ = reinforce_plus_plus(rewards, mask, gamma=0.9)
    adv2, _ = reinforce_plus_plus(torch.where(padded, 3.0, rewards), mask, gamma=0.9)
    assert_close(adv2, adv)


def test_remax_ignores_rewards_at_masked_positions() -> None:
    rewards, mask, _ = _ragged_batch(11, with_holes=True)
    baselines = torch.linspace(0.0, 1.0, rewards.shape[0])
    adv, returns = remax(rewards, mask, reward_baselines=baselines)
    adv2, returns2 = remax(torch.where(mask == 0, -4.0, rewards), mask, reward_baselines=baselines)
    assert_close(adv2, adv, rtol=0, atol=0)
    assert_close(returns2, returns, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# group helpers
# ---------------------------------------------------------------------------------------------


def test_group_index_in_order_of_first_appearance() -> None:
    inverse, g = group_index(["x", "y", "x", 3, "y"], 5)
    assert g == 3
    assert inverse.tolist() == [0, 1, 0, 2, 1]
    assert inverse.dtype == torch.long


def test_group_mean_std_conventions() -> None:
    # groups: 0 -> {1, 3} (mean 2, std sqrt(2)), 1 -> {5} (single: mean 0, std 1), 2 -> {0.3, 0.3, 0.3}
    scores = torch.tensor([1.0, 5.0, 0.3, 3.0, 0.3, 0.3])
    inverse = torch.tensor([0, 1, 2, 0, 2, 2])
    mean, std, count = group_mean_std(scores, inverse, 3)
    assert_close(mean, torch.tensor([2.0, 0.0, 0.3, 2.0, 0.3, 0.3]))
    assert_close(std, torch.tensor([math.sqrt(2), 1.0, 0.0, math.sqrt(2), 0.0, 0.0]))
    assert_close(count, torch.tensor([2.0, 1.0, 3.0, 2.0, 3.0, 3.0]))
    assert torch.equal(scores[[2, 4, 5]] - mean[[2, 4, 5]], torch.zeros(3))  # exact for the constant group


# ---------------------------------------------------------------------------------------------
# 4. errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "missing", "needs"),
    [
        ("grpo", "group_ids", "group_ids"),
        ("grpo_passk", "group_ids", "group_ids"),
        ("rloo", "group_ids", "group_ids"),
        ("opo", "group_ids", "group_ids"),
        ("gpg", "group_ids", "group_ids"),
        ("reinforce_plus_plus_baseline", "group_ids", "group_ids"),
        ("gae", "values", "values"),
        ("remax", "reward_baselines", "reward_baselines"),
    ],
)
def test_missing_input_raises(name: str, missing: str, needs: str) -> None:
    rewards, mask = _outcome([1.0, 0.0], [2, 2], 2)
    kwargs: dict[str, object] = {
        "group_ids": [0, 0],
        "values": torch.zeros(2, 2),
        "reward_baselines": torch.zeros(2),
    }
    kwargs[missing] = None
    with pytest.raises(ValueError, match=rf"{name!r} needs {needs}"):
        compute_advantages(name, rewards, mask, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "grpo_passk", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("bad_ids", [[0, 0], [0, 0, 1, 1], torch.tensor([0, 1]), np.array([0, 1, 2, 3])])
def test_group_ids_wrong_length_raises(name: str, bad_ids: object) -> None:
    rewards, mask = _outcome([1.0, 0.0, 0.5], [1, 2, 2], 2)
    with pytest.raises(ValueError, match=r"group_ids has \d entries but there are 3 sequences"):
        compute_advantages(name, rewards, mask, group_ids=bad_ids)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# 5. registry and dispatch
# ---------------------------------------------------------------------------------------------


def test_registry_has_exactly_the_estimators() -> None:
    assert set(ADVANTAGE_ESTIMATORS.names()) == ALL_NAMES
    assert len(ADVANTAGE_ESTIMATORS) == len(ALL_NAMES)


def test_registry_unknown_name_lists_valid_ones() -> None:
    rewards, mask = _outcome([1.0, 0.0], [2, 2], 2)
    with pytest.raises(RegistryError, match=r"unknown advantage estimator 'ppo'.*grpo"):
        compute_advantages("ppo", rewards, mask, group_ids=[0, 0])


FUNCTIONS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "gae": gae,
    "grpo": grpo,
    "grpo_passk": grpo_passk,
    "grpo_reference": grpo_reference,
    "rloo": rloo,
    "remax": remax,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
    "opo": opo,
    "gpg": gpg,
}


@pytest.mark.parametrize("name", sorted(ALL_NAMES))
def test_compute_advantages_dispatches_and_forwards_kwargs(name: str) -> None:
    assert ADVANTAGE_ESTIMATORS.get(name) is FUNCTIONS[name]
    rewards, mask, ids = _ragged_batch(13, with_holes=True)
    gen = torch.Generator().manual_seed(13)
    kwargs: dict[str, object] = {
        "group_ids": ids,
        "values": torch.randn(rewards.shape, generator=gen),
        "reward_baselines": torch.randn(rewards.shape[0], generator=gen),
        "gamma": 0.9,
        "lam": 0.7,
        "epsilon": 0.1,
        "norm_adv_by_std": False,
    }
    adv, returns = compute_advantages(name, rewards, mask, **kwargs)  # type: ignore[arg-type]
    adv_direct, returns_direct = FUNCTIONS[name](rewards, mask, **kwargs)
    assert_close(adv, adv_direct, rtol=0, atol=0)
    assert_close(returns, returns_direct, rtol=0, atol=0)
    # the result is that estimator's own: no two estimators agree on this batch
    for other in sorted(ALL_NAMES - {name}):
        other_adv, _ = FUNCTIONS[other](rewards, mask, **kwargs)
        assert not torch.allclose(adv, other_adv), (name, other)


def test_a_constant_group_is_exactly_zero_where_verl_gives_float_noise() -> None:
    """Deliberately not verl 0.9.1: its mean of eight 0.3s misses 0.3 by an ulp and the noise is divided by
    std + eps; queryrl's constant group gets exactly 0 (queryrl/algos/advantages.py module doc)."""
    scores = torch.full((8,), 0.3)
    verl_like = (scores - scores.mean()) / (scores.std() + 1e-6)  # what verl's grpo computes for this group
    assert float(verl_like[0]) != 0.0
    adv, _ = ADVANTAGE_ESTIMATORS.get("grpo")(scores.unsqueeze(-1), torch.ones(8, 1), group_ids=[0] * 8)
    assert torch.equal(adv, torch.zeros(8, 1))


def test_bf16_group_statistics_are_the_float32_ones_rounded_once() -> None:
    from queryrl.algos import group_mean_std
    from queryrl.algos.advantages import group_index

    gen = torch.Generator().manual_seed(0)
    scores = (torch.rand(400, generator=gen) * 3).to(torch.bfloat16)
    ids = torch.randint(0, 50, (400,), generator=gen)
    inverse, groups = group_index(ids, 400)
    mean, std, _ = group_mean_std(scores, inverse, groups)
    mean32, std32, _ = group_mean_std(scores.float(), inverse, groups)
    assert mean.dtype == std.dtype == torch.bfloat16
    assert torch.equal(mean, mean32.to(torch.bfloat16))
    assert torch.equal(std, std32.to(torch.bfloat16))
    # against float64: no worse than rounding the exact value once (bf16 sums were up to a few ulps off)
    exact = group_mean_std(scores.double(), inverse, groups)[0]
    assert torch.all((mean.double() - exact).abs() <= (exact.to(torch.bfloat16).double() - exact).abs() + 1e-12)


def test_float_group_ids_near_integers_are_those_integers_as_in_verl() -> None:
    from queryrl.algos.advantages import group_index

    assert group_index([1.0000001, 1.0, 2.0], 3)[1] == 2  # verl's as_torch_index rounds within 1e-6
    assert group_index(torch.tensor([1.0000001, 1.0], dtype=torch.float64), 2)[1] == 1
    assert group_index([1.5, 1.5000001], 2)[1] == 2  # not near integers: compared exactly
    assert group_index(["1", 1], 2)[1] == 2  # a string is not a number
