"""Prompts: chat messages -> token ids through the tokenizer's chat template, and prompt datasets.

A prompt is the chat template applied with the generation prompt (the assistant turn opened),
tokenised without adding special tokens again: the template already wrote them. A tokenizer
without a chat template (a base model) gets the message contents joined by newlines, after the
BOS token where the tokenizer itself would add one (a Gemma or Llama base model without its BOS
is out of distribution from the first token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queryrl.data.records import DataError, line_byte_limit, load_records


def prompt_text(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The text the policy is prompted with: the chat template, or the contents joined by newlines.

    Args:
        tokenizer: a Hugging Face tokenizer.
        messages: chat messages ``{"role": str, "content": str}``.
    """
    if getattr(tokenizer, "chat_template", None):
        # tokenize=False: transformers 5 returns a BatchEncoding, not ids, when it tokenises.
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return str(text)
    return bos_prefix(tokenizer) + "\n".join(str(m["content"]) for m in messages)


def bos_prefix(tokenizer: Any) -> str:
    """The BOS token's text when `tokenizer` adds BOS to what it encodes (its own setting), else ``""``."""
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if not bos or bos_id is None:
        return ""
    try:
        ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    except Exception:  # a tokenizer that cannot say: add nothing
        return ""
    return str(bos) if ids and ids[0] == bos_id else ""


def encode_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of a chat prompt, ending with the opened assistant turn when there is a template.

    Args:
        tokenizer: a Hugging Face tokenizer.
        messages: chat messages ``{"role": str, "content": str}``.

    Returns:
        The ids, shape ``(P,)`` as a list (no padding, no extra special tokens).
    """
    return list(tokenizer(prompt_text(tokenizer, messages), add_special_tokens=False)["input_ids"])


@dataclass
class PromptItem:
    """One prompt ready for rollout.

    Attributes:
        input_ids: the prompt's token ids, ``(P,)``, unpadded.
        row: the data row it came from (``data_source``, ``reward_model``, ``extra_info``, ...).
        source: the path of the file the row came from.
        index: the row's 0-based index in that file (before any filtering).
    """

    input_ids: list[int]
    row: dict[str, Any]
    source: str
    index: int


@dataclass
class PromptDataset:
    """The prompts of one data file.

    Attributes:
        items: the prompts kept, in file order.
        path: the file.
        num_filtered: overlong prompts dropped.
        max_prompt_length: the limit the prompts were checked against.
    """

    items: list[PromptItem]
    path: str
    num_filtered: int = 0
    max_prompt_length: int | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> PromptItem:
        return self.items[i]


def build_prompt_dataset(
    path: str | Path,
    tokenizer: Any,
    max_prompt_length: int,
    filter_overlong: bool = True,
    prompt_key: str = "prompt",
    needs_truth: Callable[[str], bool] | None = None,
) -> PromptDataset:
    """Load a verl-layout file and encode every prompt.

    Args:
        path: a ``.parquet``, ``.jsonl`` or ``.json`` file (see :func:`load_records`).
        tokenizer: a Hugging Face tokenizer.
        max_prompt_length: the most prompt tokens allowed.
        filter_overlong: drop (and count) longer prompts; False: a longer prompt is an error.
        prompt_key: the column holding the chat messages.
        needs_truth: the data sources whose rows need a ``reward_model.ground_truth`` (:func:`~.records.check_record`).

    Raises:
        DataError: a bad file or row, a chat template that fails on a row, or (with
            ``filter_overlong=False``) an overlong prompt; the message names file and row.
    """
    if max_prompt_length <= 0:
        raise ValueError(f"max_prompt_length must be > 0, got {max_prompt_length}")
    num_filtered = 0

    def overlong_line(line: int, size: int) -> None:
        nonlocal num_filtered
        num_filtered += 1

    limit = line_byte_limit(max_prompt_length)
    on_overlong = overlong_line if filter_overlong else None  # else the line is a DataError naming it
    rows = load_records(path, prompt_key, limit, on_overlong, needs_truth)
    texts = []
    for i, row in enumerate(rows):
        try:
            texts.append(prompt_text(tokenizer, row[prompt_key]))
        except Exception as exc:
            raise DataError(f"{path}: row {i}: field {prompt_key!r}: the chat template failed: {exc}") from None
    # One batched call: the fast tokenizer encodes in parallel, same ids as one at a time.
    all_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    items: list[PromptItem] = []
    for i, (row, ids) in enumerate(zip(rows, all_ids, strict=True)):
        if len(ids) > max_prompt_length:
            if filter_overlong:
                num_filtered += 1
                continue
            raise DataError(
                f"{path}: row {i}: field {prompt_key!r}: the prompt is {len(ids)} tokens, "
                f"over max_prompt_length={max_prompt_length} (set filter_overlong_prompts to drop such rows)"
            )
        items.append(PromptItem(input_ids=list(ids), row=row, source=str(path), index=i))
    return PromptDataset(items=items, path=str(path), num_filtered=num_filtered, max_prompt_length=max_prompt_length)
