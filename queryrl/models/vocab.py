"""A vocabulary-restricted output head: the policy scores only the tokens a task can use.

Notation: `V` the model's vocabulary, `K` the kept token ids (sorted), `E` the hidden size.

Why: a small model's output projection can dominate its compute. Gemma 3 270M's 262,144 x 640 head is
170 M of its 268 M parameters; it runs for every decoded token and every logit the update and the
reference compute. A task uses a small part of that vocabulary (the tokens of its prompts, knowledge
base and answers), so the head is cut to those rows. The idea is Vocabulary Trimming (Ushio et al.,
2023, "An Efficient Multilingual Language Model Compression through Vocabulary Trimming"); here the
trimming is of the output head only and per run: the input embeddings stay whole (any prompt still
reads), and the exported model is the full-vocabulary one.

:func:`restrict_head` replaces the model's ``lm_head`` with a frozen ``nn.Linear`` (K, E) whose rows are
the full head's rows at the kept ids (a copy: a tied head's embeddings stay tied for the input), with
two non-persistent buffers: ``vocab_ids`` (K,) (restricted index -> token id) and ``vocab_index`` (V,)
(token id -> restricted index, -1 outside). The model's logits are then (..., K): restricted index ``i``
is token ``vocab_ids[i]``. Its log-probs are ``log_softmax`` over the kept tokens, i.e. the full
distribution restricted to them and renormalised: the policy of a run with the option on is that
distribution, and every log-prob of the run (rollout, old, reference, update) is over it.

The head must be frozen (LoRA, or any run that does not train it): a trained head would need its updates
scattered back into the full one. Nothing here is saved in weights: checkpoints hold what they held (the
LoRA adapters), and the kept ids go next to them as a JSON list (:func:`write_vocab_ids`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

VOCAB_FILE = "vocab_ids.json"  # the kept ids, in the run folder and in each checkpoint


class VocabError(ValueError):
    """A restricted vocabulary that cannot be used (its message says what and where)."""


def output_head(model: nn.Module) -> nn.Module | None:
    """`model`'s output projection (through peft and ``torch.compile`` wrappers), or None."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    return head if isinstance(head, nn.Module) else None


def vocab_ids(model: nn.Module) -> Tensor | None:
    """(K,) the token id of each restricted index when `model`'s head is restricted, else None."""
    head = output_head(model)
    ids = getattr(head, "vocab_ids", None) if head is not None else None
    return ids if isinstance(ids, Tensor) else None


def restrict_head(model: nn.Module, ids: Sequence[int]) -> nn.Linear:
    """Replace `model`'s ``lm_head`` by one over the token ids `ids` (sorted, distinct); returns the new head.

    Raises:
        VocabError: the head is not a plain ``nn.Linear``, is trained, is already restricted, or `ids` are not
            sorted distinct ids of its vocabulary.
    """
    head = output_head(model)
    if type(head) is not nn.Linear:
        raise VocabError(f"model.vocab.restrict: the output head is {type(head).__name__}, not a plain nn.Linear")
    if head.weight.requires_grad or (head.bias is not None and head.bias.requires_grad):
        raise VocabError(
            "model.vocab.restrict: the output head is trained (full fine-tuning, or LoRA on lm_head/embed_tokens); "
            "restrict the vocabulary with a frozen head (model.lora.rank > 0 on other modules)"
        )
    if hasattr(head, "vocab_ids"):
        raise VocabError("model.vocab.restrict: the output head is restricted already")
    full, width = head.weight.shape
    kept = torch.tensor(list(ids), dtype=torch.long)
    if kept.numel() == 0 or bool((kept[1:] <= kept[:-1]).any()) or int(kept[0]) < 0 or int(kept[-1]) >= full:
        raise VocabError(f"model.vocab.restrict: the kept ids must be sorted, distinct and in [0, {full})")
    device, dtype = head.weight.device, head.weight.dtype
    kept = kept.to(device)
    new = nn.Linear(width, kept.numel(), bias=head.bias is not None, device=device, dtype=dtype)
    new.weight = nn.Parameter(head.weight.detach()[kept].clone(), requires_grad=False)
    if head.bias is not None:
        new.bias = nn.Parameter(head.bias.detach()[kept].clone(), requires_grad=False)
    index = torch.full((full,), -1, dtype=torch.long, device=device)
    index[kept] = torch.arange(kept.numel(), device=device)
    new.register_buffer("vocab_ids", kept, persistent=False)
    new.register_buffer("vocab_index", index, persistent=False)
    getattr(model, "set_output_embeddings")(new)  # noqa: B009 - through peft's attribute forwarding
    return new


