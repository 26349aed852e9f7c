"""queryrl.machine: what a run ran on, and no bfloat16 arithmetic chosen where the CPU only emulates it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from queryrl import machine
from queryrl.config import load_config
from queryrl.trainer.machine_record import computes_on_cpu, record_machine, warn_emulated_bf16

AVX2_EPYC = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx avx2 fma\n\n"
BF16_EPYC = "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
AMX_XEON = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R)  Platinum 8481C\nflags\t\t: avx512f amx_bf16 amx_tile\n"


def cpuinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def no_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as on an AVX2-only CPU, with the one-warning memory fresh."""
    monkeypatch.setattr(machine, "native_bf16", lambda *a, **k: False)
    monkeypatch.setattr(machine, "_warned", set())


def measured(fp32: float, bf16: float) -> machine.MachineInfo:
    return machine.MachineInfo("a CPU", "AVX512", True, 2, {"float32": fp32, "bfloat16": bf16})


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU whose native bf16 matmul runs 2.3x float32's (the AMD EPYC with AVX512-BF16)."""
    monkeypatch.setattr(machine, "native_bf16", lambda *a, **k: True)
    monkeypatch.setattr(machine, "machine_info", lambda: measured(88.0, 198.0))
    monkeypatch.setattr(machine, "_warned", set())


def test_the_cpu_model_and_flags_come_from_cpuinfo(tmp_path: Path) -> None:
    info = cpuinfo(tmp_path, AMX_XEON)
    assert machine.cpu_model(info) == "Intel(R) Xeon(R) Platinum 8481C"
    assert {"amx_bf16", "avx512f"} <= machine.cpu_flags(info)
    assert machine.cpu_flags(tmp_path / "absent") == set()
    assert machine.cpu_model(tmp_path / "absent")  # platform's answer, never empty


@pytest.mark.parametrize(
    ("text", "capability", "isa", "expected"),
    [
        (AVX2_EPYC, "AVX2", None, False),  # no bf16 instructions
        (BF16_EPYC, "AVX512", None, True),
        (AMX_XEON, "AVX512", None, True),
        (BF16_EPYC, "AVX2", None, False),  # ATEN_CPU_CAPABILITY=avx2: emulated as an AVX2-only CPU
        (BF16_EPYC, "AVX512", "AVX2", False),  # oneDNN capped below its bf16 kernels
        (BF16_EPYC, "AVX512", "avx512_core_bf16", True),
        (AMX_XEON, "AVX512", "AVX512_CORE_AMX", True),
        (BF16_EPYC, "AVX512", "AVX512_CORE", False),
    ],
)
def test_native_bf16_needs_the_instructions_and_torch_allowed_to_use_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, capability: str, isa: str | None, expected: bool
) -> None:
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    assert machine.native_bf16(cpuinfo(tmp_path, text), capability) is expected


def test_machine_info_measures_float32_and_bf16_only_where_native() -> None:
    info = machine.machine_info()
    assert info is machine.machine_info()  # measured once per process
    assert info.matmul_gflops["float32"] > 0
    assert ("bfloat16" in info.matmul_gflops) is info.native_bf16 is machine.native_bf16()
    assert info.cores >= 1
    assert info.capability == machine.torch_capability()
    line = info.line()
    assert line.startswith(f"machine: {info.cpu}, {info.capability}, ")
    assert f"float32 {info.matmul_gflops['float32']:g}" in line


def test_write_machine_writes_the_json(tmp_path: Path) -> None:
    info = machine.write_machine(tmp_path)
    assert json.loads((tmp_path / "machine.json").read_text(encoding="utf-8")) == info.as_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["machine.json"]  # no temporary left behind


def test_auto_is_float32_without_native_bf16(no_native_bf16: None) -> None:
    assert machine.auto_dtype() == "float32"
    assert machine.cpu_dtype("bfloat16") == "float32"  # a model folder's own bf16 is only a default
    assert machine.cpu_dtype("float16") == "float16"


def test_auto_is_bfloat16_where_native(native: None) -> None:
    assert machine.auto_dtype() == "bfloat16"
    assert machine.cpu_dtype("bfloat16") == "bfloat16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not machine.warn_if_emulated_bf16("bfloat16", "model.compute_dtype")


def test_auto_is_float32_where_native_bf16_is_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Intel Xeon with AVX512-BF16 and no AMX: bf16 is native but its matmul runs at 0.55x float32's."""
    monkeypatch.setattr(machine, "native_bf16", lambda *a, **k: True)
    monkeypatch.setattr(machine, "machine_info", lambda: measured(145.0, 80.0))
    assert machine.auto_dtype() == "float32"
    assert machine.cpu_dtype("bfloat16") == "float32"


