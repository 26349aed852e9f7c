"""What a run would do, resolved from its config without loading a weight: ``queryrl train --dry-run``.

:func:`build_plan` reads only small files (the model's ``config.json``, parquet footers, JSONL lines;
the data rows themselves only under the built-in reward, :mod:`queryrl.trainer.row_checks`) and the
environment (whether the judge's key variable is set; never its value). It lists the backend and its
roles and resources, the model and its size, a memory estimate per GPU, the data, the reward (judge,
RAG endpoints) and the output folder, and the problems that would stop the run (a model or data file
that is not there, a row without the ground truth its reward compares against, a judge key that is not
set, user data scored by the embedded demo's RAG and judge). The CLI refuses to start a run whose plan
has problems, so they surface before anything is loaded or written.

Memory estimate (:func:`estimate_memory`), per GPU, in the parameters' dtype (``model.dtype``; torch's
AdamW keeps its two moments in the parameters' dtype):

- full fine-tuning: weights ``P*b`` + gradients ``P*b`` + AdamW moments ``2*P*b``, plus a frozen
  reference ``P*b`` when a KL term needs it;
- LoRA: the frozen base ``P*b`` + adapters, their gradients and moments in float32 (peft keeps
  adapters in float32 over a bf16/fp16 base: ``16*A`` bytes); the reference is the base with the
  adapters off (no copy);
- mixed precision (``model.dtype=float32 model.compute_dtype=bfloat16``): the parts above in float32
  (master weights, gradients, AdamW moments, the reference: 16 bytes per trained parameter), plus a
  bf16 compute copy ``2*P`` while a forward/backward runs (autocast's cast weights; under FSDP the
  gathered bf16 parameters of the single FSDP unit: not sharded); LoRA over a float32 base adds the
  same bf16 copy of the base;
- under FSDP (``trainer.backend=ray`` on GPUs, ``ray.fsdp``) everything above is sharded over the
  pool's workers; the vLLM engine (``rollout.backend=vllm``) holds a full copy of the weights in
  every worker (no tensor parallelism), in the parameters' dtype;
- not included: activations (they grow with micro-batch size x sequence length), vLLM's KV cache
  (up to its ``gpu_memory_utilization`` share of the GPU), FSDP's gathered layer during forward,
  the CUDA context and allocator fragmentation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from queryrl.algos import ADVANTAGE_ESTIMATORS
from queryrl.application import enabled_app
from queryrl.data.records import DataError
from queryrl.rewards.trl_style import describe_weighted
from queryrl.trainer.row_checks import row_problem

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# --- model size -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer (Llama/Qwen2/Qwen3 layout) that fix its parameter count."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2: yes; Qwen3, Llama: no)
    qk_norm: bool = False  # Qwen3's per-head RMSNorm on q and k

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelShape:
        """From a Hugging Face ``config.json`` (the Qwen2/Qwen3/Llama keys)."""
        model_type = str(config.get("model_type", ""))
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type.startswith("qwen3"),
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of one layer, by its module name."""
        h, q, kv, i = (
            self.hidden_size,
            self.num_attention_heads * self.head_dim,
            self.num_key_value_heads * self.head_dim,
            self.intermediate_size,
        )
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }


def count_parameters(shape: ModelShape) -> int:
    """The parameter count: embeddings, per layer (attention, MLP, norms), final norm, LM head."""
    layer = sum(a * b for a, b in shape.linear_shapes().values())
    if shape.attention_bias:
        layer += (shape.num_attention_heads + 2 * shape.num_key_value_heads) * shape.head_dim
    layer += 2 * shape.hidden_size  # input and post-attention RMSNorm
    if shape.qk_norm:
        layer += 2 * shape.head_dim
    embed = shape.vocab_size * shape.hidden_size
    head = 0 if shape.tie_word_embeddings else embed
    return embed + shape.num_hidden_layers * layer + shape.hidden_size + head


def count_lora_parameters(shape: ModelShape, rank: int, target_modules: list[str]) -> int:
    """LoRA's A (r x in) and B (out x r) for every targeted projection of every layer."""
    shapes = shape.linear_shapes()
    per_layer = sum(rank * (shapes[m][0] + shapes[m][1]) for m in target_modules if m in shapes)
    return shape.num_hidden_layers * per_layer