def unrestrict_head(model: nn.Module, head: nn.Module) -> None:
    """Put the full output head `head` (what :func:`restrict_head` replaced) back on `model`, e.g. before
    a model trained with the restricted head is saved (its weights are the full model's: the head was frozen).

    Raises:
        VocabError: `model`'s head is not a restricted one.
    """
    if vocab_ids(model) is None:
        raise VocabError("model.vocab.restrict: the output head is not restricted; nothing to put back")
    getattr(model, "set_output_embeddings")(head)  # noqa: B009 - through peft's attribute forwarding


def head_tokens(model: nn.Module, tokens: Tensor, counted: Tensor | None = None) -> Tensor:
    """`tokens` (token ids) as indices into `model`'s logits: themselves for a full head, their restricted
    indices for a restricted one. A token outside the kept set maps to 0; where `counted` (same shape, > 0 =
    scored) marks one, that is an error: its log-prob is not defined under the restricted policy.

    Raises:
        VocabError: a counted token outside the kept set.
    """
    head = output_head(model)
    index = getattr(head, "vocab_index", None) if head is not None else None
    if not isinstance(index, Tensor):
        return tokens
    mapped = index[tokens.to(index.device)].to(tokens.device)
    outside = mapped < 0
    if counted is not None and bool((outside & (counted > 0)).any()):
        bad = sorted({int(t) for t in tokens[outside & (counted > 0)].tolist()})[:5]
        raise VocabError(f"model.vocab.restrict: response tokens {bad} are outside the kept vocabulary")
    return mapped.clamp(min=0)


class FullVocabScores:
    """A ``generate`` logits processor that spreads (B, K) restricted scores over the (B, V) vocabulary,
    ``-inf`` outside the kept ids: what ``generate`` samples is then a token id, with the restricted policy's
    probabilities (a softmax over V with ``-inf`` outside K is the softmax over K). Duck-typed, first in the
    processor list (before the log-prob recorder and the sampling warpers)."""

    def __init__(self, ids: Tensor, vocab_size: int) -> None:
        self.ids = ids
        self.vocab_size = vocab_size

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        full = scores.new_full((scores.shape[0], self.vocab_size), float("-inf"))
        return full.index_copy_(1, self.ids.to(scores.device), scores)


def full_vocab_processors(model: nn.Module) -> list[Any]:
    """``[FullVocabScores]`` for a model with a restricted head, else ``[]``."""
    head = output_head(model)
    ids = vocab_ids(model)
    if head is None or ids is None:
        return []
    index = getattr(head, "vocab_index")  # noqa: B009
    return [FullVocabScores(ids, int(index.shape[0]))]


# --- the kept set -----------------------------------------------------------------------------------


def template_token_ids(tokenizer: Any) -> set[int]:
    """The special tokens (bos, eos, pad, the named ones) and every token a chat-templated exchange holds."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            ids.add(value)
    if getattr(tokenizer, "chat_template", None):
        exchange = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        for messages in (exchange, [{"role": "system", "content": "s"}, *exchange]):
            try:
                out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
            except Exception:  # a template without a system role: the other one counts
                continue
            out = out.get("input_ids", out) if isinstance(out, dict) or hasattr(out, "keys") else out
            ids.update(int(i) for i in out)
    return ids


def text_token_ids(tokenizer: Any, texts: Iterable[str], batch: int = 512) -> set[int]:
    """Every token of each text in `texts`, tokenized alone (no special tokens), in batches."""
    ids: set[int] = set()
    chunk: list[str] = []

    def flush() -> None:
        if chunk:
            for row in tokenizer(chunk, add_special_tokens=False)["input_ids"]:
                ids.update(int(i) for i in row)
            chunk.clear()

    for text in texts:
        if text:
            chunk.append(text)
            if len(chunk) >= batch:
                flush()
    flush()
    return ids


def vocab_json(ids: Sequence[int]) -> str:
    """The text of a ``vocab_ids.json``: ``{"kept": K, "ids": [...]}``."""
    return json.dumps({"kept": len(ids), "ids": [int(i) for i in ids]})


def write_vocab_ids(path: Path, ids: Sequence[int]) -> Path:
    """Write the kept ids to `path` as JSON (a temporary name, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(vocab_json(ids), encoding="utf-8")
    tmp.replace(path)
    return path


def read_vocab_ids(path: Path) -> list[int]:
    """The kept ids :func:`write_vocab_ids` wrote.

    Raises:
        VocabError: not such a file.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ids = [int(i) for i in data["ids"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VocabError(f"{path}: not a kept-vocabulary file ({type(exc).__name__}: {exc})") from None
    return ids
