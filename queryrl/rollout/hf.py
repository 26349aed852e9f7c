"""Rollout with Hugging Face models: any causal LM (or peft model), CPU or GPU.

Notation: `B` sequences in a generation micro-batch, `P` prompt tokens, `T` response tokens,
`V` vocabulary.

Each prompt is repeated ``n`` times (prompt-major) and the sequences are generated
``micro_batch_size`` at a time, left-padded, with the attention mask (``generate`` derives
``position_ids = cumsum(mask) - 1``, 0 on padding, and continues them step by step). The
log-prob of each sampled token is recorded while generating, from the raw logits of that step
(``log_softmax(logits / temperature)``, before top-k/top-p), by a logits processor that keeps
only one step's (B, V) log-probs alive instead of all T steps' logits.

Qwen2, Qwen3, Llama and Gemma 3 models that :mod:`queryrl.rollout.fast_decode` supports, LoRA
policies included, skip ``generate`` by default (``fast_decode="auto"``): the same function, tokens
and log-probs with a fraction of transformers' per-token overhead; ``fast_decode="off"``, or any
other model, uses ``generate``. ``decode_graph`` runs the fast path's token steps as one static step
(:mod:`queryrl.rollout.graph_decode`), captured in a CUDA graph on a GPU: ``on`` everywhere (eagerly on a
CPU), ``auto`` on a GPU only, ``off`` (the default until it is measured on a GPU) never. A model with a
compute dtype (``model.compute_dtype``, mixed precision) generates in it: under ``torch.autocast`` on the
``generate`` path, from weights cast to it on the fast path. ``quantize="int8"`` (a CPU only) computes the
base model's linear layers from int8 copies (:mod:`queryrl.rollout.int8`) on both paths: the fast path keeps
them with its other derived base copies, ``generate`` runs with them swapped in for the call; both make a
layer's copy again only when its weights changed (under LoRA: once per run).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from queryrl.models.loading import compute_autocast, compute_dtype
from queryrl.models.vocab import full_vocab_processors, output_head
from queryrl.rollout.base import RolloutOutput, SamplingParams, check_prompts, left_pad
from queryrl.rollout.fast_decode import FastDecoder, unsupported_reason
from queryrl.rollout.graph_decode import GraphDecoder, graph_on
from queryrl.rollout.int8 import Int8Copies, available_reason, check_mode

FAST_DECODE_MODES = ("auto", "off")

# Every logits-shaping option of `generate`, set to "off", so that a model's own
# generation_config (e.g. Qwen's repetition_penalty=1.05, top_k=20) cannot add processors:
# the sampling distribution is exactly the one SamplingParams describes.
_NEUTRAL_GENERATION_KWARGS: dict[str, Any] = {
    "num_beams": 1,
    "num_return_sequences": 1,
    "min_length": 0,
    "min_new_tokens": 0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": None,
    "min_p": None,
    "top_h": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "renormalize_logits": False,
    "remove_invalid_values": False,
    "watermarking_config": None,
    "stop_strings": None,
    "max_time": None,
    "use_cache": True,
}


class _LogprobRecorder:
    """A logits processor that records ``log_softmax(raw_logits / temperature)`` at the sampled tokens.

    ``generate`` calls it once per step with the sequences so far (B, P + s) and that step's
    scores (B, V), after the (neutralised) built-in processors and before the sampling warpers
    (temperature, top-k, top-p), so the scores are the raw logits. The token sampled at step
    ``s - 1`` is the last column of the next call's ``input_ids``; the last step's token is
    gathered in :meth:`finish`. Duck-typed (no transformers import needed here).
    """

    def __init__(self, prompt_width: int, temperature: float) -> None:
        self.prompt_width = prompt_width
        self.temperature = temperature
        self.logprobs: list[Tensor] = []  # step s -> (B,) log-prob of the token sampled at step s
        self.pending: Tensor | None = None  # (B, V) log-probs of the latest step, token not seen yet

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        step = input_ids.shape[1] - self.prompt_width
        if step > 0:
            self._gather(input_ids[:, -1])
        assert len(self.logprobs) == step, "generate skipped a step"
        self.pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)  # (B, V)
        return scores

    def _gather(self, tokens: Tensor) -> None:
        assert self.pending is not None
        self.logprobs.append(self.pending.gather(-1, tokens[:, None]).squeeze(-1))  # (B,)
        self.pending = None

    def finish(self, response_ids: Tensor) -> Tensor:
        """(B, T) log-probs of ``response_ids`` (B, T), the generated tokens."""
        width = response_ids.shape[1]
        if len(self.logprobs) < width:
            self._gather(response_ids[:, len(self.logprobs)])
        if len(self.logprobs) < width:
            raise RuntimeError(f"recorded {len(self.logprobs)} log-prob steps for {width} generated tokens")
        return torch.stack(self.logprobs[:width], dim=1)


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) inside; every submodule's own train/eval flag restored after."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


class HFRollout:
    """The ``hf`` rollout backend.

    Args:
        model: a causal LM (``transformers`` or a peft ``PeftModel``); colocated with training
            by default, i.e. the very module the trainer updates.
        tokenizer: gives ``pad_token_id`` and ``eos_token_id``.
        micro_batch_size: sequences generated at once (after repeating each prompt ``n`` times).
        device: where to generate; default: the model's device.
        fast_decode: ``auto`` = :class:`~queryrl.rollout.fast_decode.FastDecoder` when it supports
            the model (checked again before every micro-batch), else ``generate``; ``off`` =
            always ``generate``.
        decode_graph: ``on``, ``auto`` or ``off``: the fast path's token steps as one static step, a CUDA
            graph on a GPU (see :func:`~queryrl.rollout.graph_decode.graph_on`).
        quantize: ``none`` or ``int8``: the base model's linear layers (not the output head, not the LoRA
            adapters) from int8 copies (:mod:`queryrl.rollout.int8`); a CPU only, not with the static step.

    Attributes:
        decode_path: ``fast`` or ``generate``, what the next micro-batch will use.
        fallback_reason: why ``generate`` is used (None on the fast path).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        micro_batch_size: int = 64,
        device: torch.device | None = None,
        fast_decode: str = "auto",
        decode_graph: str = "off",
        quantize: str = "none",
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 (got {micro_batch_size})")
        if fast_decode not in FAST_DECODE_MODES:
            raise ValueError(f"fast_decode must be one of {', '.join(FAST_DECODE_MODES)} (got {fast_decode!r})")
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad token and an eos token")
        self.model = model
        self.tokenizer = tokenizer
        self.micro_batch_size = micro_batch_size
        self.device = device if device is not None else next(model.parameters()).device
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.fast_decode = fast_decode
        self.decode_graph = graph_on(decode_graph, self.device)  # also checks the mode
        self.quantize = check_mode(quantize)
        reason = available_reason(self.device) if self.quantize else None
        if self.quantize and self.decode_graph:
            reason = "rollout.quantize=int8 runs the dynamic decode step: set rollout.decode_graph=off"
        if reason is not None:
            raise ValueError(reason)
        self._int8 = Int8Copies()  # generate's copies (the fast path keeps its own)
        self._fast: FastDecoder | None = None

    @property
    def fallback_reason(self) -> str | None:
        if self.fast_decode == "off":
            return "fast_decode=off"
        return unsupported_reason(self.model)

    @property
    def decode_path(self) -> str:
        return "generate" if self.fallback_reason is not None else "fast"

    def _fast_decoder(self) -> FastDecoder | None:
        """The fast path for the next micro-batch, or None (see ``fallback_reason``)."""
        if self.fallback_reason is not None:
            return None
        if self._fast is None:
            dtype = compute_dtype(self.model)
            self._fast = (
                GraphDecoder(self.model, dtype) if self.decode_graph else FastDecoder(self.model, dtype, self.quantize)
            )
        return self._fast

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutOutput:
        """Sample ``params.n`` responses per prompt; rows prompt-major (see :class:`RolloutOutput`)."""
        return RolloutOutput.concat(list(self.generate_chunks(prompts, params)), self.pad_token_id)

    def generate_chunks(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[RolloutOutput]:
        """One :class:`RolloutOutput` per micro-batch of ``micro_batch_size`` sequences, in order."""
        check_prompts(prompts)
        # prompt-major: the n samples of prompt i are contiguous, so micro-batching is by sequence
        index = [i for i in range(len(prompts)) for _ in range(params.n)]
        for start in range(0, len(index), self.micro_batch_size):
            rows = index[start : start + self.micro_batch_size]
            yield self._generate_micro_batch([prompts[i] for i in rows], torch.tensor(rows), params)

    def _generate_micro_batch(
        self, prompts: list[list[int]], prompt_index: Tensor, params: SamplingParams
    ) -> RolloutOutput:
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_token_id)  # (B, P)
        fast = self._fast_decoder()
        if fast is not None:
            response_ids, logprobs = fast.generate(
                prompt_ids, prompt_mask, params, self.eos_token_id, self.pad_token_id
            )  # (B, T), (B, T)
        else:
            response_ids, logprobs = self._hf_generate(prompt_ids, prompt_mask, params)
        return RolloutOutput.from_generated(
            prompt_ids,
            prompt_mask,
            response_ids.cpu(),
            logprobs.cpu(),
            prompt_index,
            self.eos_token_id,
            self.pad_token_id,
        )

    @torch.no_grad()
    def _hf_generate(self, prompt_ids: Tensor, prompt_mask: Tensor, params: SamplingParams) -> tuple[Tensor, Tensor]:
        """``model.generate`` on (B, P) left-padded prompts: ``(response_ids (B, T), logprobs (B, T))``."""
        recorder = _LogprobRecorder(prompt_ids.shape[1], params.logprob_temperature)
        int8 = self._int8.swapped_in(self.model, output_head(self.model)) if self.quantize else contextlib.nullcontext()
        with _eval_mode(self.model), compute_autocast(self.model), int8:
            out = self.model.generate(  # type: ignore[operator]
                input_ids=prompt_ids.to(self.device),
                attention_mask=prompt_mask.to(self.device),
                do_sample=params.do_sample,
                temperature=params.temperature if params.do_sample else 1.0,
                top_p=params.top_p if params.do_sample else 1.0,
                top_k=params.top_k if params.do_sample else 0,
                max_new_tokens=params.max_new_tokens,
                pad_token_id=self.pad_token_id,
                eos_token_id=self.eos_token_id,
                # a restricted head's (B, K) scores spread over the vocabulary first (-inf outside the kept ids)
                logits_processor=[*full_vocab_processors(self.model), recorder],
                return_dict_in_generate=True,
                # each process generates on its own: transformers would otherwise sync every decoding step
                # over the process group when the model is FSDP-sharded (the workers gather it first)
                synced_gpus=False,
                **_NEUTRAL_GENERATION_KWARGS,
            )
        response_ids = out.sequences[:, prompt_ids.shape[1] :]  # (B, T)
        return response_ids, recorder.finish(response_ids)

    def update_weights(self, source: nn.Module) -> None:
        """Copy ``source``'s weights in (strict); nothing to do when it is this backend's model (the
        fast path, too, reads the module's weights afresh for every micro-batch, and rebuilds its
        merged LoRA / cast copies when a parameter changed)."""
        if source is self.model:
            return
        self.model.load_state_dict(source.state_dict(), strict=True)


def make_hf_rollout(
    model: nn.Module,
    tokenizer: Any,
    micro_batch_size: int,
    device: torch.device | None,
    fast_decode: str,
    dtype: torch.dtype | None,
    engine: Mapping[str, Any] | None = None,
) -> HFRollout:
    """``rollout.backend=hf`` (:data:`queryrl.rollout.base.ROLLOUT_BACKENDS`); `engine`: ``{"decode_graph": mode,
    "quantize": mode}`` (``rollout.decode_graph``, ``rollout.quantize``, from
    :func:`~queryrl.rollout.vllm.config_engine`), default off and none."""
    graph = str((engine or {}).get("decode_graph", "off"))
    quantize = str((engine or {}).get("quantize", "none"))
    return HFRollout(
        model, tokenizer, micro_batch_size, device, fast_decode=fast_decode, decode_graph=graph, quantize=quantize
    )
