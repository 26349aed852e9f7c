"""``queryrl eval``'s model systems: greedy replies of a Hugging Face model folder, parsed into queries.

A model answers each row's chat-templated prompt greedily; the reply goes through
:func:`~queryrl.apps.query_rewrite.reward.modes.parse_answer`. A reply that does not parse is a format
failure (:class:`~queryrl.apps.query_rewrite.eval.samples.Answer` with ``query`` None); an empty query is
an abstention. Where the reply carries no profile or summary, the row's own go to ``/rag/chat_8b``.

A model may decode with a vocabulary-restricted head (``--vocab-ids``, :func:`vocab_files`; the head of
``model.vocab.restrict``, :mod:`queryrl.models.vocab`): its greedy token is then the argmax over the kept ids
and the evaluated prompts' own tokens, the full head's token wherever that one is kept. The option names its
files explicitly rather than reading a ``vocab_ids.json`` found in a model folder: the replies, and so the
metrics, would otherwise change with a side file (a restricted SFT's folder evaluated beside other models), and
a ``BASE+ADAPTER`` system has no one folder that would carry it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from queryrl.apps.query_rewrite.eval.samples import Answer, EvalError, Sample
from queryrl.apps.query_rewrite.reward.modes import parse_answer

if TYPE_CHECKING:
    from queryrl.rollout.base import SamplingParams

EVAL_DTYPES = ("float32", "bfloat16", "float16")


def vocab_files(option: str | None, models: Sequence[str]) -> dict[str, Path]:
    """``--vocab-ids``: which of the model systems `models` (their names) decode with a restricted head, and
    from which kept-ids file. ``FILE``: every model system; ``NAME=FILE[,NAME=FILE]``: those named. A FILE is a
    ``vocab_ids.json`` (as ``queryrl train`` and ``queryrl sft`` write it) or a folder that holds one.

    Raises:
        EvalError: a name that is not a model system, a name given twice, or a file that is not there.
    """
    from queryrl.models.vocab import VOCAB_FILE

    if not option:
        return {}
    items = [item.strip() for item in option.split(",") if item.strip()]
    named = [item.partition("=") for item in items]
    if len(items) == 1 and not named[0][1]:  # one FILE: every model system
        chosen = {name: Path(items[0]) for name in models}
    elif all(sep and name in models for name, sep, _ in named):
        chosen = {name.strip(): Path(path.strip()) for name, _, path in named}
        if len(chosen) < len(items):
            raise EvalError(f"--vocab-ids {option!r}: a system is named twice")
    else:
        bad = next(item for item, (name, sep, _) in zip(items, named, strict=True) if not sep or name not in models)
        raise EvalError(
            f"--vocab-ids: {bad!r} is not NAME=FILE with NAME one of the model systems ({', '.join(models) or 'none'})"
            " (or give one FILE for every model system)"
        )
    chosen = {name: path / VOCAB_FILE if path.is_dir() else path for name, path in chosen.items()}
    for name, path in chosen.items():
        if not path.is_file():
            raise EvalError(f"--vocab-ids: {name}: {path}: no such file (a vocab_ids.json, or a folder holding one)")
    return chosen


def read_vocab(path: Path) -> list[int]:
    """The kept ids of `path` (:func:`~queryrl.models.vocab.read_vocab_ids`).

    Raises:
        EvalError: not a kept-vocabulary file (named)."""
    from queryrl.models.vocab import VocabError, read_vocab_ids

    try:
        return read_vocab_ids(path)
    except VocabError as exc:
        raise EvalError(f"--vocab-ids: {exc}") from None


def check_dtype(dtype: str | None) -> None:
    """Raises :class:`EvalError` unless `dtype` is None or one of :data:`EVAL_DTYPES`."""
    if dtype is not None and dtype not in EVAL_DTYPES:
        raise EvalError(f"--dtype {dtype!r} is not one of: {', '.join(EVAL_DTYPES)}")


def model_dtype(path: Path, dtype: str | None = None, device: str | None = None) -> str:
    """`dtype` (``--dtype``), else the dtype the folder's config.json names (``torch_dtype``), else float32.

    On a CPU (`device`; None: CUDA where available, else the CPU) without native bfloat16 the folder's bfloat16 is
    computed in float32 (:func:`queryrl.machine.cpu_dtype`: emulated bf16 is far slower), and a ``--dtype
    bfloat16`` is kept with a one-line warning."""
    from queryrl.machine import cpu_dtype, warn_if_emulated_bf16

    on_cpu = _device_type(device) == "cpu"
    if dtype is not None:
        check_dtype(dtype)
        if on_cpu:
            warn_if_emulated_bf16(dtype, "--dtype")
        return dtype
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "float32"
    saved = config.get("torch_dtype") or config.get("dtype") if isinstance(config, dict) else None
    chosen = saved if saved in EVAL_DTYPES else "float32"
    return cpu_dtype(chosen) if on_cpu else chosen


def _device_type(device: str | None) -> str:
    """``cpu`` or ``cuda`` for a generation's `device` (None: CUDA where available)."""
    import torch

    return torch.device(device).type if device else ("cuda" if torch.cuda.is_available() else "cpu")


