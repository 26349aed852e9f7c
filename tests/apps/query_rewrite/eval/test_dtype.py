"""``queryrl eval --dtype``: each model system loads in the given dtype, else its folder's own, else float32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig
from typer.testing import CliRunner

from queryrl import machine
from queryrl.apps.query_rewrite.eval.generation import model_answers, model_dtype
from queryrl.apps.query_rewrite.eval.samples import EvalError, load_samples
from queryrl.cli import app


def folder_with(tmp_path: Path, config: dict[str, Any] | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"torch_dtype": "bfloat16"}, "bfloat16"),  # transformers 4 writes torch_dtype
        ({"dtype": "float16"}, "float16"),  # transformers 5 writes dtype
        ({"model_type": "qwen2"}, "float32"),  # names none
        ({"torch_dtype": "float64"}, "float32"),  # not one eval runs in
        (None, "float32"),  # no config.json
    ],
)
def test_default_is_the_folders_dtype(
    tmp_path: Path, config: dict[str, Any] | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine, "bf16_pays", lambda: True)  # a CPU whose bf16 arithmetic is native and faster
    assert model_dtype(folder_with(tmp_path, config), device="cpu") == expected


def test_a_bf16_folder_computes_in_float32_on_a_cpu_without_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Emulated bf16 is far slower than float32: the folder's own dtype is a default, not a demand; a GPU and a
    forced ``--dtype bfloat16`` keep it (the latter with one warning line)."""
    monkeypatch.setattr(machine, "native_bf16", lambda *a, **k: False)
    monkeypatch.setattr(machine, "_warned", set())
    folder = folder_with(tmp_path, {"torch_dtype": "bfloat16"})
    assert model_dtype(folder, device="cpu") == "float32"
    (tmp_path / "f16").mkdir()
    assert model_dtype(folder_with(tmp_path / "f16", {"dtype": "float16"}), device="cpu") == "float16"
    assert model_dtype(folder, device="cuda") == "bfloat16"
    with pytest.warns(UserWarning, match="^--dtype=bfloat16 on a CPU without native bf16"):
        assert model_dtype(folder, "bfloat16", device="cpu") == "bfloat16"


def test_given_dtype_wins_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, {"torch_dtype": "bfloat16"})
    assert model_dtype(folder, "float32") == "float32"
    with pytest.raises(EvalError, match="--dtype 'float64' is not one of: float32, bfloat16, float16"):
        model_dtype(folder, "float64")


@pytest.fixture
def loaded_dtypes(monkeypatch: pytest.MonkeyPatch) -> list[torch.dtype]:
    """The dtype of every model the eval hands to the rollout."""
    import queryrl.rollout.hf as hf

    seen: list[torch.dtype] = []
    original = hf.HFRollout.__init__

    def spy(self: Any, model: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        seen.append(next(model.parameters()).dtype)
        original(self, model, *args, **kwargs)

    monkeypatch.setattr(hf.HFRollout, "__init__", spy)
    return seen


@pytest.mark.slow
def test_model_systems_load_in_the_dtype(
    tmp_path: Path,
    tiny_cfg: DictConfig,
    model_cache: Path,
    loaded_dtypes: list[torch.dtype],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queryrl.models.loading import resolve_model_path

    monkeypatch.setattr(machine, "bf16_pays", lambda: True)  # the folder's bf16 is kept (tiny: cheap)

    tiny = resolve_model_path(tiny_cfg.model)
    bf16 = tmp_path / "bf16"
    shutil.copytree(tiny, bf16)
    config = json.loads((bf16 / "config.json").read_text(encoding="utf-8"))
    config.pop("dtype", None)
    (bf16 / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}), encoding="utf-8")
    samples = load_samples("builtin://sales_demo/test", 2, str(model_cache))

    for folder, dtype in [(tiny, None), (bf16, None), (bf16, "float32"), (tiny, "float16")]:
        answers = model_answers(folder, samples, batch_size=2, max_new_tokens=2, device="cpu", dtype=dtype)
        assert len(answers) == 2
    assert loaded_dtypes == [torch.float32, torch.bfloat16, torch.float32, torch.float16]


def test_cli_refuses_a_bad_dtype(tmp_path: Path) -> None:
    args = ["eval", "--data", "builtin://sales_demo/test", "--systems", "raw_turn", "--out", str(tmp_path / "e.json")]
    result = CliRunner().invoke(app, [*args, "--dtype", "float64"])
    assert result.exit_code == 2
    assert "--dtype 'float64' is not one of: float32, bfloat16, float16" in result.output
    assert not (tmp_path / "e.json").exists()