# --- memory ---------------------------------------------------------------------------------------


@dataclass
class MemoryEstimate:
    """Bytes per GPU by what holds them (see the module doc for what is left out)."""

    parts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def estimate_memory(
    params: int,
    dtype: str,
    *,
    compute_dtype: str | None = None,
    shards: int = 1,
    lora_params: int = 0,
    need_ref: bool = False,
    critic_params: int = 0,
    vllm: bool = False,
) -> MemoryEstimate:
    """Per-GPU bytes of weights, gradients, AdamW moments, reference, critic and vLLM weights.

    Args:
        params: the policy's parameter count ``P``.
        dtype: ``model.dtype`` (bytes ``b`` per parameter).
        compute_dtype: ``model.compute_dtype``; another dtype than `dtype` = mixed precision (a compute copy).
        shards: FSDP ranks the trained (and reference) modules are sharded over; 1 = not sharded.
        lora_params: LoRA adapter parameters ``A`` (0 = full fine-tuning).
        need_ref: a frozen reference is kept (KL loss or KL in reward).
        critic_params: the critic's parameter count (GAE), trained in full like the policy.
        vllm: a vLLM engine holds its own full copy of the weights on the GPU.
    """
    b = DTYPE_BYTES[dtype]
    mixed = compute_dtype is not None and compute_dtype != dtype
    tag = f" ({dtype})" if mixed else ""  # which copy is which, when there are two dtypes
    parts: dict[str, int] = {}
    if lora_params:
        parts[f"weights (frozen base{', ' + dtype if mixed else ''})"] = params * b // shards
        parts["LoRA adapters + grads + AdamW (fp32)"] = 16 * lora_params // shards
    else:
        parts[f"{'master ' if mixed else ''}weights{tag}"] = params * b // shards
        parts[f"gradients{tag}"] = params * b // shards
        parts[f"AdamW moments{tag}"] = 2 * params * b // shards
        if need_ref:
            parts[f"reference{tag}"] = params * b // shards
    if mixed:
        assert compute_dtype is not None
        parts[f"{compute_dtype} compute copy (forward/backward)"] = params * DTYPE_BYTES[compute_dtype]
    if critic_params:
        parts["critic (weights + grads + AdamW)"] = 4 * critic_params * b // shards
    if vllm:
        parts["vLLM weights"] = params * b
    return MemoryEstimate(parts)


# --- the plan -------------------------------------------------------------------------------------


@dataclass
class Plan:
    """Sections of ``(title, lines)`` to print, and the problems that would stop the run."""

    command: str
    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, title: str, *lines: str) -> None:
        self.sections.append((title, list(lines)))

    def render(self) -> str:
        out = [f"queryrl {self.command} --dry-run: the resolved plan (no weights loaded, nothing written)"]
        for title, lines in self.sections:
            out.append(f"{title:<12} {lines[0] if lines else ''}")
            out += [f"{'':<12} {line}" for line in lines[1:]]
        if self.problems:
            out.append(f"problems     {len(self.problems)}: the run would stop")
            out += [f"  - {p}" for p in self.problems]
        else:
            out.append("problems     none: the plan is valid")
        return "\n".join(out)


def build_plan(cfg: DictConfig, command: str = "train") -> Plan:
    """The plan of ``queryrl <command>`` (``train`` or ``sft``) for the resolved `cfg`."""
    plan = Plan(command)
    shards = _resources(cfg, plan, command)
    _gpu_stack(cfg, plan, command)
    shape = _model(cfg, plan)
    if shape is not None:
        _memory(cfg, plan, shape, shards, command)
    if command == "sft":
        _data(cfg, plan, list(cfg.sft.train_files) or list(cfg.data.train_files), "train")
        _data(cfg, plan, list(cfg.sft.val_files) or list(cfg.data.val_files), "val")
    else:
        _data(cfg, plan, list(cfg.data.train_files), "train")
        _data(cfg, plan, list(cfg.data.val_files), "val")
        _reward(cfg, plan)
        problem = row_problem(cfg)  # a row the built-in reward would score against "None"
        if problem:
            plan.problems.append(problem)
    _output(cfg, plan, command)
    return plan


