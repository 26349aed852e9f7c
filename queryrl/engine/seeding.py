"""Seeding every random generator a run uses."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) so that a CPU run is reproducible."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - seeds what reward code may use
    torch.manual_seed(seed)
