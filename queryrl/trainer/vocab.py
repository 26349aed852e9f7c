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
- the lines of ``model.vocab.extra_files`` (e.g. held-out test conversations, a glossary).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from queryrl.application import enabled_app
from queryrl.config.schema import ConfigError
from queryrl.data import PromptDataset
from queryrl.models.vocab import template_token_ids, text_token_ids


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


def run_vocab_ids(cfg: DictConfig, tokenizer: Any, datasets: Sequence[PromptDataset], vocab_size: int) -> list[int]:
    """The sorted kept token ids of a run (the module docstring lists what they cover), below `vocab_size`
    (the output head's rows)."""
    ids = template_token_ids(tokenizer)
    for dataset in datasets:
        for item in dataset.items:
            ids.update(item.input_ids)
    app = enabled_app(cfg)
    texts: list[Iterable[str]] = [target_texts(datasets, str(cfg.sft.target_key))]
    if app is not None:
        texts.append(app.vocab_texts(cfg))
    texts.append(extra_file_texts(cfg.model.vocab.extra_files))
    for group in texts:
        ids |= text_token_ids(tokenizer, group)
    return sorted(i for i in ids if 0 <= i < vocab_size)
