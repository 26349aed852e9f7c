"""Loading the policy, its reference and the critic from a Hugging Face causal-LM folder.

The reference policy is a frozen copy; with LoRA it is the same model with its adapters
disabled (no second copy). The critic is a causal-LM backbone with a scalar value head.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from queryrl.models.tiny import build_tiny_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the module attribute that carries a model's compute dtype (see set_compute_dtype)
_COMPUTE_DTYPE_ATTR = "queryrl_compute_dtype"


def set_compute_dtype(module: nn.Module, dtype: torch.dtype | None) -> None:
    """Run `module`'s forward passes in `dtype` under :func:`compute_autocast` (None = its parameters' dtype).

    Mixed precision (``model.dtype=float32 model.compute_dtype=bfloat16``): the parameters stay float32
    (the master weights AdamW updates, with float32 gradients and moments) and the forward/backward
    matmuls run in bfloat16 under ``torch.autocast``, which casts each weight as it is used (and keeps
    that cast for the rest of the autocast region). Autocast rather than a bf16 copy of the module:
    one set of parameters, so the optimizer, checkpoints, LoRA, the Ray workers' state transfer and
    the rollout's in-place view of the weights work unchanged, on CPU as on GPU.
    """
    object.__setattr__(module, _COMPUTE_DTYPE_ATTR, dtype)  # a plain attribute, not a buffer or a config key


def compute_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype `module` computes in when it differs from its parameters' (see :func:`set_compute_dtype`)."""
    dtype: torch.dtype | None = getattr(module, _COMPUTE_DTYPE_ATTR, None)
    return dtype


