"""Rollout with vLLM (``rollout.backend=vllm``): imported lazily, on a GPU (or a vLLM CPU build).

Supported: vLLM 0.32.x (:data:`SUPPORTED_VLLM`), the release line whose torch pin is this
project's (``torch==2.13.0``; vLLM 0.33 needs torch 2.14). ``pip install 'queryrl[vllm]'`` installs
it. On CPU machines its API surface is tested against a stand-in that mimics it
(``tests/rollout/fake_vllm``); the real engine runs only in the tests marked ``gpu``.

Same contract as :class:`~queryrl.rollout.hf.HFRollout` (prompt-major rows, absolute
``prompt_index``, response mask up to and including the first EOS, rollout log-probs of the
sampled tokens). vLLM returns log-probs of the *processed* distribution (``logprobs_mode=
processed_logprobs``: after temperature, and after top-k/top-p when those are on); with
top-k and top-p off they are ``log_softmax(logits / temperature)``, the HF backend's values.

Colocated with training on the same GPU, the engine sleeps between rollouts (level 1: weights
offloaded to CPU memory, KV cache freed) and wakes to generate or to take new weights.

Weights. :meth:`VLLMRollout.update_weights` hands the engine the trainer's weights as
:func:`queryrl.rollout.sync.rollout_weights` yields them: plain full tensors of the merged model
(LoRA added in as new tensors, FSDP2 shards gathered one tensor at a time), which the model's own
``load_weights`` copies into its parameters; the trainer's parameters are never touched. The
copy runs through ``LLM.apply_model``, which calls the function on the model in this process only
with the in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here when unset). The
multiprocess engine (``VLLM_ENABLE_V1_MULTIPROCESSING=1``) would have to pickle the function and
every tensor to the engine's process (vLLM asks for ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``), and
is refused with a message naming the variable. After a copy the prefix cache is reset: its blocks
hold keys and values the old weights computed.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from queryrl.rollout.base import RolloutOutput, SamplingParams, check_prompts, left_pad
from queryrl.rollout.sync import rollout_weights

SUPPORTED_VLLM = (">=0.32", "<0.33")
"""The vLLM versions this backend is written and tested for (its API surface in tests/rollout/fake_vllm)."""

MULTIPROCESSING_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"


def vllm_version_problem(version: str) -> str | None:
    """Why vLLM `version` is outside :data:`SUPPORTED_VLLM` (None: inside)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    spec = SpecifierSet(",".join(SUPPORTED_VLLM))
    try:
        ok = Version(version) in spec
    except InvalidVersion:
        ok = False
    if ok:
        return None
    return f"vLLM {version} is installed; queryrl's vllm backend supports vLLM {spec} (pip install 'queryrl[vllm]')"


def multiprocessing_problem() -> str | None:
    """Why the environment asks for an engine this backend cannot load weights into (None: it does not)."""
    value = os.environ.get(MULTIPROCESSING_VAR)
    if value is None or value.strip() in ("", "0"):
        return None
    return (
        f"{MULTIPROCESSING_VAR}={value} runs vLLM's engine in another process, and queryrl loads the trainer's "
        f"weights into an in-process engine only (LLM.apply_model on the model itself): unset it or set "
        f"{MULTIPROCESSING_VAR}=0"
    )


def _require_vllm() -> Any:
    """vLLM, imported, in the supported range, able to run here, with the in-process engine selected."""
    problem = multiprocessing_problem()
    if problem is not None:
        raise RuntimeError(problem)
    no_gpu = "rollout.backend='vllm' needs a CUDA GPU and none is visible; use rollout.backend='hf'"
    try:
        import vllm
    except ImportError as e:
        if not torch.cuda.is_available():
            raise RuntimeError(no_gpu) from e
        raise ImportError(
            "rollout.backend='vllm' needs vLLM: pip install 'queryrl[vllm]' (a CUDA build); or use rollout.backend='hf'"
        ) from e
    problem = vllm_version_problem(str(getattr(vllm, "__version__", "?")))
    if problem is not None:
        raise RuntimeError(problem)
    from vllm.platforms import current_platform

    if not torch.cuda.is_available() and current_platform.device_type != "cpu":  # a vLLM CPU build runs here
        raise RuntimeError(no_gpu)
    os.environ[MULTIPROCESSING_VAR] = "0"  # the engine in this process: apply_model reaches the model itself
    return vllm


