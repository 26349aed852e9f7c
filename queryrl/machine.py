"""What a run or a timing ran on: the CPU, torch's kernels, native bfloat16, and measured matmul rates.

The same machine kind comes with CPUs of very different speed: an AVX2-only EPYC does a one-thread float32
matmul at about a quarter of an AVX512 one's rate, and bfloat16 there is emulated (about 25x slower than
float32). So every run folder (``machine.json``), bench JSON and eval JSON records :func:`machine_info`, and
nothing picks bfloat16 arithmetic on a CPU that lacks it (:func:`auto_dtype`, :func:`cpu_dtype`,
:func:`warn_if_emulated_bf16`).

Native is not enough: an Intel Xeon with AVX512-BF16 and no AMX does a one-thread 2048² bfloat16 matmul at 80
GFLOP/s against float32's 145 (the real-model bench's GRPO step 40.5 s in bf16 against 28.4 s in float32), while an
AMD EPYC with the same flags does 198 against 88. So ``auto`` picks bfloat16 only where it is native *and* its
measured matmul rate is at least :data:`BF16_MIN_SPEEDUP` times float32's (:func:`bf16_pays`): a whole step gains
less than its matmuls do (conversions, norms and softmax stay float32), and float32 is the more exact of the two.

bfloat16 is *native* (:func:`native_bf16`) when the CPU has bf16 dot products (``avx512_bf16`` or ``amx_bf16``
in ``/proc/cpuinfo``) and torch may use them: its kernels dispatch at AVX512 (``ATEN_CPU_CAPABILITY`` not
lowered) and oneDNN, which runs torch's bf16 matmuls on CPU, is not capped below AVX512_CORE_BF16
(``ONEDNN_MAX_CPU_ISA``). The three variables ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2`` make such a CPU behave as an AVX2-only one (the measured rates fall: float32 to
about half, bfloat16 to about 1 GFLOP/s), and this module then says so.

Only the standard library and torch are imported here: every layer may use it.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) that still allow its bf16 kernels; any other value caps below them
_ONEDNN_BF16_CAPS = ("BF16", "AMX", "FP16", "AVX10", "ALL", "DEFAULT")
MATMUL_SIZE = 512  # the measured square matmul: 0.27 GFLOP, 3-15 ms a repetition on today's CPUs in float32
# the best of at least MATMUL_REPS repetitions, more (up to MATMUL_MAX_REPS) while under MATMUL_BUDGET_S: on a
# shared machine one repetition in a few loses its time slice, and the best one is the machine's rate
MATMUL_REPS = 3
MATMUL_MAX_REPS = 30
MATMUL_BUDGET_S = 0.25
MACHINE_FILE = "machine.json"
# bfloat16's one-thread matmul rate over float32's from which auto computes in bf16: on the AMD EPYC above a
# 2.3x matmul gain made the bench's steps about 1.4x faster; on the Intel one 0.55x made them 0.70x as fast
BF16_MIN_SPEEDUP = 1.25
_warned: set[str] = set()


@dataclass(frozen=True)
class MachineInfo:
    """What :func:`machine_info` found; ``matmul_gflops`` maps a dtype name to one thread's measured rate."""

    cpu: str
    capability: str  # torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512, ...
    native_bf16: bool
    cores: int
    matmul_gflops: dict[str, float] = field(default_factory=dict)
    matmul_size: int = MATMUL_SIZE
    torch: str = ""
    cuda: str | None = None  # the first CUDA device's name, where there is one

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def auto_dtype(self) -> str:
        """What ``auto`` computes in on this machine's CPU (:func:`prefers_bf16` of its measured rates)."""
        return "bfloat16" if prefers_bf16(self.native_bf16, self.matmul_gflops) else "float32"

    def line(self) -> str:
        """One console line: ``machine: AMD EPYC, AVX512, bf16 native, 2 cores; one-thread matmul ...; CPU auto
        bfloat16``."""
        rates = ", ".join(f"{k} {v:g}" for k, v in self.matmul_gflops.items())
        bf16 = "bf16 native" if self.native_bf16 else "no native bf16 (float32 arithmetic)"
        gpu = f"; GPU {self.cuda}" if self.cuda else ""
        return (
            f"machine: {self.cpu}, {self.capability}, {bf16}, {self.cores} cores; "
            f"one-thread {self.matmul_size}² matmul GFLOP/s: {rates}; CPU auto dtype {self.auto_dtype()}{gpu}"
        )


def prefers_bf16(native: bool, rates: dict[str, float]) -> bool:
    """True when bfloat16 is `native` and its measured matmul rate in `rates` (dtype name -> GFLOP/s) is at least
    :data:`BF16_MIN_SPEEDUP` times float32's; False without either rate."""
    fp32, bf16 = rates.get("float32"), rates.get("bfloat16")
    return native and fp32 is not None and bf16 is not None and bf16 >= BF16_MIN_SPEEDUP * fp32


