"""The kept vocabulary of a run with ``model.vocab.restrict`` (see :mod:`queryrl.models.vocab`).

Computed once per run from the tokenizer and the data, sorted, written to the run folder and into every
checkpoint (``vocab_ids.json``), and read back from the checkpoint on resume, so a resumed run scores
exactly the tokens it scored before. The kept set is the union of:

- the tokenizer's special tokens (bos, eos, pad, the named ones) and every token of a chat-templated
  exchange (the turn markers the policy must produce to end its answer);
- every token of the training and validation prompts (as the rollout feeds them);
- every token of the rows' targets: the strings under ``reward_model.ground_truth`` and at ``sft.target_key``;
- the enabled application's texts (:meth:`queryrl.application.Application.vocab_texts`; the query rewriter:
  the embedded RAG service's corpus, whose names a rewrite copies);
- the lines of ``model.vocab.extra_files`` (e.g. held-out test conversations, a glossary);
- the kept ids the starting model carries (``model.path``'s ``vocab_ids.json``, written by a ``queryrl sft``
  with the option on): a GRPO run from such a warm-up keeps every token its SFT targets were learnt over;
- in ``queryrl sft``, every token of each example as it is trained on (prompt ids, and the target ids with
  the EOS the loss scores: :func:`sft_restrict`), so the targets' tokens are kept whatever tokenizes them.

:func:`sft_restrict` cuts an SFT model's head and :func:`~queryrl.models.vocab.unrestrict_head` puts the
full one back before the folder is saved: the SFT output is a full-vocabulary model with the kept ids
beside it (``<sft.output_dir>/vocab_ids.json``) for the stages after it (GRPO, ``queryrl eval --vocab-ids``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from torch import nn

from queryrl.application import enabled_app
from queryrl.config.schema import ConfigError
from queryrl.data import PromptDataset
from queryrl.models.vocab import (
    VOCAB_FILE,
    output_head,
    read_vocab_ids,
    restrict_head,
    template_token_ids,
    text_token_ids,
)


def _strings(value: Any) -> Iterator[str]:
    """Every string inside `value` (nested dicts and lists), keys excluded."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def _at(row: dict[str, Any], dotted: str) -> Any:
    node: Any = row
    for part in dotted.split(".") if dotted else []:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def target_texts(datasets: Sequence[PromptDataset], target_key: str) -> Iterator[str]:
    """The target strings of every row: under ``reward_model.ground_truth`` and at `target_key`."""
    for dataset in datasets:
        for item in dataset.items:
            reward_model = item.row.get("reward_model")
            if isinstance(reward_model, dict):
                yield from _strings(reward_model.get("ground_truth"))
            yield from _strings(_at(item.row, target_key))


def extra_file_texts(files: Iterable[str]) -> Iterator[str]:
    """The lines of each file of ``model.vocab.extra_files``.

    Raises:
        ConfigError: a file that cannot be read as UTF-8 text (named).
    """
    for name in files:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"model.vocab.extra_files: {name}: {type(exc).__name__}: {exc}") from None
        yield from text.splitlines()


def model_folder_vocab(cfg: DictConfig) -> list[int]:
    """The kept ids the starting model carries: ``<model.path>/vocab_ids.json`` (a restricted SFT's), else [].

    Raises:
        VocabError: the file is there but is not a kept-vocabulary file (named).
    """
    if not cfg.model.path:
        return []
    path = Path(str(cfg.model.path)).expanduser() / VOCAB_FILE
    return read_vocab_ids(path) if path.is_file() else []


def run_vocab_ids(
    cfg: DictConfig,
    tokenizer: Any,
    datasets: Sequence[PromptDataset],
    vocab_size: int,
    token_ids: Iterable[Iterable[int]] = (),
) -> list[int]:
    """The sorted kept token ids of a run (the module docstring lists what they cover), below `vocab_size`
    (the output head's rows); `token_ids`: sequences whose every id is kept too (SFT's examples)."""
    ids = template_token_ids(tokenizer)
    for dataset in datasets:
        for item in dataset.items:
            ids.update(item.input_ids)
    for sequence in token_ids:
        ids.update(int(i) for i in sequence)
    ids.update(model_folder_vocab(cfg))
    app = enabled_app(cfg)
    texts: list[Iterable[str]] = [target_texts(datasets, str(cfg.sft.target_key))]
    if app is not None:
        texts.append(app.vocab_texts(cfg))
    texts.append(extra_file_texts(cfg.model.vocab.extra_files))
    for group in texts:
        ids |= text_token_ids(tokenizer, group)
    return sorted(i for i in ids if 0 <= i < vocab_size)


def sft_restrict(cfg: DictConfig, model: nn.Module, tokenizer: Any, examples: Iterable[Any]) -> tuple[list[int], Any]:
    """``queryrl sft`` with ``model.vocab.restrict``: the kept ids (:func:`run_vocab_ids` over every token of
    `examples`' prompts and targets) and `model`'s head cut to them; returns the ids and the full head, which
    :func:`~queryrl.models.vocab.unrestrict_head` puts back before the model is saved.

    Raises:
        VocabError: the head cannot be restricted (a trained head: full fine-tuning).
    """
    head = output_head(model)
    size = int(head.weight.shape[0]) if isinstance(head, nn.Linear) else 0
    sequences = ([*e.prompt_ids, *e.target_ids] for e in examples)
    ids = run_vocab_ids(cfg, tokenizer, [], size, sequences)
    restrict_head(model, ids)
    return ids, head
