"""Cross-field checks of a loaded config; names that choose code are checked against their registries."""

from __future__ import annotations

import math

from omegaconf import DictConfig, OmegaConf

from queryrl.allocator import MAX_THRESHOLD_MB
from queryrl.application import load_apps
from queryrl.config.schema import ConfigError
from queryrl.tracking import TRACKERS


def choice(value: str, valid: list[str] | tuple[str, ...], key: str) -> None:
    """A :class:`ConfigError` naming `key` unless `value` is one of `valid`."""
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(valid)}")


def check_precision(dtype: str, compute_dtype: str | None) -> None:
    """``model.compute_dtype`` is the parameters' dtype, or bfloat16 over float32 parameters (mixed)."""
    if compute_dtype is None or compute_dtype == dtype:
        return
    choice(compute_dtype, ["float32", "bfloat16", "float16"], "model.compute_dtype")
    if (dtype, compute_dtype) != ("float32", "bfloat16"):
        raise ConfigError(
            f"model.compute_dtype={compute_dtype} over model.dtype={dtype} is not supported: mixed precision is "
            "model.dtype=float32 model.compute_dtype=bfloat16 (fp32 master weights and AdamW state, bf16 compute; "
            "float16 would need loss scaling); otherwise leave model.compute_dtype unset"
        )


# numeric settings and the range each must be in: (key, low, high, low_open, high_open); None: unbounded
_RANGES: tuple[tuple[str, float | None, float | None, bool, bool], ...] = (
    *((f"{node}.lr", 0.0, None, True, False) for node in ("actor", "critic", "sft")),
    *((f"{node}.weight_decay", 0.0, None, False, False) for node in ("actor", "critic", "sft")),
    *((f"{node}.grad_clip", 0.0, None, True, False) for node in ("actor", "critic", "sft")),
    *((f"{node}.warmup_steps", 0, None, False, False) for node in ("actor", "critic", "sft")),
    *((f"{node}.min_lr_ratio", 0.0, 1.0, False, False) for node in ("actor", "critic", "sft")),
    ("critic.lr_warmup_steps", 0, None, False, False),
    ("actor.clip_ratio_low", 0.0, None, False, False),
    ("actor.clip_ratio_high", 0.0, None, False, False),
    ("actor.clip_ratio_c", 1.0, None, True, False),  # dual-clip's c > 1 (arXiv:1912.09729)
    ("actor.tau_pos", 0.0, None, True, False),
    ("actor.tau_neg", 0.0, None, True, False),
    ("actor.kl_loss_coef", 0.0, None, False, False),
    ("actor.entropy_coeff", 0.0, None, False, False),
    ("critic.cliprange_value", 0.0, None, False, False),
    ("algo.gamma", 0.0, 1.0, False, False),
    ("algo.lam", 0.0, 1.0, False, False),
    ("algo.kl_ctrl.kl_coef", 0.0, None, False, False),
    ("algo.kl_ctrl.target_kl", 0.0, None, True, False),
    ("algo.kl_ctrl.horizon", 0.0, None, True, False),
    ("rollout.top_p", 0.0, 1.0, True, False),
    ("rollout.top_k", 0, None, False, False),
    ("model.lora.rank", 0, None, False, False),
    ("model.lora.alpha", 0.0, None, True, False),
    ("model.lora.dropout", 0.0, 1.0, False, True),
    ("sft.prompt_loss_weight", 0.0, None, False, False),
    ("sft.epochs", 0, None, False, False),
    ("sft.max_steps", 0, None, False, False),
)


# the settings that must also be finite: an infinite learning rate or loss weight turns the weights into NaN at
# the first update (grad_clip and the clip ratios may be infinite: no clipping)
_FINITE = frozenset(
    {
        *(f"{node}.{key}" for node in ("actor", "critic", "sft") for key in ("lr", "weight_decay")),
        "actor.kl_loss_coef",
        "actor.entropy_coeff",
        "algo.kl_ctrl.kl_coef",
        "sft.prompt_loss_weight",
    }
)


