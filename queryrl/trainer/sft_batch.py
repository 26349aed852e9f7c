"""An SFT micro-batch and its losses: the left-padded batch of prompt + target sequences and the
cross-entropy of their target (and prompt) tokens, as :mod:`queryrl.trainer.sft` accumulates them.

With a restricted output head (``model.vocab.restrict``, :mod:`queryrl.models.vocab`) the logits are over
the kept tokens and the labels are looked up as restricted indices (:func:`head_labels`): the cross-entropy
is then the full distribution's restricted to the kept ids and renormalised, the policy GRPO goes on with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from queryrl.engine.policy import causal_lm_logits
from queryrl.models.vocab import head_tokens
from queryrl.padding import mask_positions

IGNORE_INDEX = -100  # the label of a position that carries no loss (prompt, padding)


@dataclass
class SFTExample:
    """One prompt and its target reply, as token ids.

    Attributes:
        prompt_ids: the chat prompt with the assistant turn opened, ``(P,)``.
        target_ids: the target reply followed by EOS (cut at ``data.max_response_length``), ``(T,)``.
        source: the file the row came from.
        index: the row's 0-based index in that file.
    """

    prompt_ids: list[int]
    target_ids: list[int]
    source: str
    index: int


def collate(examples: Sequence[SFTExample], pad_id: int) -> dict[str, Tensor]:
    """Left-padded ``input_ids``, ``attention_mask``, ``position_ids`` and ``labels``, each ``(N, L)``.

    ``labels`` hold the token id at target positions and :data:`IGNORE_INDEX` at prompt and
    padding positions; ``L`` is the longest prompt + target of these examples. Every target ends in
    the last column, so the LM head only needs the last ``longest target + 1`` positions
    (:func:`sum_target_loss`); ``position_ids`` count each sequence's own tokens from 0, as the RL
    batches' do (:meth:`queryrl.engine.batch.Batch.model_inputs`).
    """
    length = max(len(e.prompt_ids) + len(e.target_ids) for e in examples)
    input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    for i, e in enumerate(examples):
        start, t = length - len(e.prompt_ids) - len(e.target_ids), len(e.target_ids)
        input_ids[i, start:] = torch.tensor(e.prompt_ids + e.target_ids)
        labels[i, length - t :] = torch.tensor(e.target_ids)
        attention_mask[i, start:] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": mask_positions(attention_mask),
        "labels": labels,
    }


def head_labels(model: nn.Module, labels: Tensor) -> Tensor:
    """`labels` (token ids, :data:`IGNORE_INDEX` where nothing is scored) as indices into `model`'s logits:
    unchanged for a full head, restricted indices for a restricted one (a scored token outside the kept set
    is a :class:`~queryrl.models.vocab.VocabError`)."""
    scored = labels != IGNORE_INDEX
    mapped = head_tokens(model, labels.clamp(min=0), scored)
    return torch.where(scored, mapped, labels)


def sum_target_loss(model: nn.Module, batch: dict[str, Tensor], device: torch.device) -> tuple[Tensor, int]:
    """The summed cross-entropy of the target tokens of `batch` and how many there are.

    Only the positions from the earliest target token on reach the LM head (the prompts'
    logits would be masked out anyway).
    """
    input_ids = batch["input_ids"].to(device)
    labels = batch["labels"].to(device)
    length = labels.shape[1]
    targets = (labels != IGNORE_INDEX).any(dim=0).nonzero()
    first = max(int(targets[0]) if len(targets) else length - 1, 1)  # the first target column
    # position t predicts token t + 1: columns first - 1 .. L - 2 score the tokens first .. L - 1
    logits = causal_lm_logits(
        model,
        length - first + 1,
        input_ids=input_ids,
        attention_mask=batch["attention_mask"].to(device),
        position_ids=batch["position_ids"].to(device),
    )
    logits = logits[:, :-1].float()
    labels = head_labels(model, labels[:, first:])
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return loss, int((labels != IGNORE_INDEX).sum())


def sum_prompt_and_target_loss(
    model: nn.Module, batch: dict[str, Tensor], device: torch.device
) -> tuple[Tensor, int, Tensor, int]:
    """The summed cross-entropy of the target tokens and of the prompt tokens, and their counts.

    One forward over every position: each prompt token after the first is predicted from the ones
    before it (language modelling on the whole prompt, system prompt included), each target token
    as in :func:`sum_target_loss`. Padding carries no loss.
    """
    input_ids = batch["input_ids"].to(device)
    mask = batch["attention_mask"].to(device)
    positions = batch["position_ids"].to(device)
    logits = causal_lm_logits(
        model, input_ids.shape[1], input_ids=input_ids, attention_mask=mask, position_ids=positions
    )
    target = batch["labels"].to(device)[:, 1:] != IGNORE_INDEX
    prompt = (mask[:, :-1] * mask[:, 1:]).bool() & ~target  # a real token predicted from a real one
    scored = torch.where(target | prompt, input_ids[:, 1:], IGNORE_INDEX)
    tokens = head_labels(model, scored).clamp(min=0)  # padding: any index, masked out below
    ce = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), tokens, reduction="none")  # (N, L - 1)
    return (ce * target).sum(), int(target.sum()), (ce * prompt).sum(), int(prompt.sum())
