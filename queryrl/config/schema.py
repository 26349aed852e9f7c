"""The core config schema: structured dataclasses named by meaning, one per node.

An application adds its own node under ``app.<name>`` (see :mod:`queryrl.application`);
:func:`build_schema` merges the installed applications' nodes into the schema at load time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict


class ConfigError(ValueError):
    """A config file or override that does not fit the schema; the message names the key."""


@dataclass
class TinyModelConfig:
    """The built-in tiny Qwen2-architecture model, used when ``model.path`` is empty."""

    vocab_size: int = 512  # the tiny model's size and the tokenizer trained for it
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    seed: int = 0  # the random initial weights' seed
    corpus: list[str] = field(default_factory=list)  # extra text the tokenizer is trained on
    # datasets (``builtin://NAME/SPLIT`` or parquet/JSONL files) whose prompts and SFT targets the
    # tokenizer is also trained on, so that the domain's words become single tokens (query-rewrite demo)
    corpus_datasets: list[str] = field(default_factory=list)
    split_cjk: bool = False  # one pre-token per CJK character: Chinese words stay frequent, copyable tokens


@dataclass
class LoraConfig:
    rank: int = 0  # 0 = no LoRA
    alpha: int = 16
    dropout: float = 0.0  # on the adapters' input
    # the linear layers that get adapters (peft's target_modules)
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class VocabConfig:
    """A vocabulary-restricted output head (queryrl.models.vocab, Vocabulary Trimming, Ushio et al. 2023)."""

    # true: the policy's head keeps only the tokens of the tokenizer's specials and chat template, the
    # training/validation prompts and targets, the application's texts (query_rewrite: the embedded RAG
    # corpus) and extra_files; its log-probs are over those tokens. Needs a frozen head (LoRA)
    restrict: bool = False
    extra_files: list[str] = field(default_factory=list)  # UTF-8 text files whose tokens are kept too


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
    vocab: VocabConfig = field(default_factory=VocabConfig)
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

    enable: bool = False  # the policy calls tools between turns (rollout.multi_turn.*)
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
class VLLMEngineConfig:
    """``rollout.backend=vllm``'s engine options: each one set is passed to ``vllm.LLM`` (null: vLLM's default);
    ``extra`` holds any other ``vllm.LLM`` keyword, passed as given. verl's ``actor_rollout_ref.rollout.<name>``
    keys are aliases of these (``queryrl.rollout.vllm.engine_kwargs``; ``queryrl train --dry-run`` shows them)."""

    gpu_memory_utilization: float = 0.4  # the GPU share vLLM takes (weights + KV cache); the trainer has the rest
    max_num_seqs: int | None = None  # sequences decoded at once (vLLM's default: 256); fewer = smaller KV cache
    max_model_len: int | None = None  # the longest prompt + response the engine plans for (default: the model's)
    enforce_eager: bool | None = None  # true: no CUDA graphs (less memory, slower decoding)
    enable_prefix_caching: bool | None = None  # reuse the KV cache of a shared prompt (GRPO's n samples)
    extra: dict[str, Any] = field(default_factory=dict)  # other vllm.LLM keywords, e.g. {kv_cache_dtype: fp8}


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
    # hf fast path: on = its token steps as one static step, captured in a CUDA graph and replayed per token on a
    # GPU (run eagerly on a CPU, where it is slower: for tests); auto = on where the rollout runs on CUDA; off = the
    # dynamic step (queryrl/rollout/graph_decode.py; off by default until measured on a GPU)
    decode_graph: str = "off"
    # hf backend on a CPU: int8 = the base model's linear layers (not the output head, embeddings or LoRA adapters)
    # from int8 copies, made once under LoRA (again whenever base weights change), for the rollouts only: the update,
    # reference and eval keep full precision; the gap shows as training/rollout_probs_diff_* (queryrl/rollout/int8.py)
    quantize: str = "none"
    val: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0, do_sample=False))
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    vllm: VLLMEngineConfig = field(default_factory=VLLMEngineConfig)  # the vllm backend's engine options


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
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW's
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
    tau_pos: float = 1.0  # sapo: the soft gate's temperature for positive advantages
    tau_neg: float = 1.05  # sapo: the same for negative advantages
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    # run each distinct prompt of a micro-batch once and only the responses per sample (GRPO's n
    # samples share their prompt); same log-probs and gradients up to float rounding, for the update,
    # the old and the reference log-probs (Prefix Grouper's idea; see engine/policy.py). On by default:
    # it falls back to the full forward by itself where nothing is shared; under gradient checkpointing (no
    # key/value cache) each prompt and its samples' responses run as one packed sequence instead
    share_prompt_forward: bool = True
    # with share_prompt_forward: the distinct prompts' own common leading tokens (a system prompt, 16 tokens or
    # more) also run once, each prompt's rest on their keys and values; the same log-probs up to float rounding.
    # Off where a sliding window is shorter than the prompt and response, and under FSDP (the prompts run whole)
    share_prefix_forward: bool = True


@dataclass
class CriticConfig:
    path: str | None = None  # default: the policy's model
    lr: float = 1e-5
    weight_decay: float = 0.01  # AdamW's, as the actor's
    warmup_steps: int = 0  # steps before the actor starts updating (verl's critic_warmup)
    lr_warmup_steps: int = 0  # linear learning-rate warm-up, in optimizer steps
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW's, as the actor's
    lr_schedule: str = "constant"  # after the warm-up: constant | cosine | linear (verl's critic.optim too)
    min_lr_ratio: float = 0.0  # the cosine/linear schedule's floor, a fraction of lr
    grad_clip: float = 1.0  # the gradient norm's clip
    ppo_epochs: int = 1  # passes over each batch
    ppo_micro_batch_size: int = 8
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"  # the value loss's aggregation, as actor.loss_agg_mode


@dataclass
class RewardFunctionConfig:
    path: str | None = None  # a .py file; empty = the built-in scorers, routed by data_source
    name: str = "compute_score"
    # the function's contract: verl (per sample: data_source, solution_str, ground_truth, extra_info) |
    # trl (per batch: prompts, completions, ...; None = failed sample) | auto: trl when its first two
    # positional parameters are prompts, completions, or it takes completions and **kwargs and no solution_str
    style: str = "auto"


@dataclass
class WeightedRewardFunctionConfig(RewardFunctionConfig):
    """One of ``reward.functions``: a TRL-style function and its weight (TRL's ``reward_weights``)."""

    weight: float = 1.0


@dataclass
class RewardConfig:
    # auto = the application's choice (query_rewrite: async) or naive | naive | batch | parallel | dapo | async
    manager: str = "auto"
    function: RewardFunctionConfig = field(default_factory=RewardFunctionConfig)
    # several TRL-style functions, as TRL's reward_funcs + reward_weights: the score is the weighted sum of
    # those that scored a sample (None: left out); each logged as reward/<function name>/mean. Instead of
    # reward.function, e.g. [{path: my_rewards.py, name: format_reward, weight: 0.5}, {path: ..., name: ...}]
    functions: list[WeightedRewardFunctionConfig] = field(default_factory=list)
    # how reward.functions combine (TRL's multi_objective_aggregation): sum_then_normalize (the weighted sum is
    # the score) | normalize_then_sum (GDPO: each function's values normalised within their group, then summed)
    multi_objective_aggregation: str = "sum_then_normalize"
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to compute_score
    num_workers: int = 2  # parallel: worker processes
    timeout_s: float = 60.0  # parallel/async: per-sample limit; past it the sample fails
    max_concurrency: int = 16  # async: calls in flight at once
    requests_per_minute: float = 0.0  # async: rate limit, 0 = none
    max_retries: int = 2  # async: retries after an exception or a timeout
    overlong_buffer_len: int = 0  # dapo: soft-penalty zone before max_response_length (tokens)
    overlong_penalty_factor: float = 1.0  # dapo: penalty at max_response_length
    # a failed sample's whole group is left out of the update (its mates compared only among those that could be
    # scored: in a RAG outage, only the ones that needed no retrieval); false: only the failed samples
    drop_failed_groups: bool = True
    # a step whose failed fraction of samples (with drop_failed_groups, their group mates too) exceeds this
    # (strictly: > ) is skipped (no update), with a warning
    max_failed_frac: float = 0.5
    # this many skipped steps in a row stop the run (exit 3) with the first failed sample's error; 0 = never.
    # A run whose every step was skipped, in a row or not, ends with exit 3 whatever this says
    max_skipped_steps: int = 3


@dataclass
class SFTConfig:
    """``queryrl sft``: supervised fine-tuning on prompts and target replies (a warm start before RL)."""

    train_files: list[str] = field(default_factory=list)  # empty = data.train_files
    val_files: list[str] = field(default_factory=list)  # empty = data.val_files
    target_key: str = "extra_info.sft_target"  # dotted path in each row to the reply to learn
    # dotted path in each row to where its target came from (prepare writes it); queryrl sft prints the counts
    target_source_key: str = "extra_info.sft_target_source"
    epochs: int = 1  # passes over the SFT data
    max_steps: int = 0  # 0 = epochs over the data
    batch_size: int = 16  # sequences per optimizer step
    micro_batch_size: int = 8  # sequences per forward pass (gradients accumulate to batch_size)
    lr: float = 1e-4  # the peak learning rate
    weight_decay: float = 0.0  # AdamW's
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW's
    warmup_steps: int = 0  # linear learning-rate warm-up, in optimizer steps
    lr_schedule: str = "cosine"  # constant | cosine | linear
    min_lr_ratio: float = 0.0  # the schedule's floor, a fraction of lr
    grad_clip: float = 1.0  # the gradient norm's clip
    # > 0: also learn the prompt tokens (the conversation), weighted against the target's mean loss; a
    # model trained from scratch gets ~14x more supervised tokens per step (see experiments/logs/rewriter_learning.md)
    prompt_loss_weight: float = 0.0
    eval_every: int = 0  # validation loss every N steps; 0 = only at the end
    # run the prompts' common leading tokens (the system prompt) once a micro-batch and the rest of each row on
    # its keys and values: the same loss up to float rounding; off under gradient checkpointing
    share_prefix_forward: bool = True
    output_dir: str = ""  # default: {trainer.output_dir}/{trainer.experiment_name}/sft


@dataclass
class TrainerConfig:
    project_name: str = "queryrl"
    experiment_name: str = "run"
    output_dir: str = "runs"
    total_epochs: int = 1
    total_steps: int = 0  # 0 = total_epochs over the train data (>= 1 then); a negative count is refused
    seed: int = 42
    device: str = "auto"  # auto | cpu | cuda | cuda:N (the policy)
    ref_device: str = ""  # default: device
    num_threads: int = 0  # torch threads on CPU; 0 = leave as is
    # glibc malloc (Linux): blocks under this many MiB come from the heap and 4x it of freed memory stays
    # mapped, so a step reuses the last step's pages instead of faulting fresh ones (queryrl/allocator.py);
    # 0 = glibc's defaults; a MALLOC_*_ environment variable or GLIBC_TUNABLES of the user's wins
    malloc_mmap_threshold_mb: int = 64
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    log_every: int = 1  # write metrics every N steps
    # also log each phase's CPU time of this process (time.process_time) as timing_cpu_s/<phase>: a shared
    # machine inflates wall time, not CPU time; work in Ray workers or reward pools is not counted
    cpu_timing: bool = False
    eval_every: int = 0  # 0 = only at the end
    eval_before_train: bool = False
    save_every: int = 0  # 0 = only at the end
    keep_last: int = 2  # checkpoints kept (older ones are deleted); 0 = all
    save_last: bool = True  # a checkpoint at the last step (whatever save_every says); false = only every save_every
    resume: str = "auto"  # auto | disable | a checkpoint folder
    # accept a checkpoint without manifest.json (written by a queryrl before manifests): its files are not hashed
    resume_legacy: bool = False
    # `queryrl train` calls the judge, the RAG service and the reward function once before loading the model
    preflight: bool = True
    save_samples: int = 8  # rows of samples/step_N.jsonl
    # this many steps in a row whose groups all scored their samples alike (no policy gradient) stop the run
    # (exit 3), saying why; 0 = never
    max_no_signal_steps: int = 10
    plot: bool = True  # plots/*.png of the metrics at the end of the run
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
    fsdp_on_cpu: bool = False  # with fsdp: CPU (gloo) workers shard with FSDP too, instead of replicating
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
    app: dict[str, Any] = field(default_factory=dict)  # app.<name>: each installed application's node
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray: RayConfig = field(default_factory=RayConfig)


def build_schema() -> DictConfig:
    """The schema's defaults with every installed application's node under ``app.<name>``; struct mode."""
    from queryrl.application import load_apps

    cfg = OmegaConf.structured(QueryRLConfig)
    with open_dict(cfg):
        for app in load_apps():
            cfg.app[app.name] = OmegaConf.structured(app.config)
    OmegaConf.set_struct(cfg, True)
    return cfg
