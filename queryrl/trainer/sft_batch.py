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

from queryrl.engine.policy import attention_window, can_share_prompt, causal_lm_logits, prefix_cache
from queryrl.models.loading import compute_autocast
from queryrl.models.vocab import head_tokens
from queryrl.padding import MIN_SHARED_PREFIX, mask_positions

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


def shared_prefix_length(examples: Sequence[SFTExample]) -> int:
    """How many leading prompt tokens every one of `examples` has in common, at most the shortest prompt's
    length less one (so every example keeps a prompt token of its own after the prefix)."""
    first = examples[0].prompt_ids
    limit = min(len(e.prompt_ids) for e in examples) - 1
    n = 0
    while n < limit and all(e.prompt_ids[n] == first[n] for e in examples):
        n += 1
    return n


def collate_shared(
    examples: Sequence[SFTExample], pad_id: int, window: int | None = None, min_prefix: int = MIN_SHARED_PREFIX
) -> dict[str, Tensor] | None:
    """The micro-batch with the prompts' common leading tokens taken out, to run once: ``prefix_ids`` (1, c),
    and what follows it in each row (the rest of the prompt, then the target) with ``attention_mask``,
    ``position_ids`` counted on from c, and ``labels`` as :func:`collate`'s.

    The rests are left-padded, as :func:`collate` pads, so every target ends in the last column and the LM
    head projects the longest target's positions only; the padding then sits between the prefix and a
    row's rest, which leaves attention unchanged unless a sliding `window` (``config.sliding_window``) is
    shorter than the laid-out row. There the rests are right-padded instead (every row's tokens next to the
    prefix, as in its own forward; the head then projects from the earliest target on). None when sharing
    does not pay: fewer than two examples, or a prefix shorter than `min_prefix`.
    """
    c = shared_prefix_length(examples) if len(examples) > 1 else 0
    if c < min_prefix:
        return None
    rests = [SFTExample(e.prompt_ids[c:], e.target_ids, e.source, e.index) for e in examples]
    width = max(len(r.prompt_ids) + len(r.target_ids) for r in rests)
    if window is None or c + width <= window:
        batch = collate(rests, pad_id)
        batch["position_ids"] = batch["position_ids"] + c
    else:
        batch = {
            "input_ids": torch.full((len(rests), width), pad_id, dtype=torch.long),
            "labels": torch.full((len(rests), width), IGNORE_INDEX, dtype=torch.long),
            "attention_mask": torch.zeros((len(rests), width), dtype=torch.long),
            "position_ids": (c + torch.arange(width)).expand(len(rests), width),
        }
        for i, r in enumerate(rests):
            end = len(r.prompt_ids) + len(r.target_ids)
            batch["input_ids"][i, :end] = torch.tensor(r.prompt_ids + r.target_ids)
            batch["labels"][i, len(r.prompt_ids) : end] = torch.tensor(r.target_ids)
            batch["attention_mask"][i, :end] = 1
    batch["prefix_ids"] = torch.tensor(examples[0].prompt_ids[:c]).unsqueeze(0)
    return batch


def micro_batch(model: nn.Module, examples: Sequence[SFTExample], pad_id: int, share_prefix: bool) -> dict[str, Tensor]:
    """`examples` collated for :func:`sum_target_loss`: with `share_prefix`, where `model` can take a key/value
    cache (:func:`~queryrl.engine.policy.can_share_prompt`) and its layers are full or sliding-window attention,
    the prompts' common prefix (the system prompt) runs once (:func:`collate_shared`); otherwise the whole
    left-padded batch (:func:`collate`)."""
    window = attention_window(model) if share_prefix and can_share_prompt(model) else 0
    shared = collate_shared(examples, pad_id, window) if window != 0 else None
    return shared if shared is not None else collate(examples, pad_id)


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
    logits would be masked out anyway). A batch from :func:`collate_shared` runs its ``prefix_ids`` once and
    the rest of every row on that prefix's keys and values: the same logits up to float rounding, and the
    prefix's tokens computed once instead of once a row (the idea of Prefix Grouper, Liu et al. 2025, applied
    to the prompts' common system prompt).
    """
    input_ids = batch["input_ids"].to(device)
    labels = batch["labels"].to(device)
    mask = batch["attention_mask"].to(device)
    length = labels.shape[1]
    targets = (labels != IGNORE_INDEX).any(dim=0).nonzero()
    first = max(int(targets[0]) if len(targets) else length - 1, 1)  # the first target column
    # position t predicts token t + 1: columns first - 1 .. L - 2 score the tokens first .. L - 1
    positions, keep = batch["position_ids"].to(device), length - first + 1
    if "prefix_ids" in batch:
        prefix = batch["prefix_ids"].to(device)
        cache = prefix_cache(model, prefix, input_ids.shape[0])
        mask = torch.cat([mask.new_ones(mask.shape[0], prefix.shape[1]), mask], dim=1)
        with compute_autocast(model):
            out = model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=keep,
                **cache,
            )
        logits = out.logits[:, -keep:]
    else:
        logits = causal_lm_logits(model, keep, input_ids=input_ids, attention_mask=mask, position_ids=positions)
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
