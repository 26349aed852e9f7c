"""The rollout contract: sampling parameters, the output container, the backend protocol, the registry.

Notation: `N` sequences (``n`` samples per prompt, prompt-major), `P` prompt tokens (left-padded),
`T` response tokens (right-padded), `V` vocabulary.

A backend turns token-id prompts into sampled responses with the log-probs of the sampled tokens.
Rows are prompt-major: the ``n`` samples of prompt ``i`` are contiguous, and ``prompt_index``
says which input prompt each row came from (an absolute index into the prompts given to
``generate``). The registry maps ``rollout.backend`` to a factory; ``hf`` runs anywhere (with a
fast decode path for Qwen2, Qwen3, Llama and Gemma 3, ``rollout.fast_decode``),
``vllm`` (GPU, imported lazily) runs vLLM with weights synced from the trainer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from queryrl.padding import cat_padded
from queryrl.registry import Registry


@dataclass
class SamplingParams:
    """How to sample: the vLLM/verl knobs, with the same meanings.

    Attributes:
        temperature: softmax temperature (> 0 when sampling; ignored when greedy).
        top_p: nucleus mass in (0, 1]; 1 = off.
        top_k: keep the k most likely tokens; 0 = off.
        n: samples per prompt (the GRPO group size).
        do_sample: False = greedy decoding.
        max_new_tokens: the response budget; a response without EOS within it is ``truncated``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    do_sample: bool = True
    max_new_tokens: int = 256

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling (got {self.temperature}); use do_sample=False")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, 0 = off (got {self.top_k})")
        if self.n < 1:
            raise ValueError(f"n must be >= 1 (got {self.n})")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")

    @property
    def logprob_temperature(self) -> float:
        """The temperature the rollout log-probs are taken at: ``temperature``, or 1 when greedy."""
        return self.temperature if self.do_sample else 1.0