def generate_replies(
    path: Path,
    prompts: Sequence[list[dict[str, Any]]],
    params: SamplingParams,
    batch_size: int,
    device: str | None = None,
    dtype: str | None = None,
    adapters: Sequence[Path] = (),
    vocab: Sequence[int] | None = None,
) -> list[list[str]]:
    """The replies of the model in `path` to each chat prompt: ``params.n`` per prompt, decoded.

    With `vocab` (sorted kept token ids) the model decodes with its head restricted to them and to every token of
    the evaluated prompts (:func:`~queryrl.models.vocab.restrict_head`): the run's kept set covers its training
    prompts, and a rewrite of a held-out conversation copies from that conversation (its input, not its label).

    With `adapters` (LoRA adapter folders) the model is `path` with each merged into it in order, in float32
    (:func:`~queryrl.models.adapters.load_with_adapters`); the tokenizer is `path`'s.
    The model is loaded in :func:`model_dtype` (`dtype`, else its folder's own dtype, else float32) and
    decodes through :class:`~queryrl.rollout.hf.HFRollout` (its fast path where the architecture has one),
    prompts in micro-batches of `batch_size` by length: a prompt's greedy reply may differ from the one it
    gets beside other prompts only where a rounding tie (bf16) goes the other way.
    """
    import torch
    from omegaconf import OmegaConf
    from torch import nn
    from transformers import AutoModelForCausalLM

    from queryrl.config import ModelConfig
    from queryrl.data.prompts import encode_prompt
    from queryrl.models.loading import DTYPES, load_tokenizer
    from queryrl.rollout.hf import HFRollout
    from queryrl.trainer.scoring import decode_responses

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = load_tokenizer(OmegaConf.structured(ModelConfig(path=str(path))))
    if adapters:
        from queryrl.models.adapters import load_with_adapters

        try:
            loaded: nn.Module = load_with_adapters(path, adapters, DTYPES[model_dtype(path, dtype, dev.type)])
        except (RuntimeError, ValueError, KeyError) as exc:  # a mismatch the header check could not see
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EvalError(f"{'+'.join(map(str, (path, *adapters)))}: the adapters do not load: {first}") from None
    else:
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[model_dtype(path, dtype, dev.type)])
    model = loaded.to(dev)
    encoded = [encode_prompt(tokenizer, list(p)) for p in prompts]
    if vocab is not None:  # a rewrite copies from its conversation: the prompts' own tokens stay reachable
        _restrict(model, sorted(set(vocab).union(*encoded)), path)
    rollout = HFRollout(model, tokenizer, micro_batch_size=batch_size, device=dev)
    # shortest first, so that a micro-batch pads its prompts little (split 0's 167 held-out KdConv prompts, batches
    # of 8: 55,275 prompt slots instead of 72,273 in file order, 54,100 real tokens); replies go back in file order
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    texts: list[str] = []
    for chunk in rollout.generate_chunks([encoded[i] for i in order], params):
        texts += decode_responses(tokenizer, chunk)
    del model, rollout
    n = params.n
    replies: list[list[str]] = [[] for _ in prompts]
    for rank, i in enumerate(order):
        replies[i] = texts[rank * n : (rank + 1) * n]
    return replies


