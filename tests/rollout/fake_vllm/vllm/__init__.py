"""A CPU stand-in for the part of vLLM 0.32 that queryrl's vllm backend uses (see ../README.md).

The engine holds its own copy of the model: a plain transformers model loaded from the folder,
whose parameters are full-size tensors, never the trainer's. ``load_weights`` copies tensors into
them as vLLM's ``default_weight_loader`` does. Generation is a plain token-by-token loop:
greedy at temperature 0, else sampling from ``softmax(logits / temperature)``; the log-probs
returned are the processed ones (``logprobs_mode="processed_logprobs"``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

__version__ = os.environ.get("FAKE_VLLM_VERSION", "0.32.0")

_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
# LLM.__init__'s named parameters in vLLM 0.32 and the EngineArgs fields a caller may pass through **kwargs
_KEYWORDS = {
    "runner", "convert", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
    "tensor_parallel_size", "dtype", "quantization", "revision", "seed", "gpu_memory_utilization",
    "cpu_offload_gb", "enforce_eager", "hf_overrides", "compilation_config", "enable_sleep_mode",
    "logprobs_mode", "max_model_len", "enable_prefix_caching", "max_num_seqs",
}  # fmt: skip


def default_weight_loader(param: Tensor, loaded_weight: Tensor) -> None:
    """vLLM's default loader: shapes must be equal; the value is copied into the parameter's data."""
    assert param.size() == loaded_weight.size(), (
        f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})"
    )
    param.data.copy_(loaded_weight)


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if self.top_k not in (0, -1) or self.top_p != 1.0:
            raise NotImplementedError("the stand-in samples without top-k/top-p")


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    text: str = ""


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class StandInModel(nn.Module):
    """The engine's model: a plain causal LM with vLLM's ``load_weights`` contract."""

    def __init__(self, folder: str, dtype: torch.dtype) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.lm = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval().requires_grad_(False)
        self.tied = bool(getattr(self.lm.config, "tie_word_embeddings", False))
        self.loads = 0  # how many load_weights calls completed

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:  # names as the HF state dict has them
        return self.lm.named_parameters(*args, **kwargs)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        targets = dict(self.lm.named_parameters())
        targets.update({n: b for n, b in self.lm.named_buffers() if n in self.lm.state_dict()})
        loaded: set[str] = set()
        for name, weight in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tied:
                continue  # vLLM skips the tied head: the embedding is loaded
            default_weight_loader(targets[name], weight)  # KeyError on a name the model does not have
            loaded.add(name)
        self.loads += 1
        return loaded


class LLM:
    """``vllm.LLM`` on CPU: the in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) only."""

    instances: ClassVar[list[LLM]] = []  # every engine built, for the tests to inspect

    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - _KEYWORDS)
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument {unknown[0]!r}")
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
            raise RuntimeError("the stand-in runs the in-process engine only (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
        dtype = kwargs.get("dtype", "auto")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype {dtype!r} not supported by the stand-in")
        mode = kwargs.get("logprobs_mode", "raw_logprobs")
        if mode not in _LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode {mode!r}")
        self.kwargs = kwargs
        self.model = StandInModel(model, _DTYPES[dtype])
        self.sleep_enabled = bool(kwargs.get("enable_sleep_mode", False))
        self.asleep = False
        self.calls: list[str] = []  # the API calls in order, for the tests
        LLM.instances.append(self)

    def _awake(self, what: str) -> None:
        self.calls.append(what)
        if self.asleep:
            raise RuntimeError(f"{what} on a sleeping engine: call wake_up() first")

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.sleep_enabled:
            raise ValueError("Sleep mode is not enabled in the model config")
        if level not in (0, 1, 2):
            raise ValueError(f"sleep level {level}")
        self.calls.append(f"sleep({level})")
        self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append("wake_up")
        self.asleep = False
        return True

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self._awake("reset_prefix_cache")
        return True

    def apply_model(self, func: Callable[[nn.Module], Any]) -> list[Any]:
        self._awake("apply_model")
        return [func(self.model)]

    @torch.no_grad()
    def generate(
        self, prompts: list[dict[str, Any]], sampling_params: SamplingParams | None = None, *, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        self._awake("generate")
        sp = sampling_params or SamplingParams()
        gen = torch.Generator().manual_seed(sp.seed if sp.seed is not None else int(torch.randint(0, 2**31, ())))
        stops = set(sp.stop_token_ids or [])
        outs = []
        for prompt in prompts:
            ids = list(prompt["prompt_token_ids"])
            out = RequestOutput(prompt_token_ids=ids)
            for index in range(sp.n):
                tokens: list[int] = []
                logprobs: list[dict[int, Logprob]] = []
                for _ in range(sp.max_tokens or 16):
                    logits = self.model.lm(torch.tensor([ids + tokens])).logits[0, -1].float()  # (V,)
                    if sp.temperature == 0:
                        lp = torch.log_softmax(logits, -1)
                        tok = int(lp.argmax())
                    else:
                        lp = torch.log_softmax(logits / sp.temperature, -1)
                        tok = int(torch.multinomial(lp.exp(), 1, generator=gen))
                    tokens.append(tok)
                    logprobs.append({tok: Logprob(float(lp[tok]))})
                    if tok in stops:
                        break
                out.outputs.append(CompletionOutput(index, tokens, logprobs if sp.logprobs is not None else None))
            outs.append(out)
        return outs