# vllm.LLM keywords queryrl sets itself (rollout.vllm.extra may not): what it needs to load the trainer's weights
RESERVED_ENGINE_KEYS = {
    "model": "the policy's folder",
    "dtype": "the policy's compute dtype",
    "enable_sleep_mode": "the engine sleeps between rollouts",
    "logprobs_mode": "log-probs of the processed distribution",
    "tensor_parallel_size": "the in-process engine runs on one GPU (queryrl has no tensor parallelism)",
}
ENGINE_OPTIONS = ("gpu_memory_utilization", "max_num_seqs", "max_model_len", "enforce_eager", "enable_prefix_caching")


def engine_kwargs(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``rollout.vllm`` as ``vllm.LLM`` keyword arguments: the typed options that are set (null: vLLM's
    default), then ``extra`` as given; None: none.

    Raises:
        ValueError: an option out of range (``0 < gpu_memory_utilization <= 1``, ``max_num_seqs`` and
            ``max_model_len`` >= 1), or an ``extra`` key that is a typed option or one queryrl sets itself.
    """
    options = dict(options or {})
    extra = dict(options.pop("extra", None) or {})
    unknown = sorted(set(options) - set(ENGINE_OPTIONS))
    if unknown:
        raise ValueError(f"rollout.vllm has no option {', '.join(unknown)} (put other vllm.LLM keywords in extra)")
    gmu = options.get("gpu_memory_utilization")
    if gmu is not None and not 0.0 < float(gmu) <= 1.0:
        raise ValueError(f"rollout.vllm.gpu_memory_utilization must be in (0, 1] (a share of the GPU), got {gmu}")
    for name in ("max_num_seqs", "max_model_len"):
        if options.get(name) is not None and int(options[name]) < 1:
            raise ValueError(f"rollout.vllm.{name} must be >= 1 or null (vLLM's default), got {options[name]}")
    for key in extra:
        if key in RESERVED_ENGINE_KEYS:
            raise ValueError(f"rollout.vllm.extra.{key}: queryrl sets it itself ({RESERVED_ENGINE_KEYS[key]})")
        if key in ENGINE_OPTIONS:
            raise ValueError(f"rollout.vllm.extra.{key}: set rollout.vllm.{key} instead")
    return {k: v for k, v in options.items() if v is not None} | extra


def config_engine(rollout: Any) -> dict[str, Any] | None:
    """The ``rollout`` config node's engine options for :func:`~queryrl.rollout.base.make_rollout`: its
    ``vllm`` node as plain data with ``backend=vllm``; ``{"decode_graph": ..., "quantize": ...}`` with
    ``backend=hf`` (the hf fast path's CUDA graph, ``rollout.decode_graph``; int8 base layers,
    ``rollout.quantize``); else None."""
    if rollout.backend == "hf":
        return {
            "decode_graph": str(rollout.get("decode_graph", "off")),
            "quantize": str(rollout.get("quantize", "none")),
        }
    if rollout.backend != "vllm":
        return None
    from omegaconf import OmegaConf

    node = rollout.get("vllm")  # a partial config (a test's) may lack the node: the defaults
    if node is None:
        return {}
    return dict(OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node)  # type: ignore[arg-type]


def model_path(model: nn.Module) -> Path:
    """The Hugging Face folder `model` (or a peft model's base) was loaded from."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    name = getattr(getattr(base, "config", None), "_name_or_path", "") or getattr(base, "name_or_path", "")
    if not name or not Path(name).exists():
        raise ValueError(f"cannot find the folder the policy was loaded from (got {name!r}); vLLM loads from a folder")
    return Path(name)


def engine_dtype(model: nn.Module) -> torch.dtype:
    """The dtype the engine computes in: `model`'s compute dtype (mixed precision), else its base weights' dtype."""
    from queryrl.models.loading import compute_dtype

    dtype = compute_dtype(model)
    if dtype is not None:
        return dtype
    for param in model.parameters():
        if param.is_floating_point() and not param.requires_grad:
            return param.dtype  # LoRA: the frozen base (the adapters may be float32 over it)
    return next(model.parameters()).dtype


class VLLMRollout:
    """The ``vllm`` rollout backend (see the module docstring).

    Args:
        model: the trainer's policy (its folder is what vLLM loads first; its weights replace the folder's).
        tokenizer: gives ``pad_token_id`` and ``eos_token_id``.
        micro_batch_size: prompts per chunk of :meth:`generate_chunks` (vLLM batches internally).
        device: unused (vLLM places itself); accepted for the registry signature.
        gpu_memory_utilization: the GPU memory fraction vLLM may take (the trainer shares the GPU), unless
            `engine_options` sets it.
        sleep_between_rollouts: offload the engine while the trainer trains (colocated).
        dtype: the engine's dtype (None: :func:`engine_dtype` of `model`; FSDP's mixed precision passes its
            compute dtype, which the sharded module no longer records).
        engine_options: ``rollout.vllm`` (:func:`engine_kwargs`): more ``vllm.LLM`` keywords.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        micro_batch_size: int = 64,
        device: torch.device | None = None,
        gpu_memory_utilization: float = 0.4,
        sleep_between_rollouts: bool = True,
        dtype: torch.dtype | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        engine = {"gpu_memory_utilization": gpu_memory_utilization} | engine_kwargs(engine_options)
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad token and an eos token")
        vllm = _require_vllm()
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.micro_batch_size = micro_batch_size
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.dtype = dtype or engine_dtype(model)
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        if self.dtype not in names:
            raise ValueError(f"vLLM runs in float32, bfloat16 or float16, not {self.dtype}")
        self.llm = vllm.LLM(
            model=str(model_path(model)),
            dtype=names[self.dtype],
            enable_sleep_mode=sleep_between_rollouts,
            logprobs_mode="processed_logprobs",
            **engine,
        )
        self.sleep_between_rollouts = sleep_between_rollouts
        self.asleep = False
        self.update_weights(model)  # the trainer's weights (LoRA merged), not the folder's

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
            top_k=params.top_k if params.do_sample and params.top_k > 0 else 0,  # 0: off (vLLM >= 0.32)
            # vLLM's sampler has its own RNG: a seed drawn from torch's makes a seeded run sample the same tokens
            seed=int(torch.randint(0, 2**31 - 1, ()).item()) if params.do_sample else None,
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
        """Load `source`'s weights into the engine (see the module docstring), waking it for the copy.

        Under FSDP2 a collective: every rank's engine must take its policy's weights at the same time.
        A parameter of the engine's model that the copy did not reach is reported (a rename between the
        trainer's model and vLLM's, or an unsupported vLLM version): it would keep the folder's values.
        """
        dtype = self.dtype

        def load(model: nn.Module) -> list[str]:
            loaded = model.load_weights(rollout_weights(source, dtype))  # type: ignore[operator]
            if loaded is None:  # a model whose loader reports nothing
                return []
            return sorted({n for n, _ in model.named_parameters()} - set(loaded))

        self._wake()
        try:
            missed = [name for per_worker in self.llm.apply_model(load) for name in per_worker]
            self.llm.reset_prefix_cache()  # cached keys and values were computed by the old weights
        finally:
            self._sleep()
        if missed:
            warnings.warn(
                f"vLLM's model has {len(missed)} parameters the weight sync did not load (they keep the model "
                f"folder's values): {', '.join(missed[:5])}",
                stacklevel=2,
            )


def make_vllm_rollout(
    model: nn.Module,
    tokenizer: Any,
    micro_batch_size: int,
    device: torch.device | None,
    fast_decode: str,
    dtype: torch.dtype | None,
    engine: Mapping[str, Any] | None = None,
) -> VLLMRollout:
    """``rollout.backend=vllm`` (:data:`queryrl.rollout.base.ROLLOUT_BACKENDS`); `engine`: ``rollout.vllm``."""
    return VLLMRollout(
        model, tokenizer, micro_batch_size=micro_batch_size, device=device, dtype=dtype, engine_options=engine
    )