@dataclass
class RolloutOutput:
    """Sampled responses, flat over sequences. All tensors on the CPU.

    Attributes:
        prompt_ids: (N, P) long, left-padded with the pad id.
        prompt_mask: (N, P) long, 1 = a real prompt token.
        response_ids: (N, T) long, right-padded with the pad id (also after the first EOS).
        response_mask: (N, T) float32, 1 for each generated token up to and including the first
            EOS (every generated token when there is no EOS), 0 after.
        rollout_logprobs: (N, T) float32, ``log_softmax(logits / temperature)`` at the sampled
            token, before any top-k/top-p truncation (verl's rollout log-probs; temperature 1 when
            greedy); 0 where ``response_mask`` is 0.
        prompt_index: (N,) long, the (absolute) index of the input prompt each row came from.
        truncated: (N,) bool, no EOS within ``max_new_tokens``.
        response_attention_mask: (N, T) long or None, 1 on every real response token: generated,
            or inserted by a multi-turn agent loop (tool output, chat-template tokens), which the
            policy attends to but is not trained on. None = ``response_mask > 0`` (single turn).
        extras: per-row facts about the rollout (a multi-turn loop's ``num_turns``,
            ``num_tool_calls``, ...), merged into the reward function's ``extra_info``; None = none.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    rollout_logprobs: Tensor
    prompt_index: Tensor
    truncated: Tensor
    response_attention_mask: Tensor | None = None
    extras: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        n = self.prompt_ids.shape[0]
        for f in fields(self):
            t = getattr(self, f.name)
            if t is not None and len(t) != n:
                raise ValueError(f"RolloutOutput.{f.name} has {len(t)} rows, prompt_ids has {n}")
        if self.prompt_mask.shape != self.prompt_ids.shape:
            raise ValueError(
                f"prompt_mask {tuple(self.prompt_mask.shape)} != prompt_ids {tuple(self.prompt_ids.shape)}"
            )
        for name in ("response_mask", "rollout_logprobs", "response_attention_mask"):
            if getattr(self, name) is not None and getattr(self, name).shape != self.response_ids.shape:
                raise ValueError(
                    f"{name} {tuple(getattr(self, name).shape)} != response_ids {tuple(self.response_ids.shape)}"
                )

    @classmethod
    def from_generated(
        cls,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        response_ids: Tensor,
        logprobs: Tensor,
        prompt_index: Tensor,
        eos_token_id: int,
        pad_token_id: int,
    ) -> RolloutOutput:
        """The output of a backend's generated (N, T) tokens and their log-probs (CPU tensors): counted
        up to and including the first EOS, the pad id and log-prob 0 after it (:func:`eos_response_mask`)."""
        response_mask, truncated = eos_response_mask(response_ids, eos_token_id)
        counted = response_mask.bool()
        return cls(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids.masked_fill(~counted, pad_token_id),
            response_mask=response_mask,
            rollout_logprobs=logprobs.masked_fill(~counted, 0.0),
            prompt_index=prompt_index,
            truncated=truncated,
        )

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def response_lengths(self) -> Tensor:
        """(N,) long: counted response tokens per row."""
        return self.response_mask.sum(-1).long()

    def select(self, rows: Sequence[int] | Tensor) -> RolloutOutput:
        """The rows at `rows`, in that order (``prompt_index`` kept: it still names the input prompt)."""
        index = torch.as_tensor(rows, dtype=torch.long)
        picked: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                value = value[index]
            elif isinstance(value, list):
                value = [value[int(i)] for i in index.tolist()]
            picked[f.name] = value
        return RolloutOutput(**picked)

    def attention_mask(self) -> Tensor:
        """(N, T) long: 1 on every real response token (``response_attention_mask``, or the trained ones)."""
        if self.response_attention_mask is not None:
            return self.response_attention_mask.long()
        return (self.response_mask > 0).long()

    @classmethod
    def concat(cls, outputs: Sequence[RolloutOutput], pad_id: int) -> RolloutOutput:
        """Stack outputs row-wise, re-padding prompts (left) and responses (right) to common widths.

        Each output's ``prompt_index`` is already absolute (an index into the full prompt list),
        so it is kept as is: chunks of one ``generate`` call concatenate to that call's output.
        An empty ``outputs`` gives an empty output (N = P = T = 0).
        """
        if not outputs:
            empty = torch.zeros(0, 0, dtype=torch.long)
            return cls(
                prompt_ids=empty,
                prompt_mask=empty.clone(),
                response_ids=empty.clone(),
                response_mask=torch.zeros(0, 0),
                rollout_logprobs=torch.zeros(0, 0),
                prompt_index=torch.zeros(0, dtype=torch.long),
                truncated=torch.zeros(0, dtype=torch.bool),
            )
        p = max(o.prompt_ids.shape[1] for o in outputs)
        t = max(o.response_ids.shape[1] for o in outputs)
        return cls(
            prompt_ids=cat_padded([o.prompt_ids for o in outputs], p, pad_id, left=True),
            prompt_mask=cat_padded([o.prompt_mask for o in outputs], p, 0, left=True),
            response_ids=cat_padded([o.response_ids for o in outputs], t, pad_id, left=False),
            response_mask=cat_padded([o.response_mask for o in outputs], t, 0, left=False),
            rollout_logprobs=cat_padded([o.rollout_logprobs for o in outputs], t, 0, left=False),
            prompt_index=torch.cat([o.prompt_index for o in outputs]),
            truncated=torch.cat([o.truncated for o in outputs]),
            response_attention_mask=(
                cat_padded([o.attention_mask() for o in outputs], t, 0, left=False)
                if any(o.response_attention_mask is not None for o in outputs)
                else None
            ),
            extras=(
                [e for o in outputs for e in (o.extras if o.extras is not None else [{}] * len(o))]
                if any(o.extras is not None for o in outputs)
                else None
            ),
        )


def check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    """Every backend's input check: no prompt may be empty (there is nothing to condition on)."""
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Left-pad token-id lists to ``(ids (N, P) long, mask (N, P) long)``; P = the longest."""
    width = max((len(s) for s in seqs), default=0)
    if not seqs:
        return torch.zeros((0, 0), dtype=torch.long), torch.zeros((0, 0), dtype=torch.long)
    # built as Python lists, then one tensor each: two tensor ops in all instead of four per row
    ids = torch.tensor([[pad_id] * (width - len(s)) + [int(t) for t in s] for s in seqs], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long)
    return ids, mask


def eos_response_mask(response_ids: Tensor, eos_token_id: int) -> tuple[Tensor, Tensor]:
    """The mask of counted response tokens and the truncation flags.

    Args:
        response_ids: (N, T) generated tokens.
        eos_token_id: the end-of-sequence id.

    Returns:
        ``(response_mask (N, T) float32, truncated (N,) bool)``: the mask is 1 up to and
        including the first EOS (everything when there is none); ``truncated`` = no EOS.
    """
    is_eos = (response_ids == eos_token_id).long()  # (N, T)
    eos_before = is_eos.cumsum(-1) - is_eos  # EOS strictly before t
    mask = (eos_before == 0).float()  # (N, T)
    return mask, is_eos.sum(-1) == 0


@runtime_checkable
class RolloutBackend(Protocol):
    """What the trainer needs from a generator: prompts -> responses, and weight sync."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutOutput:
        """Sample ``params.n`` responses for each prompt (token ids, no padding)."""
        ...

    def generate_chunks(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[RolloutOutput]:
        """As ``generate``, one output per generation micro-batch, in order, so that scoring can
        start on the early chunks while later ones generate. ``prompt_index`` is absolute."""
        ...

    def update_weights(self, source: nn.Module) -> None:
        """Make the generator's weights equal to ``source``'s (after each optimizer update)."""
        ...


class RolloutFactory(Protocol):
    """The signature every registered rollout backend factory has (``fast_decode``: the ``hf``
    backend's decode path, ``rollout.fast_decode``; ``dtype``: the dtype an engine with weights of
    its own computes in, None = the model's; a backend that runs the module itself ignores both)."""

    def __call__(
        self,
        model: nn.Module,
        tokenizer: Any,
        micro_batch_size: int,
        device: torch.device | None,
        fast_decode: str,
        dtype: torch.dtype | None,
    ) -> RolloutBackend: ...


ROLLOUT_BACKENDS: Registry[RolloutFactory] = Registry("rollout backend")


# each backend's module imports this one; it is imported only when the backend is chosen
ROLLOUT_BACKENDS.register_lazy("hf", "queryrl.rollout.hf:make_hf_rollout")
ROLLOUT_BACKENDS.register_lazy("vllm", "queryrl.rollout.vllm:make_vllm_rollout")  # imports vllm only when built


def make_rollout(
    name: str,
    model: nn.Module,
    tokenizer: Any,
    micro_batch_size: int = 64,
    device: torch.device | None = None,
    fast_decode: str = "auto",
    dtype: torch.dtype | None = None,
    engine: Mapping[str, Any] | None = None,
) -> RolloutBackend:
    """The rollout backend registered under ``name`` (``rollout.backend``). `engine`: options of a backend's
    engine (``rollout.vllm`` for ``vllm``), passed as the keyword ``engine`` only when given."""
    factory = ROLLOUT_BACKENDS.get(name)
    if engine is None:
        return factory(model, tokenizer, micro_batch_size, device, fast_decode, dtype)
    return factory(model, tokenizer, micro_batch_size, device, fast_decode, dtype, engine=engine)  # type: ignore[call-arg]