@pytest.mark.parametrize(
    ("native", "rates", "expected"),
    [
        (True, {"float32": 88.0, "bfloat16": 198.0}, True),
        (True, {"float32": 100.0, "bfloat16": 125.0}, True),  # exactly BF16_MIN_SPEEDUP
        (True, {"float32": 100.0, "bfloat16": 124.9}, False),  # faster, but not by enough to pay
        (True, {"float32": 145.0, "bfloat16": 80.0}, False),
        (False, {"float32": 19.0, "bfloat16": 200.0}, False),  # never where bf16 is emulated
        (True, {"float32": 88.0}, False),  # bf16 not measured
        (True, {}, False),
    ],
)
def test_prefers_bf16_by_the_measured_rates(native: bool, rates: dict[str, float], expected: bool) -> None:
    assert machine.BF16_MIN_SPEEDUP == 1.25
    assert machine.prefers_bf16(native, rates) is expected
    info = machine.MachineInfo("a CPU", "AVX512", native, 2, rates)
    assert info.auto_dtype() == ("bfloat16" if expected else "float32")
    assert info.line().endswith(f"; CPU auto dtype {info.auto_dtype()}")


def test_no_rate_is_measured_to_decide_where_bf16_is_emulated(
    no_native_bf16: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def measuring() -> machine.MachineInfo:
        raise AssertionError("measured the machine although bf16 is not native")

    monkeypatch.setattr(machine, "machine_info", measuring)
    assert not machine.bf16_pays()
    assert machine.auto_dtype() == "float32"


def test_forced_bf16_warns_once_per_setting(no_native_bf16: None) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # so that a second warning would show
        assert machine.warn_if_emulated_bf16("bfloat16", "--dtype")
        assert machine.warn_if_emulated_bf16("bfloat16", "--dtype")  # said already
    assert [str(w.message).split(" (")[0] for w in seen] == ["--dtype=bfloat16 on a CPU without native bf16"]
    assert "\n" not in str(seen[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not machine.warn_if_emulated_bf16("float32", "--dtype")
        assert not machine.warn_if_emulated_bf16(None, "--dtype")
        assert not machine.warn_if_emulated_bf16("bfloat16", "--dtype", device_type="cuda")


@pytest.mark.parametrize(
    ("overrides", "what"),
    [
        (["model.compute_dtype=bfloat16"], "model.compute_dtype"),
        (["model.dtype=bfloat16", "model.lora.rank=4"], "model.dtype"),
    ],
)
def test_a_run_that_forces_bf16_on_such_a_cpu_warns(no_native_bf16: None, overrides: list[str], what: str) -> None:
    cfg = load_config(None, ["trainer.device=cpu", *overrides])
    assert computes_on_cpu(cfg)
    with pytest.warns(UserWarning, match=f"^{what}=bfloat16 on a CPU without native bf16"):
        assert warn_emulated_bf16(cfg)


def test_a_float32_run_or_a_native_cpu_does_not_warn(native: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_emulated_bf16(load_config(None, ["trainer.device=cpu", "model.compute_dtype=bfloat16"]))
        monkeypatch.setattr(machine, "native_bf16", lambda *a, **k: False)
        assert not warn_emulated_bf16(load_config(None, ["trainer.device=cpu"]))


def test_record_machine_writes_and_says_one_line(tmp_path: Path) -> None:
    said: list[str] = []
    info = record_machine(tmp_path, said.append)
    assert said == [info.line()]
    assert (tmp_path / "machine.json").is_file()


def test_benchmarks_record_the_machine_and_choose_float32_without_bf16(no_native_bf16: None) -> None:
    import common
    import real_model

    entry = common.machine()
    assert entry["capability"] == machine.torch_capability()
    assert entry["matmul_gflops"]["float32"] > 0
    assert {"cpu", "native_bf16", "cores"} <= set(entry)
    assert real_model.choose_dtype("auto") == "float32"
    assert real_model.choose_dtype("float32") == "float32"
    with pytest.warns(UserWarning, match="--dtype=bfloat16 on a CPU without native bf16"):
        assert real_model.choose_dtype("bfloat16") == "bfloat16"  # forced: kept, said once


def test_benchmarks_choose_bf16_where_native(native: None) -> None:
    import real_model

    assert real_model.choose_dtype("auto") == "bfloat16"