def _resources(cfg: DictConfig, plan: Plan, command: str) -> int:
    """The backend, roles and pools; returns the FSDP shard count of the actor's modules."""
    t, rc = cfg.trainer, cfg.ray
    need_ref = bool(cfg.actor.use_kl_loss or cfg.algo.use_kl_in_reward)
    critic = "values" in ADVANTAGE_ESTIMATORS.needs(cfg.algo.adv_estimator)
    if command == "sft" or t.backend == "local":
        where = f"trainer.device={t.device}" + (f", reference on {t.ref_device}" if t.ref_device and need_ref else "")
        plan.add("backend", f"local: one process on one device ({where})")
        roles = ["actor + rollout"] + (["reference"] if need_ref and command != "sft" else [])
        roles += ["critic"] if critic and command != "sft" else []
        plan.add(
            "roles", ", ".join(roles) + " in that process" + (" (SFT: the policy only)" if command == "sft" else "")
        )
        return 1
    world = t.nnodes * t.n_gpus_per_node
    plan.add(
        "backend",
        f"ray: {t.nnodes} node(s) x {t.n_gpus_per_node} worker(s) per node = {world} actor workers, one GPU each "
        f"where the cluster has GPUs (ray.use_gpu={rc.use_gpu}), else {rc.num_cpus_per_worker} CPU(s) each",
        f"cluster: {'a new local one' if not rc.address else rc.address}; FSDP on GPUs: {rc.fsdp}, "
        f"on CPU workers: {bool(rc.fsdp and rc.fsdp_on_cpu)} (ray.fsdp_on_cpu)",
    )
    ref = "none (no KL term)"
    if need_ref:
        ref = f"own pool of {rc.ref_workers} worker(s)" if rc.ref_workers else "colocated in the actor workers"
    crit = "none"
    if critic:
        crit = f"own pool of {rc.critic_workers} worker(s)" if rc.critic_workers else "colocated in the actor workers"
    gen = "in every actor worker" if rc.rollout == "workers" else f"in the driver on trainer.device={t.device}"
    plan.add(
        "roles",
        f"actor: {world} workers; rollout ({cfg.rollout.backend}) {gen}",
        f"reference: {ref}; critic: {crit}",
        f"driver: a mirror of the policy on trainer.device={t.device} (for checkpoints)",
    )
    # sharded: on GPUs with ray.fsdp (unless ray.use_gpu=false), on CPU workers only with ray.fsdp_on_cpu too
    on_gpu = str(rc.use_gpu).lower() != "false"
    return world if rc.fsdp and (on_gpu or rc.fsdp_on_cpu) else 1


def wants_gpu(cfg: DictConfig, command: str) -> bool:
    """Whether the run asks for GPUs by its settings (not by what this machine has): a ``cuda`` device, Ray
    workers with ``ray.use_gpu=true``, or vLLM rollouts."""
    if str(cfg.trainer.device).startswith("cuda"):
        return True
    if command == "sft":
        return False
    ray_gpu = cfg.trainer.backend == "ray" and str(cfg.ray.use_gpu).lower() == "true"
    return ray_gpu or cfg.rollout.backend == "vllm"


