"""The optimizer ``make_optimizer`` builds: AdamW with torch's multi-tensor (foreach) path on every device."""

from __future__ import annotations

import torch
from torch import nn

from queryrl.engine.optim import make_optimizer


def _trained(foreach: bool, steps: int = 25) -> list[torch.Tensor]:
    """The parameters after `steps` AdamW steps, by torch's per-tensor loop or its multi-tensor path."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, foreach=foreach)
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=data)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def test_make_optimizer_uses_the_multi_tensor_adamw() -> None:
    optimizer, _ = make_optimizer(nn.Linear(4, 4).parameters(), 1e-3, 0.0, (0.9, 0.999), 0, 10)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["foreach"] is True


def test_foreach_adamw_equals_the_per_tensor_loop_bit_for_bit() -> None:
    # the multi-tensor path is a speed choice only: every parameter after 25 steps is the same float
    for a, b in zip(_trained(foreach=False), _trained(foreach=True), strict=True):
        assert torch.equal(a, b)
