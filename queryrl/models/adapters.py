"""LoRA adapters as files: written in bf16 for publishing, checked against a base, merged in a chain.

A published adapter folder is what peft's ``save_pretrained`` writes (``adapter_config.json`` and
``adapter_model.safetensors``), with the tensors cast to bfloat16 and ``base_model_name_or_path`` set to
the base folder's name, not a path of the machine that trained it. :func:`write_adapter` makes one from
any peft adapter folder (a training checkpoint's ``actor/``); :func:`save_adapter` from a peft model.

A chain ``BASE+A1+A2`` is the base with A1 merged into it, then A2 merged into that
(:func:`load_with_adapters`): a GRPO adapter trained on top of a merged warm-up model is evaluated as
``BASE+WARMUP_ADAPTER+GRPO_ADAPTER``. :func:`adapter_problem` says, from the files' headers alone, why a
folder is not an adapter or does not fit a base, before any model is loaded.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from queryrl.atomic import atomic_dir, readable_as_umask

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PUBLISH_DTYPE = torch.bfloat16
_PREFIX = "base_model.model."  # peft's prefix of the wrapped model's module names
_LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")


def base_name(path: str | Path) -> str:
    """What a published adapter records as its base: the base folder's name (``gemma3-270m``), never a path."""
    return Path(str(path)).expanduser().resolve().name or str(path)