def _gpu_stack(cfg: DictConfig, plan: Plan, command: str) -> None:
    """The installed stack a GPU run needs, checked without importing it: a CUDA build of torch, Ray for
    ``trainer.backend=ray``, vLLM in the supported range for ``rollout.backend=vllm`` (and its in-process engine)."""
    import importlib.metadata
    import importlib.util

    import torch

    if not wants_gpu(cfg, command):
        return
    lines: list[str] = []
    cuda = torch.version.cuda
    lines.append(f"torch {torch.__version__} " + (f"(CUDA {cuda} build)" if cuda else "(a CPU build)"))
    if not cuda:
        plan.problems.append(
            f"torch {torch.__version__} is a CPU build and this run asks for GPUs: install the GPU stack "
            "(pip install 'queryrl[gpu]' in a fresh environment; docs/gpus.md, GPU set-up)"
        )
    if command == "train" and cfg.trainer.backend == "ray":
        found = importlib.util.find_spec("ray") is not None
        lines.append(f"ray {importlib.metadata.version('ray') if found else 'not installed'}")
        if not found:
            plan.problems.append("trainer.backend=ray needs Ray: pip install 'queryrl[gpu]' (or 'queryrl[ray]')")
    if command == "train" and cfg.rollout.backend == "vllm":
        from queryrl.rollout.vllm import (
            SUPPORTED_VLLM,
            config_engine,
            engine_kwargs,
            multiprocessing_problem,
            vllm_version_problem,
        )

        try:
            version: str | None = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = None
        lines.append(f"vllm {version or 'not installed'} (supported: {','.join(SUPPORTED_VLLM)})")
        if version is None:
            plan.problems.append("rollout.backend=vllm needs vLLM: pip install 'queryrl[gpu]' (or 'queryrl[vllm]')")
        elif (problem := vllm_version_problem(version)) is not None:
            plan.problems.append(problem)
        if (problem := multiprocessing_problem()) is not None:
            plan.problems.append(problem)
        engine = engine_kwargs(config_engine(cfg.rollout))  # what vllm.LLM gets besides model, dtype, sleep mode
        lines.append("vllm engine: " + ", ".join(f"{k}={v}" for k, v in engine.items()))
    plan.add("gpu stack", *lines)


def _model(cfg: DictConfig, plan: Plan) -> ModelShape | None:
    m = cfg.model
    if not m.path:
        tiny = m.tiny
        shape = ModelShape(
            vocab_size=tiny.vocab_size,
            hidden_size=tiny.hidden_size,
            intermediate_size=tiny.intermediate_size,
            num_hidden_layers=tiny.num_hidden_layers,
            num_attention_heads=tiny.num_attention_heads,
            num_key_value_heads=tiny.num_key_value_heads,
            head_dim=tiny.hidden_size // tiny.num_attention_heads,
            tie_word_embeddings=True,
            attention_bias=True,
        )
        plan.add("model", "the built-in tiny Qwen2 (built in code into the cache on first use)", _size(shape, m))
        return shape
    config_json = Path(m.path).expanduser() / "config.json"
    if not config_json.is_file():
        plan.add("model", f"{m.path}: not found locally (no config.json); queryrl never downloads a model")
        plan.problems.append(
            f"model.path={m.path!r} is not a local Hugging Face model folder: download it first "
            "(e.g. huggingface-cli download Qwen/Qwen3-8B --local-dir DIR) and give model.path=DIR"
        )
        return None
    try:
        config = json.loads(config_json.read_text())
        shape = ModelShape.from_hf_config(config)
    except (ValueError, KeyError, TypeError) as exc:
        plan.add("model", f"{m.path}: config.json found but not understood ({type(exc).__name__}: {exc})")
        return None
    arch = ",".join(config.get("architectures") or [str(config.get("model_type", "?"))])
    plan.add("model", f"{m.path} ({arch}, found locally; weights are loaded at start)", _size(shape, m))
    return shape


def _size(shape: ModelShape, m: Any) -> str:
    p = count_parameters(shape)
    count = f"{p / 1e9:.3f} B" if p >= 1e8 else f"{p / 1e6:.2f} M"
    text = (
        f"{count} parameters (estimate from the config: {shape.num_hidden_layers} layers, hidden "
        f"{shape.hidden_size}, vocab {shape.vocab_size}), dtype {m.dtype}"
    )
    if m.compute_dtype and m.compute_dtype != m.dtype:
        text += f", compute {m.compute_dtype} (mixed precision: {m.dtype} master weights and AdamW state)"
    if m.lora.rank:
        a = count_lora_parameters(shape, m.lora.rank, list(m.lora.target_modules))
        text += f"; LoRA rank {m.lora.rank}: {a / 1e6:.1f} M trainable"
    return text