def _cpuinfo_text(cpuinfo: Path) -> str:
    try:
        return cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The CPU's feature flags (x86 ``flags``, ARM ``Features``), empty where /proc/cpuinfo is unreadable."""
    flags: set[str] = set()
    for line in _cpuinfo_text(cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name (``model name`` in /proc/cpuinfo), else what :mod:`platform` says, else "unknown"."""
    for line in _cpuinfo_text(cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown"


def torch_capability() -> str:
    """The instruction set torch's CPU kernels dispatch to (``ATEN_CPU_CAPABILITY`` may lower it)."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def native_bf16(cpuinfo: Path = CPUINFO, capability: str | None = None) -> bool:
    """True when this process does bfloat16 arithmetic natively on the CPU (see the module's docstring);
    without it torch emulates bf16 matmuls, far slower than float32."""
    if not any(flag in cpu_flags(cpuinfo) for flag in BF16_FLAGS):
        return False
    if not (capability if capability is not None else torch_capability()).upper().startswith("AVX512"):
        return False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).upper()
    return not cap or any(word in cap for word in _ONEDNN_BF16_CAPS)


def matmul_gflops(dtype_name: str, size: int = MATMUL_SIZE, reps: int = MATMUL_REPS) -> float:
    """One thread's rate for a `size`² matmul in `dtype_name` (float32, bfloat16), in GFLOP/s: the best of
    `reps` repetitions after a warm-up, or of more while they fit in :data:`MATMUL_BUDGET_S` (at most
    :data:`MATMUL_MAX_REPS`); the process's thread count is restored afterwards."""
    import torch

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=gen).to(dtype)
        b = torch.randn(size, size, generator=gen).to(dtype)
        a @ b  # warm-up: kernel selection, page faults
        best, began, done = float("inf"), time.perf_counter(), 0
        while done < reps or (done < MATMUL_MAX_REPS and time.perf_counter() - began < MATMUL_BUDGET_S):
            start = time.perf_counter()
            a @ b
            best, done = min(best, time.perf_counter() - start), done + 1
    finally:
        torch.set_num_threads(threads)
    return round(2 * size**3 / max(best, 1e-9) / 1e9, 1)


@functools.lru_cache(maxsize=1)
def machine_info() -> MachineInfo:
    """This machine, measured once per process (at most about 0.6 s: float32 always, bfloat16 only where native)."""
    import torch

    native = native_bf16()
    rates = {"float32": matmul_gflops("float32")}
    if native:
        rates["bfloat16"] = matmul_gflops("bfloat16")
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cores = os.cpu_count() or 1
    return MachineInfo(cpu_model(), torch_capability(), native, cores, rates, torch=torch.__version__, cuda=cuda)


def write_machine(folder: str | os.PathLike[str]) -> MachineInfo:
    """Write :func:`machine_info` to ``folder/machine.json`` (atomically) and return it."""
    from queryrl.atomic import atomic_write_text

    info = machine_info()
    atomic_write_text(Path(folder) / MACHINE_FILE, json.dumps(info.as_dict(), indent=1) + "\n")
    return info


def bf16_pays() -> bool:
    """True when bfloat16 arithmetic is native here and measured faster than float32 by :data:`BF16_MIN_SPEEDUP`
    (the rates of :func:`machine_info`, measured once per process; never measured where bf16 is not native)."""
    return native_bf16() and prefers_bf16(True, machine_info().matmul_gflops)


def auto_dtype() -> str:
    """What ``auto`` means for CPU arithmetic here: bfloat16 where it is native and pays (:func:`bf16_pays`),
    else float32."""
    return "bfloat16" if bf16_pays() else "float32"


def cpu_dtype(saved: str) -> str:
    """The dtype to compute in on the CPU when `saved` is only a default (a model folder's own dtype, say):
    bfloat16 becomes float32 where bf16 is not native or not faster (:func:`bf16_pays`); anything else stays."""
    return "float32" if saved == "bfloat16" and not bf16_pays() else saved


def warn_if_emulated_bf16(dtype: str | None, what: str, device_type: str = "cpu") -> bool:
    """Warn once per `what` (one line) when a user forces bfloat16 arithmetic (`what`: the setting, e.g.
    ``model.compute_dtype``) on a CPU without native bf16; True when it warned (or had warned)."""
    if dtype != "bfloat16" or device_type != "cpu" or native_bf16():
        return False
    if what not in _warned:
        _warned.add(what)
        warnings.warn(
            f"{what}=bfloat16 on a CPU without native bf16 ({cpu_model()}, {torch_capability()}): torch emulates "
            "it, far slower than the float32 that the defaults (and auto) choose here",
            stacklevel=2,
        )
    return True


def duration(seconds: float) -> str:
    """``1 h 2 min 3 s``, ``21 min 3 s``, ``42 s``."""
    s = max(0, round(seconds))
    h, m, s = s // 3600, s % 3600 // 60, s % 60
    return " ".join(f"{v} {u}" for v, u in ((h, "h"), (m, "min"), (s, "s")) if v or (u == "s" and not (h or m)))


def main(argv: list[str] | None = None) -> int:
    """``python -m queryrl.machine [--since FILE --label TEXT]``: this machine's line; with ``--since`` (a file
    holding the start as Unix seconds, e.g. ``date +%s > FILE``) the wall time since then first (make demo's end)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m queryrl.machine", description=main.__doc__)
    parser.add_argument("--since", type=Path, help="a file holding the start time in Unix seconds")
    parser.add_argument("--label", default="wall time", help="what took that long (e.g. 'make demo')")
    args = parser.parse_args(argv)
    line = machine_info().line()
    if args.since is not None:
        try:
            started = float(args.since.read_text(encoding="utf-8").strip())
        except (OSError, ValueError) as exc:
            print(f"--since {args.since}: not a file holding Unix seconds ({exc})")
            return 2
        line = f"{args.label}: {duration(time.time() - started)} on this {line}"
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
