"""Building what the loop drives from a config: models, rollout, optimizers, data, rewards."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from queryrl.algos import ADVANTAGE_ESTIMATORS
from queryrl.allocator import keep_freed_memory
from queryrl.application import enabled_app
from queryrl.data import PromptDataset, PromptLoader, build_prompt_dataset
from queryrl.data.builtin import resolve_data_path
from queryrl.engine.optim import optimizer_from_config
from queryrl.engine.workers import Workers, make_workers
from queryrl.models import PolicyBundle, ValueModel, load_policy, resolve_model_path
from queryrl.models.vocab import output_head, read_vocab_ids, restrict_head, vocab_ids
from queryrl.rewards import make_reward_manager
from queryrl.rollout import make_rollout
from queryrl.rollout.vllm import config_engine
from queryrl.trainer.preflight import config_reward_spec
from queryrl.trainer.row_checks import truth_rule
from queryrl.trainer.vocab import run_vocab_ids


def resolve_device(name: str, default: torch.device | None = None) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``""`` -> `default`."""
    if not name:
        return default or torch.device("cpu")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"trainer device {name!r} asked for, but CUDA is not available")
    return device


@dataclass
class Components:
    """Everything the training loop uses, built once."""

    policy: PolicyBundle
    rollout: Any
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    trainable_params: list[nn.Parameter]
    loader: PromptLoader
    val_datasets: list[PromptDataset]
    reward: Any
    need_ref: bool
    device: torch.device
    ref_device: torch.device
    total_steps: int
    critic: ValueModel | None = None
    critic_optimizer: torch.optim.Optimizer | None = None
    critic_scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
    data_stats: dict[str, float] = field(default_factory=dict)
    # picks the rows of a rollout to score and train on (the query-rewrite app's seed_hybrid selector); None = every row
    select: Any = None
    # what computes log-probs and values and takes the updates (trainer.backend, queryrl.engine.workers):
    # local = the models above; ray = worker groups whose mirrors are the models above, pulled before
    # every checkpoint (and, with ray.rollout=driver, the policy after every update: it generates)
    workers: Workers = None  # type: ignore[assignment]  # set by build_components, after the models

    @property
    def vocab_ids(self) -> list[int] | None:
        """``model.vocab.restrict``: the kept token ids of the policy's restricted head (sorted); None = a full head."""
        ids = vocab_ids(self.policy.model)
        return None if ids is None else [int(i) for i in ids.tolist()]


def _datasets(cfg: DictConfig, tokenizer: Any, files: list[str]) -> list[PromptDataset]:
    needs_truth = truth_rule(cfg)  # rows the built-in reward would score against "None" are data errors
    return [
        build_prompt_dataset(
            resolve_data_path(str(f), cfg.model.cache_dir),
            tokenizer,
            cfg.data.max_prompt_length,
            filter_overlong=cfg.data.filter_overlong_prompts,
            prompt_key=cfg.data.prompt_key,
            needs_truth=needs_truth,
        )
        for f in files
    ]


def _data(
    cfg: DictConfig, policy: PolicyBundle, vocab_file: Path | None
) -> tuple[PromptLoader, list[PromptDataset], dict[str, float]]:
    """The train loader, the validation sets and their stats: the prompts left out as too long (each warned
    about); with ``model.vocab.restrict`` the kept vocabulary's size, the policy's head cut to it
    (:func:`_restrict_vocab`; `vocab_file`: the kept ids of the checkpoint a run resumes from)."""
    tokenizer = policy.tokenizer
    train = _datasets(cfg, tokenizer, list(cfg.data.train_files))
    val = _datasets(cfg, tokenizer, list(cfg.data.val_files))
    for d in train + val:
        if d.num_filtered:
            warnings.warn(
                f"{d.path}: {d.num_filtered} prompts longer than data.max_prompt_length="
                f"{cfg.data.max_prompt_length} were left out (logged as data/filtered_prompts)",
                stacklevel=3,
            )
    weights = list(cfg.data.train_weights) or None
    loader = PromptLoader(
        train, cfg.data.train_batch_size, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle, weights=weights
    )
    stats = {"data/filtered_prompts": float(sum(d.num_filtered for d in train + val))}
    if cfg.model.vocab.restrict:  # a metric every step: the run's plots and report show it
        stats["data/vocab_kept"] = float(len(_restrict_vocab(cfg, policy, train + val, vocab_file)))
    return loader, val, stats


def _reward(cfg: DictConfig) -> tuple[Any, Any]:
    """The reward manager and the row selector: the enabled application's, else ``reward.function``'s."""
    r = cfg.reward
    app = enabled_app(cfg)
    spec = app.reward(cfg) if app is not None else None
    if spec is not None:  # the application brings its reward (and, maybe, a selector of the rows to train on)
        reward_fn, kwargs, preferred = spec.fn, dict(spec.kwargs), spec.manager
    else:
        reward_fn = config_reward_spec(cfg).load()  # reward.function, or reward.functions weighted
        kwargs, preferred = dict(r.kwargs), "naive"
    select = app.selector(cfg) if app is not None else None
    manager = make_reward_manager(
        preferred if r.manager == "auto" else r.manager,
        reward_fn,
        kwargs,
        num_workers=r.num_workers,
        timeout_s=r.timeout_s,
        max_concurrency=r.max_concurrency,
        requests_per_minute=r.requests_per_minute,
        max_retries=r.max_retries,
        overlong_buffer_len=r.overlong_buffer_len,
        overlong_penalty_factor=r.overlong_penalty_factor,
        max_response_length=cfg.data.max_response_length,
    )
    return manager, select