def _range_text(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_ranges(cfg: DictConfig) -> None:
    """Every numeric setting of :data:`_RANGES` outside its range, in one :class:`ConfigError` (one line per
    key, as for unknown keys), before anything loads. NaN is outside every range."""
    bad = []
    for key, low, high, low_open, high_open in _RANGES:
        value = OmegaConf.select(cfg, key)
        if value is None or isinstance(value, bool):
            continue
        ok = (low is None or (value > low if low_open else value >= low)) and (
            high is None or (value < high if high_open else value <= high)
        )
        if not ok:
            bad.append(f"{key} must be {_range_text(low, high, low_open, high_open)}, got {value}")
        elif key in _FINITE and not math.isfinite(value):
            bad.append(f"{key} must be a finite number, got {value}")
    if len(bad) == 1:
        raise ConfigError(bad[0])
    if bad:
        raise ConfigError(f"{len(bad)} settings out of range: " + "; ".join(bad))


def validate(cfg: DictConfig) -> None:
    """Cross-field checks the types alone cannot express (the first problem found is raised)."""
    check_ranges(cfg)
    _check_algorithm_choices(cfg)
    _check_reward_functions(cfg)
    _check_placement(cfg)
    _check_sizes(cfg)
    _check_stop_rules(cfg)
    _check_applications(cfg)
    _check_vocab(cfg)


def _check_algorithm_choices(cfg: DictConfig) -> None:
    """The registered names: estimator, losses, KL, schedules, precision, rollout backend."""
    from queryrl.algos import ADVANTAGE_ESTIMATORS, KL_PENALTIES, LOSS_AGG_MODES, POLICY_LOSSES
    from queryrl.rollout import ROLLOUT_BACKENDS
    from queryrl.rollout.vllm import engine_kwargs

    choice(cfg.algo.adv_estimator, ADVANTAGE_ESTIMATORS.names(), "algo.adv_estimator")
    choice(cfg.actor.policy_loss, POLICY_LOSSES.names(), "actor.policy_loss")
    choice(cfg.actor.loss_agg_mode, LOSS_AGG_MODES, "actor.loss_agg_mode")
    choice(cfg.critic.loss_agg_mode, LOSS_AGG_MODES, "critic.loss_agg_mode")
    choice(cfg.actor.kl_loss_type, KL_PENALTIES, "actor.kl_loss_type")
    choice(cfg.algo.kl_penalty, KL_PENALTIES, "algo.kl_penalty")
    choice(cfg.algo.kl_ctrl.type, ["fixed", "adaptive"], "algo.kl_ctrl.type")
    for node in ("actor", "critic", "sft"):  # the optimizer of each role (engine/optim.optimizer_from_config)
        choice(cfg[node].lr_schedule, ["constant", "cosine", "linear"], f"{node}.lr_schedule")
        betas = list(cfg[node].betas)
        if len(betas) != 2 or not all(isinstance(b, float | int) and 0.0 <= b < 1.0 for b in betas):
            raise ConfigError(f"{node}.betas must be two numbers in [0, 1) (AdamW's beta1, beta2), got {betas}")
    choice(cfg.model.dtype, ["float32", "bfloat16", "float16"], "model.dtype")
    check_precision(cfg.model.dtype, cfg.model.compute_dtype)
    choice(cfg.rollout.backend, ROLLOUT_BACKENDS.names(), "rollout.backend")
    choice(cfg.rollout.fast_decode, ["auto", "off"], "rollout.fast_decode")
    choice(cfg.rollout.decode_graph, ["off", "on", "auto"], "rollout.decode_graph")
    choice(cfg.rollout.quantize, ["none", "int8"], "rollout.quantize")
    if cfg.rollout.quantize == "int8":
        _check_int8_rollout(cfg)
    try:  # the vllm engine's options (checked whatever the backend: a typo waits for no GPU run)
        engine_kwargs(OmegaConf.to_container(cfg.rollout.vllm, resolve=True))  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_int8_rollout(cfg: DictConfig) -> None:
    """``rollout.quantize=int8``: the hf backend's rollouts on a CPU (PyTorch's int8 GEMM is a CPU one), the dynamic
    decode step. Full fine-tuning is allowed: its int8 copies are made again after every step (LoRA: once)."""
    where = str(cfg.trainer.device)
    if cfg.rollout.backend != "hf" or where.startswith("cuda") or cfg.rollout.decode_graph == "on":
        raise ConfigError(
            "rollout.quantize=int8 needs rollout.backend=hf on a CPU (trainer.device=cpu or auto without a GPU) and "
            f"rollout.decode_graph=off (got backend={cfg.rollout.backend}, device={where}, "
            f"decode_graph={cfg.rollout.decode_graph})"
        )


def _check_reward_functions(cfg: DictConfig) -> None:
    """The reward manager, the functions' styles and paths, and one of reward.function / reward.functions."""
    from queryrl.rewards.manager import registered_managers
    from queryrl.rewards.trl_style import AGGREGATIONS

    choice(cfg.reward.manager, ["auto", *registered_managers().names()], "reward.manager")
    choice(cfg.reward.function.style, ["auto", "verl", "trl"], "reward.function.style")
    choice(cfg.reward.multi_objective_aggregation, list(AGGREGATIONS), "reward.multi_objective_aggregation")
    for i, entry in enumerate(cfg.reward.functions):
        choice(entry.style, ["auto", "verl", "trl"], f"reward.functions[{i}].style")
        if not entry.path:
            raise ConfigError(f"reward.functions[{i}] needs a path (a .py file or a module) and a name")
    if cfg.reward.functions and cfg.reward.function.path:
        raise ConfigError(
            "reward.function.path and reward.functions are both set: use reward.function for one function, "
            "reward.functions for several (each with a weight)"
        )


def _check_placement(cfg: DictConfig) -> None:
    """Backend, GPUs and nodes, Ray's resources and pools, the trackers."""
    choice(cfg.trainer.backend, ["local", "ray"], "trainer.backend")
    choice(cfg.ray.placement_strategy, ["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"], "ray.placement_strategy")
    choice(str(cfg.ray.use_gpu).lower(), ["auto", "true", "false"], "ray.use_gpu")
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
    if not 0 <= cfg.trainer.malloc_mmap_threshold_mb <= MAX_THRESHOLD_MB:
        raise ConfigError(
            f"trainer.malloc_mmap_threshold_mb must be 0..{MAX_THRESHOLD_MB} (0 = glibc's defaults), "
            f"got {cfg.trainer.malloc_mmap_threshold_mb}"
        )
    if cfg.ray.num_cpus < 0 or cfg.ray.num_threads < 0:
        raise ConfigError("ray.num_cpus and ray.num_threads must be >= 0")
    choice(cfg.ray.rollout, ["workers", "driver"], "ray.rollout")
    for key in ("ray.ref_workers", "ray.critic_workers"):
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(
                f"{key} must be >= 0 (0 = colocated with the actor workers), got {OmegaConf.select(cfg, key)}"
            )
    for name in cfg.trainer.logger:
        choice(name, TRACKERS.names(), "trainer.logger")


def _check_sizes(cfg: DictConfig) -> None:
    """Batch sizes and lengths, train-file weights, sampling temperature, multi-turn limits, SFT schedule."""
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
    _check_length(cfg)
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
    choice(mt.truncate_side, ["left", "right", "middle"], "rollout.multi_turn.truncate_side")
    if mt.max_turns < 1 or mt.max_tool_calls < 0 or mt.tool_timeout_s <= 0 or mt.max_tool_response_length < 0:
        raise ConfigError(
            "rollout.multi_turn needs max_turns >= 1, max_tool_calls >= 0, tool_timeout_s > 0 and "
            f"max_tool_response_length >= 0 (got {mt.max_turns}, {mt.max_tool_calls}, {mt.tool_timeout_s}, "
            f"{mt.max_tool_response_length})"
        )


def _check_length(cfg: DictConfig) -> None:
    """A run of at least one step: ``trainer.total_steps`` > 0, or 0 and ``trainer.total_epochs`` >= 1 (likewise
    ``sft.max_steps`` and ``sft.epochs``); a negative count or zero epochs trained nothing and printed "done"."""
    t, s = cfg.trainer, cfg.sft
    if t.total_steps < 0:
        raise ConfigError(
            f"trainer.total_steps must be >= 0 (0 = trainer.total_epochs over the train data), got {t.total_steps}"
        )
    if t.total_steps == 0 and t.total_epochs < 1:
        raise ConfigError(
            f"trainer.total_epochs must be >= 1 when trainer.total_steps=0 (the run would train no step), "
            f"got {t.total_epochs}"
        )
    if s.max_steps == 0 and s.epochs < 1:
        raise ConfigError(f"sft.epochs must be >= 1 when sft.max_steps=0 (SFT would train no step), got {s.epochs}")


def _check_stop_rules(cfg: DictConfig) -> None:
    """When a run stops: failed rewards, skipped and no-signal steps; dynamic sampling's estimator."""
    from queryrl.algos import ADVANTAGE_ESTIMATORS

    if not 0.0 <= cfg.reward.max_failed_frac <= 1.0:
        raise ConfigError(f"reward.max_failed_frac must be in [0, 1], got {cfg.reward.max_failed_frac}")
    if cfg.reward.max_skipped_steps < 0:
        raise ConfigError(f"reward.max_skipped_steps must be >= 0 (0 = never stop), got {cfg.reward.max_skipped_steps}")
    if cfg.trainer.max_no_signal_steps < 0:
        raise ConfigError(
            f"trainer.max_no_signal_steps must be >= 0 (0 = never stop), got {cfg.trainer.max_no_signal_steps}"
        )
    needs = ADVANTAGE_ESTIMATORS.needs(cfg.algo.adv_estimator)
    if cfg.algo.filter_groups.enable and needs & {"greedy_baseline", "reference_baseline"}:
        raise ConfigError(f"algo.filter_groups is not supported with algo.adv_estimator={cfg.algo.adv_estimator}")


def _check_applications(cfg: DictConfig) -> None:
    """At most one application enabled; each application's own checks."""
    enabled = [app.name for app in load_apps() if cfg.app[app.name].enable]
    if len(enabled) > 1:
        raise ConfigError(f"one application at a time: {', '.join(f'app.{n}.enable' for n in enabled)} are all true")
    for app in load_apps():
        app.validate(cfg)


def _check_vocab(cfg: DictConfig) -> None:
    """``model.vocab.restrict`` needs a frozen output head on the local backend's hf rollout."""
    if not cfg.model.vocab.restrict:
        return
    if cfg.model.lora.rank <= 0:
        raise ConfigError(
            "model.vocab.restrict=true needs a frozen output head: set model.lora.rank > 0 (full fine-tuning trains it)"
        )
    trained = sorted({"lm_head", "embed_tokens"} & set(cfg.model.lora.target_modules))
    if trained:
        raise ConfigError(
            f"model.vocab.restrict=true with LoRA on {', '.join(trained)}: the output head must be frozen"
        )
    if cfg.trainer.backend != "local" or cfg.rollout.backend != "hf":
        raise ConfigError(
            "model.vocab.restrict=true runs with trainer.backend=local and rollout.backend=hf "
            f"(got {cfg.trainer.backend}, {cfg.rollout.backend})"
        )
