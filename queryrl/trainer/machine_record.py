"""What a run ran on, in its folder (``machine.json``) and one console line; a warning where the config forces
bfloat16 arithmetic on a CPU that only emulates it (:mod:`queryrl.machine`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from queryrl.machine import MachineInfo, warn_if_emulated_bf16, write_machine


def computes_on_cpu(cfg: DictConfig) -> bool:
    """Whether the run's forward and backward passes run on the CPU: ``trainer.device`` cpu (or auto without
    CUDA), and no Ray workers given GPUs."""
    import torch

    device = str(cfg.trainer.device) or "auto"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if str(cfg.trainer.backend) == "ray" and str(cfg.ray.use_gpu).lower() != "false" and torch.cuda.is_available():
        return False
    return torch.device(device).type == "cpu"


def warn_emulated_bf16(cfg: DictConfig) -> bool:
    """One line where ``model.compute_dtype`` (else ``model.dtype``) is bfloat16 on a CPU without native bf16;
    True when it warned (now or earlier in this process)."""
    if not computes_on_cpu(cfg):
        return False
    compute = cfg.model.get("compute_dtype")
    what, dtype = ("model.compute_dtype", compute) if compute else ("model.dtype", cfg.model.dtype)
    return warn_if_emulated_bf16(str(dtype), what)


def record_machine(folder: Path, echo: Callable[[str], None] | None = print) -> MachineInfo:
    """Write ``folder/machine.json`` (:func:`queryrl.machine.write_machine`) and echo its line."""
    info = write_machine(folder)
    if echo is not None:
        echo(info.line())
    return info