def _memory(cfg: DictConfig, plan: Plan, shape: ModelShape, shards: int, command: str) -> None:
    m = cfg.model
    p = count_parameters(shape)
    lora = count_lora_parameters(shape, m.lora.rank, list(m.lora.target_modules)) if m.lora.rank else 0
    train = command == "train"
    need_ref = train and bool(cfg.actor.use_kl_loss or cfg.algo.use_kl_in_reward)
    own_ref = train and cfg.trainer.backend == "ray" and cfg.ray.ref_workers > 0
    critic = p - (0 if shape.tie_word_embeddings else shape.vocab_size * shape.hidden_size)
    has_critic = "values" in ADVANTAGE_ESTIMATORS.needs(cfg.algo.adv_estimator)
    critic_here = train and has_critic and not (cfg.trainer.backend == "ray" and cfg.ray.critic_workers)
    est = estimate_memory(
        p,
        m.dtype,
        compute_dtype=m.compute_dtype,
        shards=shards,
        lora_params=lora,
        need_ref=need_ref and not own_ref,
        critic_params=critic if critic_here else 0,
        vllm=train and cfg.rollout.backend == "vllm",
    )
    parts = ", ".join(f"{k} {_gib(v)}" for k, v in est.parts.items())
    where = "per actor worker" if train and cfg.trainer.backend == "ray" else "on the device"
    plan.add(
        "memory/GPU",
        f"~{_gib(est.total)} {where} (estimate: {parts}"
        + (f"; sharded over {shards} FSDP ranks" if shards > 1 else "")
        + ")",
        "excludes activations, vLLM's KV cache, "
        + ("" if m.compute_dtype and m.compute_dtype != m.dtype else "FSDP's gathered layer, ")
        + "the CUDA context and fragmentation",
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB // 10 else f"{n / 1024**2:.1f} MiB"


def _data(cfg: DictConfig, plan: Plan, files: list[str], split: str) -> None:
    if not files:
        plan.add(f"data/{split}", "none")
        return
    lines = []
    for f in files:
        if str(f).startswith("builtin://"):
            lines.append(f"{f}: built in (generated in code)")
            continue
        path = Path(f).expanduser()
        if not path.exists():
            lines.append(f"{f}: NOT FOUND")
            plan.problems.append(f"data.{split}_files: {f} does not exist")
            continue
        rows = _count_rows(path)
        lines.append(f"{f}: exists" + (f", {rows} rows" if rows is not None else ""))
    plan.add(f"data/{split}", *lines)


def _count_rows(path: Path) -> int | None:
    """The rows of a data file, for the plan; a file that cannot be read is a :class:`DataError` naming it (the
    loader names the line of a JSON-lines file that is not UTF-8 or not JSON)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return int(pq.read_metadata(path).num_rows)
        except Exception as exc:  # pyarrow's ArrowInvalid / OSError: truncated, or not parquet at all
            raise DataError(f"{path}: cannot read parquet file: {exc}") from None
    if path.suffix in (".jsonl", ".json") and path.is_file():
        with path.open("rb") as f:  # bytes: the loader reports undecodable lines with their number
            return sum(1 for line in f if line.strip())
    return None


def _reward(cfg: DictConfig, plan: Plan) -> None:
    r = cfg.reward
    app = enabled_app(cfg)
    spec = app.reward_plan(cfg) if app is not None else None  # builds nothing: --dry-run writes nothing
    manager = r.manager if r.manager != "auto" else (spec[1] if spec is not None else "naive")
    if spec is None:
        if r.functions:
            fn = "functions " + describe_weighted([(f.weight, f"{f.path}:{f.name}") for f in r.functions])
        else:
            one = f"{r.function.path}:{r.function.name}" if r.function.path else "built-in scorers by data_source"
            fn = f"function {one}"
        plan.add("reward", f"{fn}, manager {manager}")
    else:
        plan.add("reward", f"{spec[0]}, manager {manager} (at most {r.max_concurrency} in flight)")
    if app is not None:
        app.plan(cfg, plan.add, plan.problems.append)


def _output(cfg: DictConfig, plan: Plan, command: str) -> None:
    if command == "sft":
        from queryrl.trainer.sft import default_output_dir

        out = default_output_dir(cfg)
        plan.add("output", f"{out} ({'exists: replaced when done' if out.exists() else 'new'})")
        return
    run = Path(cfg.trainer.output_dir) / cfg.trainer.experiment_name
    resume = cfg.trainer.resume == "auto" and (run / "checkpoints").is_dir()
    state = "exists; resumes from its last checkpoint" if resume else ("exists" if run.exists() else "new")
    plan.add("output", f"{run} ({state})")
