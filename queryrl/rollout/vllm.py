"""Rollout with vLLM (``rollout.backend=vllm``): GPU only, imported lazily.

Not exercised on CPU machines: its tests are marked ``gpu`` and skipped without CUDA.

Same contract as :class:`~queryrl.rollout.hf.HFRollout` (prompt-major rows, absolute
``prompt_index``, response mask up to and including the first EOS, rollout log-probs of the
sampled tokens). vLLM returns log-probs of the *processed* distribution (``logprobs_mode=
processed_logprobs``: after temperature, and after top-k/top-p when those are on); with
top-k and top-p off they are ``log_softmax(logits / temperature)``, the HF backend's values.

Colocated with training on the same GPU, the engine sleeps between rollouts (level 1: weights
offloaded to CPU memory, KV cache freed) and wakes to generate or to take new weights.
:meth:`VLLMRollout.update_weights` pushes the trainer's weights after each update: the full
state dict, or with LoRA the base weights with the adapters merged in (the adapter is merged,
copied out and unmerged again, so the trainer's module is unchanged).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from queryrl.rollout.base import RolloutOutput, SamplingParams, check_prompts, left_pad


def _require_vllm() -> Any:
    if not torch.cuda.is_available():
        raise RuntimeError("rollout.backend='vllm' needs a CUDA GPU and none is visible; use rollout.backend='hf'")
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "rollout.backend='vllm' needs vLLM: pip install 'queryrl[vllm]' (a CUDA build); or use rollout.backend='hf'"
        ) from e
    return vllm


def model_path(model: nn.Module) -> Path:
    """The Hugging Face folder `model` (or a peft model's base) was loaded from."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    name = getattr(getattr(base, "config", None), "_name_or_path", "") or getattr(base, "name_or_path", "")
    if not name or not Path(name).exists():
        raise ValueError(f"cannot find the folder the policy was loaded from (got {name!r}); vLLM loads from a folder")
    return Path(name)


def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The plain (non-peft) state dict of `model`: with LoRA, the base weights with the adapters merged in."""
    if not hasattr(model, "merge_adapter"):
        return {k: v.detach() for k, v in model.state_dict().items()}
    model.merge_adapter()  # type: ignore[operator]
    try:
        base = model.get_base_model()  # type: ignore[operator]
        out = {}
        for key, value in base.state_dict().items():
            if "lora_" in key:
                continue
            out[key.replace(".base_layer.", ".")] = value.detach().clone()
    finally:
        model.unmerge_adapter()  # type: ignore[operator]
    return out


class VLLMRollout:
    """The ``vllm`` rollout backend (see the module docstring).

    Args:
        model: the trainer's policy (its folder is what vLLM loads first).
        tokenizer: gives ``pad_token_id`` and ``eos_token_id``.
        micro_batch_size: prompts per chunk of :meth:`generate_chunks` (vLLM batches internally).
        device: unused (vLLM places itself); accepted for the registry signature.
        gpu_memory_utilization: the GPU memory fraction vLLM may take (the trainer shares the GPU).
        sleep_between_rollouts: offload the engine while the trainer trains (colocated).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        micro_batch_size: int = 64,
        device: torch.device | None = None,
        gpu_memory_utilization: float = 0.4,
        sleep_between_rollouts: bool = True,
    ) -> None:
        vllm = _require_vllm()
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad token and an eos token")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: weights by reference
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.micro_batch_size = micro_batch_size
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)
        dtype = next(model.parameters()).dtype
        self.llm = vllm.LLM(
            model=str(model_path(model)),
            dtype={torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype],
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=sleep_between_rollouts,
            logprobs_mode="processed_logprobs",
        )
        self.sleep_between_rollouts = sleep_between_rollouts
        self.asleep = False
        self.update_weights(model)

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def _sleep(self) -> None:
        if self.sleep_between_rollouts and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutOutput:
        """Sample ``params.n`` responses per prompt; rows prompt-major."""
        return RolloutOutput.concat(list(self.generate_chunks(prompts, params)), self.pad_token_id)

    def generate_chunks(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[RolloutOutput]:
        """One output per `micro_batch_size` prompts, in order (``prompt_index`` absolute)."""
        check_prompts(prompts)
        from vllm.inputs import TokensPrompt

        sampling = self._vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature if params.do_sample else 0.0,
            top_p=params.top_p if params.do_sample else 1.0,
            top_k=params.top_k if params.do_sample and params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=[self.eos_token_id],
        )
        self._wake()
        try:
            for start in range(0, len(prompts), self.micro_batch_size):
                chunk = prompts[start : start + self.micro_batch_size]
                outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in chunk], sampling, use_tqdm=False)
                yield self._to_output(chunk, outs, start)
        finally:
            self._sleep()

    def _to_output(self, chunk: list[list[int]], outs: list[Any], start: int) -> RolloutOutput:
        rows_prompt, rows_ids, rows_lp, index = [], [], [], []
        for i, (prompt, out) in enumerate(zip(chunk, outs, strict=True)):
            for completion in out.outputs:
                ids = list(completion.token_ids) or [self.eos_token_id]
                lps = [
                    float(step[tok].logprob) if step is not None and tok in step else 0.0
                    for tok, step in zip(ids, completion.logprobs or [None] * len(ids), strict=False)
                ]
                rows_prompt.append(prompt)
                rows_ids.append(ids)
                rows_lp.append(lps + [0.0] * (len(ids) - len(lps)))
                index.append(start + i)
        prompt_ids, prompt_mask = left_pad(rows_prompt, self.pad_token_id)
        width = max(len(r) for r in rows_ids)
        response_ids = torch.full((len(rows_ids), width), self.pad_token_id, dtype=torch.long)
        logprobs = torch.zeros(len(rows_ids), width)
        for r, (ids, lps) in enumerate(zip(rows_ids, rows_lp, strict=True)):
            response_ids[r, : len(ids)] = torch.tensor(ids)
            logprobs[r, : len(lps)] = torch.tensor(lps)
        return RolloutOutput.from_generated(
            prompt_ids,
            prompt_mask,
            response_ids,
            logprobs,
            torch.tensor(index, dtype=torch.long),
            self.eos_token_id,
            self.pad_token_id,
        )

    def update_weights(self, source: nn.Module) -> None:
        """Load `source`'s weights (LoRA merged) into the engine, waking it for the copy."""
        weights = list(merged_state_dict(source).items())
        self._wake()
        try:
            self.llm.apply_model(lambda model: model.load_weights(weights))
        finally:
            self._sleep()