def _critic(
    cfg: DictConfig, device: torch.device, total_steps: int
) -> tuple[ValueModel, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The value model (``critic.path``, default the policy's weights) and its optimizer and schedule."""
    path = Path(cfg.critic.path) if cfg.critic.path else resolve_model_path(cfg.model)
    critic = ValueModel.from_pretrained(path, cfg.model, device)
    optimizer, scheduler = optimizer_from_config(critic.parameters(), cfg, "critic", total_steps)
    return critic, optimizer, scheduler


def _prepare_process(cfg: DictConfig) -> None:
    """Torch's threads and malloc; refuse a run without training data; warn that GPU counts need the Ray backend."""
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    keep_freed_memory(cfg.trainer.malloc_mmap_threshold_mb)
    if not cfg.data.train_files:
        raise ValueError("data.train_files is empty: give at least one parquet/jsonl file (or builtin://NAME/SPLIT)")
    if cfg.trainer.backend == "local" and (cfg.trainer.n_gpus_per_node > 1 or cfg.trainer.nnodes > 1):
        warnings.warn(
            f"trainer.n_gpus_per_node={cfg.trainer.n_gpus_per_node}, trainer.nnodes={cfg.trainer.nnodes} take effect "
            "with trainer.backend=ray; the local backend trains on one device (trainer.device)",
            stacklevel=3,
        )


def _restrict_vocab(
    cfg: DictConfig, policy: PolicyBundle, datasets: list[PromptDataset], saved: Path | None
) -> list[int]:
    """``model.vocab.restrict``: the kept ids (`saved`, a checkpoint's ``vocab_ids.json``, when there is one; else
    computed from the tokenizer and data) and the policy's head cut to them (the reference shares it: LoRA)."""
    head = output_head(policy.model)
    size = int(head.weight.shape[0]) if isinstance(head, nn.Linear) else 0
    ids = read_vocab_ids(saved) if saved is not None and saved.is_file() else None
    if ids is None:
        ids = run_vocab_ids(cfg, policy.tokenizer, datasets, size)
    restrict_head(policy.model, ids)
    return ids


def build_components(cfg: DictConfig, vocab_file: Path | None = None) -> Components:
    """Load the policy (and reference, critic), the rollout backend, data, rewards, optimizers (`vocab_file`: _data)."""
    _prepare_process(cfg)
    device = resolve_device(cfg.trainer.device)
    ref_device = resolve_device(cfg.trainer.ref_device, device)
    need_ref = bool(cfg.actor.use_kl_loss or cfg.algo.use_kl_in_reward)
    on_ray = cfg.trainer.backend == "ray"
    # with Ray the workers hold the reference; the driver's policy is a mirror for checkpoints
    # local: the frozen LoRA base in the compute dtype (no per-forward cast); the Ray driver's copy is a mirror
    policy = load_policy(
        cfg.model, device, ref_device, need_ref=need_ref and not on_ray, frozen_in_compute_dtype=not on_ray
    )

    loader, val, stats = _data(cfg, policy, vocab_file)
    total_steps = cfg.trainer.total_steps or cfg.trainer.total_epochs * loader.steps_per_epoch

    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer, scheduler = optimizer_from_config(trainable, cfg, "actor", total_steps)
    rollout: Any = None  # ray.rollout=workers: built with the workers below
    if not (on_ray and cfg.ray.rollout == "workers"):
        rollout = make_rollout(
            cfg.rollout.backend, policy.model, policy.tokenizer, cfg.rollout.micro_batch_size, device,
            fast_decode=cfg.rollout.fast_decode, engine=config_engine(cfg.rollout),
        )  # fmt: skip
    reward, select = _reward(cfg)
    components = Components(
        policy=policy,
        rollout=rollout,
        optimizer=optimizer,
        scheduler=scheduler,
        trainable_params=trainable,
        loader=loader,
        val_datasets=val,
        reward=reward,
        need_ref=need_ref,
        device=device,
        ref_device=ref_device,
        total_steps=total_steps,
        data_stats=stats,
        select=select,
    )
    if "values" in ADVANTAGE_ESTIMATORS.needs(cfg.algo.adv_estimator):  # a critic
        components.critic, components.critic_optimizer, components.critic_scheduler = _critic(cfg, device, total_steps)
    import queryrl.distributed  # noqa: F401  registers trainer.backend=ray (Ray itself is imported only when used)

    components.workers = make_workers(cfg, components)
    if cfg.rollout.multi_turn.enable:
        from queryrl.agent import build_agent_rollout

        components.rollout = build_agent_rollout(
            components.rollout, policy.tokenizer, cfg.rollout.multi_turn, cfg.rollout.micro_batch_size
        )
    return components