def compute_autocast(module: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` to `module`'s compute dtype, or a no-op when it has none.

    Wrap the forward only: the backward of an autocast forward runs each op in the dtype of its
    forward, and the gradients reach the float32 parameters in float32.
    """
    dtype = compute_dtype(module)
    if dtype is None:
        return contextlib.nullcontext()
    device = next(module.parameters()).device
    return torch.autocast(device.type, dtype=dtype)


def store_frozen_in_compute_dtype(model: nn.Module, dtype: torch.dtype) -> None:
    """Store `model`'s frozen ``nn.Linear`` weights and biases (LoRA's base layers, untargeted projections,
    an untied ``lm_head``) in `dtype`.

    Under autocast every ``F.linear`` casts its weight to the compute dtype on each forward; a frozen weight
    stored in that dtype already is used as it is, so the numbers are the same, bit for bit, without the
    per-forward cast or its float32 copy. The trained parameters (LoRA's A and B, and with them their
    gradients and AdamW moments), the embeddings (a lookup that autocast does not cast) and the norms stay in
    their dtype.

    A frozen ``lm_head`` tied to the frozen input embeddings gets a copy of its own in `dtype` (the embeddings
    keep theirs): autocast would otherwise cast the whole (vocabulary, hidden) matrix on every forward (282 ms a
    call for Qwen2-0.5B's 151,936 x 896 on a 2-core EPYC in bf16, experiments/logs/trl_vs_queryrl_real.md). The
    copy costs its size in `dtype`. A trained embedding stays tied: the head must follow its updates.
    """
    embed = getattr(model, "get_input_embeddings")() if hasattr(model, "get_input_embeddings") else None  # noqa: B009
    tied = {id(p) for p in embed.parameters()} if isinstance(embed, nn.Module) else set()
    for module in model.modules():
        if type(module) is not nn.Linear:
            continue
        for name, param in list(module.named_parameters(recurse=False)):
            if not (param.requires_grad or id(param) in tied or param.dtype == dtype):
                setattr(module, name, nn.Parameter(param.detach().to(dtype), requires_grad=False))
    head = getattr(model, "get_output_embeddings")() if hasattr(model, "get_output_embeddings") else None  # noqa: B009
    if type(head) is nn.Linear and id(head.weight) in tied and not head.weight.requires_grad:
        head.weight = nn.Parameter(head.weight.detach().to(dtype), requires_grad=False)


def model_compute_dtype(model_cfg: Any) -> torch.dtype | None:
    """``model.compute_dtype`` when it differs from ``model.dtype`` (mixed precision), else None."""
    name = getattr(model_cfg, "compute_dtype", None)
    return DTYPES[name] if name and name != model_cfg.dtype else None


def _quiet_transformers() -> None:
    """No progress bars or advisory warnings from transformers in our logs."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def resolve_model_path(model_cfg: Any) -> Path:
    """``model.path``, or the built-in tiny model's folder (built on first use)."""
    if model_cfg.path:
        path = Path(model_cfg.path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path={model_cfg.path!r} is not a Hugging Face model folder (no config.json)"
            )
        return path
    return build_tiny_model(model_cfg.tiny, model_cfg.cache_dir)


def load_tokenizer(model_cfg: Any) -> Any:
    """The tokenizer, left-padding (for batched generation), with a pad token."""
    from transformers import AutoTokenizer

    _quiet_transformers()
    path = Path(model_cfg.tokenizer_path) if model_cfg.tokenizer_path else resolve_model_path(model_cfg)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_causal_lm(path: Path, model_cfg: Any, device: torch.device) -> nn.Module:
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[model_cfg.dtype], trust_remote_code=model_cfg.trust_remote_code
    )
    module: nn.Module = model
    return module.to(device)


@dataclass
class PolicyBundle:
    """The trainable policy, its tokenizer and its frozen reference.

    Attributes:
        model: the policy (a peft model when LoRA is on).
        tokenizer: left-padding tokenizer.
        ref_model: the frozen reference copy; ``None`` with LoRA (adapters are disabled instead)
            or when no reference is needed.
        lora: whether the policy carries LoRA adapters.
        path: the folder the weights came from.
    """

    model: nn.Module
    tokenizer: Any
    ref_model: nn.Module | None
    lora: bool
    path: Path

    @contextlib.contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The reference policy to run a forward pass with, inside this context."""
        if self.lora:
            with self.model.disable_adapter():  # type: ignore[operator]
                yield self.model
        elif self.ref_model is not None:
            yield self.ref_model
        else:
            raise RuntimeError("this policy was loaded without a reference model")


def load_policy(
    model_cfg: Any,
    device: torch.device,
    ref_device: torch.device | None,
    need_ref: bool,
    frozen_in_compute_dtype: bool = False,
) -> PolicyBundle:
    """Load the policy (with LoRA and gradient checkpointing as configured) and its reference.

    With `frozen_in_compute_dtype`, mixed precision and LoRA, the frozen base weights are stored in the
    compute dtype (:func:`store_frozen_in_compute_dtype`): for training only, never for a merge (export,
    SFT's merged output), which must add the adapters to the float32 base."""
    path = resolve_model_path(model_cfg)
    tokenizer = load_tokenizer(model_cfg)
    model = _load_causal_lm(path, model_cfg, device)
    lora = model_cfg.lora.rank > 0
    ref_model = None
    if need_ref and not lora:
        ref_model = copy.deepcopy(model).to(ref_device or device).eval().requires_grad_(False)
    if model_cfg.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]
        model.config.use_cache = False  # type: ignore[union-attr]
    if lora:
        from peft import LoraConfig, get_peft_model

        peft_cfg = LoraConfig(
            r=model_cfg.lora.rank,
            lora_alpha=model_cfg.lora.alpha,
            lora_dropout=model_cfg.lora.dropout,
            target_modules=list(model_cfg.lora.target_modules),
            task_type="CAUSAL_LM",
        )
        if model_cfg.gradient_checkpointing:
            model.enable_input_require_grads()  # type: ignore[operator]
        model = get_peft_model(model, peft_cfg)
    # the reference is a float32 copy under the same autocast: at step 0 it computes exactly what the
    # policy computes (a bf16 copy would differ by rounding, a KL that is not there)
    dtype = model_compute_dtype(model_cfg)
    for module in (model, ref_model):
        if module is not None:
            set_compute_dtype(module, dtype)
    if frozen_in_compute_dtype and lora and dtype is not None:
        store_frozen_in_compute_dtype(model, dtype)
    return PolicyBundle(model=model, tokenizer=tokenizer, ref_model=ref_model, lora=lora, path=path)


class ValueModel(nn.Module):
    """A critic: a causal-LM backbone and a linear value head, one value per position.

    ``forward(input_ids, attention_mask, position_ids) -> (N, L)`` values.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=1.0 / (hidden_size + 1))
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, path: Path, model_cfg: Any, device: torch.device) -> ValueModel:
        from transformers import AutoModel

        _quiet_transformers()
        backbone = AutoModel.from_pretrained(
            path, dtype=DTYPES[model_cfg.dtype], trust_remote_code=model_cfg.trust_remote_code
        )
        critic = cls(backbone, backbone.config.hidden_size)
        head = path / "value_head.pt"
        if head.is_file():
            critic.value_head.load_state_dict(torch.load(head, map_location="cpu", weights_only=True))
        set_compute_dtype(critic, model_compute_dtype(model_cfg))
        return critic.to(device)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (N, L, H)
        values: Tensor = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)  # (N, L)
        return values

    def save_pretrained(self, out: Path) -> None:
        self.backbone.save_pretrained(out)  # type: ignore[operator]
        torch.save(self.value_head.state_dict(), out / "value_head.pt")