def write_adapter(src: Path, out: Path, base_model: str | None, dtype: torch.dtype = PUBLISH_DTYPE) -> Path:
    """Write the peft adapter folder `src` to the new folder `out`: its tensors cast to `dtype` (bfloat16 by
    default), its config's ``base_model_name_or_path`` set to `base_model` (None: kept as it is).

    Raises:
        FileNotFoundError: `src` is not an adapter folder (no adapter_config.json or adapter_model.safetensors).
        ValueError: `out` already exists.
    """
    from safetensors.torch import load_file, save_file

    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (src / name).is_file():
            raise FileNotFoundError(f"{src} is not a LoRA adapter folder: no {name}")
    if out.exists():
        raise ValueError(f"{out} already exists; choose a new folder")
    config = json.loads((src / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if base_model is not None:
        config["base_model_name_or_path"] = base_model
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(src / ADAPTER_WEIGHTS).items()}
    with atomic_dir(out) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        readable_as_umask(tmp)  # safetensors writes 0600
    return out


def save_adapter(model: nn.Module, out: Path, base_model: str | None, dtype: torch.dtype = PUBLISH_DTYPE) -> Path:
    """The adapter of the peft model `model` (unmerged) as :func:`write_adapter` writes it, into `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.peft-") as raw:
        model.save_pretrained(raw)  # type: ignore[operator]
        return write_adapter(Path(raw), out, base_model, dtype)


def _shapes(files: Sequence[Path]) -> dict[str, list[int]]:
    """Each tensor's shape in `files` (safetensors), read from their headers only."""
    from safetensors import safe_open

    shapes: dict[str, list[int]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[key] = list(f.get_slice(key).get_shape())
    return shapes


def _lora_modules(shapes: dict[str, list[int]]) -> dict[str, tuple[list[int], list[int]]]:
    """module name -> (lora_A shape, lora_B shape) of an adapter's tensors."""
    found: dict[str, dict[str, list[int]]] = {}
    for key, shape in shapes.items():
        for suffix in _LORA_SUFFIXES:
            if key.endswith(suffix):
                module = key.removeprefix(_PREFIX).removesuffix(suffix)
                found.setdefault(module, {})[suffix] = shape
    return {m: (s[_LORA_SUFFIXES[0]], s[_LORA_SUFFIXES[1]]) for m, s in found.items() if len(s) == 2}


def adapter_problem(adapter: Path, base: Path) -> str | None:
    """Why `adapter` is not a LoRA adapter folder that fits the model folder `base`, or None when it is one.

    Read from the files' headers: every module the adapter adapts is a weight of `base` whose
    ``[out, in]`` matches the adapter's ``lora_B`` rows and ``lora_A`` columns. A base without
    ``*.safetensors`` files is not checked (its weights would have to be loaded)."""
    if not adapter.exists():
        return f"adapter folder {str(adapter)!r} does not exist"
    if not (adapter / ADAPTER_CONFIG).is_file():
        if (adapter / "adapter" / ADAPTER_CONFIG).is_file():  # a `queryrl sft` output: the merged model and adapter/
            return f"{str(adapter)!r} is a model folder; its LoRA adapter is {str(adapter / 'adapter')!r}"
        what = "a model folder (config.json), not" if (adapter / "config.json").is_file() else "not"
        return (
            f"{str(adapter)!r} is {what} a LoRA adapter folder (no {ADAPTER_CONFIG}): one holds {ADAPTER_CONFIG} and "
            f"{ADAPTER_WEIGHTS}, as `queryrl export RUN OUT --adapter-only` and `queryrl sft` (OUT/adapter) write"
        )
    if not (adapter / ADAPTER_WEIGHTS).is_file():
        return f"adapter folder {str(adapter)!r} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}"
    try:
        modules = _lora_modules(_shapes([adapter / ADAPTER_WEIGHTS]))
        base_files = sorted(base.glob("*.safetensors"))
        weights = _shapes(base_files) if base_files else None
    except Exception as exc:  # a truncated or foreign file: safetensors' own error, on one line
        return f"adapter {str(adapter)!r} or base {str(base)!r}: unreadable weights: {exc}".replace("\n", " ")
    if not modules:
        return f"adapter {str(adapter)!r}: {ADAPTER_WEIGHTS} holds no LoRA weights (lora_A / lora_B)"
    if weights is None:
        return None
    for module, (a, b) in sorted(modules.items()):
        shape = weights.get(f"{module}.weight")
        if shape is None:
            return f"adapter {str(adapter)!r} adapts {module}, which base {str(base)!r} does not have: another model?"
        if len(shape) != 2 or len(a) != 2 or len(b) != 2 or shape != [b[0], a[1]]:
            return (
                f"adapter {str(adapter)!r} does not fit base {str(base)!r}: {module} is {shape} in the base, "
                f"the adapter's LoRA makes {[b[0] if b else '?', a[-1] if a else '?']}: trained on another model?"
            )
    return None


def load_with_adapters(base: Path, adapters: Sequence[Path], dtype: torch.dtype, **kwargs: Any) -> nn.Module:
    """The causal LM in `base` with each of `adapters` merged into it in order, then cast to `dtype`.

    The merges are done in float32 (a bf16 adapter is upcast), as ``queryrl export`` and ``queryrl sft`` merge;
    `kwargs` go to ``from_pretrained`` (``trust_remote_code``)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, **kwargs)
    for adapter in adapters:
        with warnings.catch_warnings():  # peft asks transformers 5 a deprecated question: not the user's concern
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        model = peft_model.merge_and_unload()
    merged: nn.Module = model.to(dtype)
    return merged


def extract_adapter(
    base: Path, merged: Path, out: Path, rank: int, target_modules: Sequence[str], dtype: torch.dtype = PUBLISH_DTYPE
) -> Path:
    """Recover the LoRA adapter of a merged model: for each weight of `merged` named by `target_modules` (the last
    part of a module's name, e.g. ``q_proj``) that differs from `base`'s, the rank-`rank` factors of the
    difference (a truncated SVD: exact up to float rounding, the difference of a rank-r LoRA merge having rank
    r at most), written as :func:`write_adapter` writes an adapter (``lora_alpha`` = r: a scaling of 1).

    For a warm-up folder written before ``queryrl sft`` kept its ``adapter/``.

    Raises:
        ValueError: `out` exists, or no targeted weight differs (nothing was merged).
    """
    from peft import LoraConfig
    from safetensors.torch import load_file

    if out.exists():
        raise ValueError(f"{out} already exists; choose a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)

    def weights(folder: Path) -> dict[str, torch.Tensor]:
        return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}

    before, after = weights(base), weights(merged)
    targets = set(target_modules)
    factors: dict[str, torch.Tensor] = {}
    for key, new in sorted(after.items()):
        module = key.removesuffix(".weight")
        old = before.get(key)
        if module.rsplit(".", 1)[-1] not in targets or old is None or new.ndim != 2 or torch.equal(new, old):
            continue
        u, s, vh = torch.linalg.svd(new.double() - old.double(), full_matrices=False)
        root = s[:rank].sqrt()
        factors[f"{_PREFIX}{module}.lora_A.weight"] = (root[:, None] * vh[:rank]).float()
        factors[f"{_PREFIX}{module}.lora_B.weight"] = (u[:, :rank] * root[None, :]).float()
    if not factors:
        raise ValueError(f"{merged}: no weight of {sorted(targets)} differs from {base}'s: nothing to extract")
    modules = sorted({k.removeprefix(_PREFIX).rsplit(".", 2)[0].rsplit(".", 1)[-1] for k in factors})
    config = LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=modules, task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.svd-") as raw:
        from safetensors.torch import save_file

        config.save_pretrained(raw)
        save_file({k: v.contiguous() for k, v in factors.items()}, Path(raw) / ADAPTER_WEIGHTS)
        return write_adapter(Path(raw), out, base_name(base), dtype)