def record_heads(
    systems: Sequence[dict[str, Any]], files: Mapping[str, Path], kept: Mapping[str, Sequence[int]]
) -> None:
    """The eval JSON's ``settings.systems`` entries of the model systems say how each decoded: ``head`` ``full``,
    or ``restricted`` with ``vocab_kept`` (the kept count) and ``vocab_ids`` (its file)."""
    for entry in systems:
        name = entry["name"]
        if entry["kind"] == "model":
            entry["head"] = "restricted" if name in kept else "full"
        if name in kept:
            entry |= {"vocab_kept": len(kept[name]), "vocab_ids": str(files[name])}


def _restrict(model: Any, vocab: Sequence[int], path: Path) -> None:
    """`model`'s head cut to the kept ids `vocab` (the model is only decoded: its head is frozen first)."""
    from queryrl.models.vocab import VocabError, restrict_head

    model.requires_grad_(False)
    try:
        restrict_head(model, vocab)
    except VocabError as exc:
        raise EvalError(f"--vocab-ids for {path}: {exc}") from None


def _set_threads(threads: int) -> None:
    """A generation process's torch threads (its share of the parent's)."""
    import torch

    torch.set_num_threads(threads)


def answers_in_processes(
    jobs: Mapping[str, Path],
    samples: Sequence[Sample],
    batch_size: int,
    max_new_tokens: int,
    processes: int,
    device: str | None = None,
    dtype: str | None = None,
    adapters: Mapping[str, Sequence[Path]] | None = None,
    vocab: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, list[Answer]]:
    """:func:`model_answers` of each model in `jobs` (name -> folder, with `adapters`' folders for that name merged
    into it and `vocab`'s kept ids for its head), up to `processes` models at once, each in a fresh process whose
    torch threads are its share of this process's (at least one).

    On a CPU two models decoding side by side on one thread each finish sooner than one after the other on two
    threads: a small model's decode step is mostly single-threaded work (dispatch, norms, sampling). The replies
    are those of one process, up to bf16 rounding ties (each model runs the same code on the same rows).
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch

    workers = max(1, min(processes, len(jobs)))
    threads = max(1, torch.get_num_threads() // workers)
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's thread pools
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_set_threads, initargs=(threads,)) as pool:
        futures = {
            name: pool.submit(
                model_answers,
                path,
                samples,
                batch_size,
                max_new_tokens,
                device,
                dtype,
                (adapters or {}).get(name, ()),
                (vocab or {}).get(name),
            )
            for name, path in jobs.items()
        }
        return {name: future.result() for name, future in futures.items()}


def model_answers(
    path: Path,
    samples: Sequence[Sample],
    batch_size: int,
    max_new_tokens: int,
    device: str | None = None,
    dtype: str | None = None,
    adapters: Sequence[Path] = (),
    vocab: Sequence[int] | None = None,
) -> list[Answer]:
    """Greedy replies of the model in `path` (with `adapters` merged; its head restricted to `vocab`) to each
    sample's prompt
    (:func:`generate_replies`), parsed (:func:`parse_answer`, as the sample's prompt asked:
    ``Sample.answer_format``)."""
    from queryrl.rollout.base import SamplingParams

    params = SamplingParams(do_sample=False, max_new_tokens=max_new_tokens)
    prompts = [s.prompt for s in samples]
    replies = generate_replies(path, prompts, params, batch_size, device, dtype, adapters, vocab)
    answers = []
    for sample, (text,) in zip(samples, replies, strict=True):
        parsed = parse_answer(text, answer_format=sample.answer_format)
        if parsed is None:
            answers.append(Answer(None, raw=text))
        else:  # a query-only answer (the default prompt): the row's own profile and summary go to /rag/chat_8b
            profile = parsed.user_profile or sample.user_profile
            summary = parsed.history_summary or sample.history_summary
            answers.append(Answer(parsed.rewritten_query, profile, summary, raw=text, trailing=parsed.trailing))
    return answers
