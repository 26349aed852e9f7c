"""verl's launch-script keys, accepted as aliases of queryrl's (a verl user's script runs as is)."""

from __future__ import annotations

from queryrl.config.schema import ConfigError

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
    "actor_rollout_ref.rollout.gpu_memory_utilization": "rollout.vllm.gpu_memory_utilization",
    "actor_rollout_ref.rollout.max_num_seqs": "rollout.vllm.max_num_seqs",
    "actor_rollout_ref.rollout.max_model_len": "rollout.vllm.max_model_len",
    "actor_rollout_ref.rollout.enforce_eager": "rollout.vllm.enforce_eager",
    "actor_rollout_ref.rollout.enable_prefix_caching": "rollout.vllm.enable_prefix_caching",
    "actor_rollout_ref.rollout.val_kwargs.temperature": "rollout.val.temperature",
    "actor_rollout_ref.rollout.val_kwargs.top_p": "rollout.val.top_p",
    "actor_rollout_ref.rollout.val_kwargs.top_k": "rollout.val.top_k",
    "actor_rollout_ref.rollout.val_kwargs.n": "rollout.val.n",
    "actor_rollout_ref.rollout.val_kwargs.do_sample": "rollout.val.do_sample",
    "actor_rollout_ref.actor.optim.lr": "actor.lr",
    "actor_rollout_ref.actor.optim.weight_decay": "actor.weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "actor.warmup_steps",
    "actor_rollout_ref.actor.optim.min_lr_ratio": "actor.min_lr_ratio",
    "actor_rollout_ref.actor.optim.betas": "actor.betas",
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
    "critic.optim.weight_decay": "critic.weight_decay",
    "critic.optim.lr_warmup_steps": "critic.lr_warmup_steps",
    "critic.optim.min_lr_ratio": "critic.min_lr_ratio",
    "critic.optim.betas": "critic.betas",
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
    "actor_rollout_ref.actor.fsdp_config": "FSDP is chosen by trainer.backend=ray on GPUs",
    "actor_rollout_ref.ref.fsdp_config": "FSDP is chosen by trainer.backend=ray on GPUs",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "log-probs use actor.ppo_micro_batch_size",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": "log-probs use actor.ppo_micro_batch_size",
    "actor_rollout_ref.actor.use_dynamic_bsz": "queryrl trims each micro-batch to its own length instead",
    "actor_rollout_ref.model.use_remove_padding": "queryrl trims each micro-batch to its own length instead",
}


def all_aliases() -> dict[str, str]:
    """:data:`VERL_ALIASES` and the installed applications' own aliases."""
    from queryrl.application import load_apps

    out = dict(VERL_ALIASES)
    for app in load_apps():
        out |= dict(app.aliases)
    return out


def translate_key(key: str) -> str:
    """A dotted override key, verl alias or not, -> the queryrl key (leading '+' dropped)."""
    key = key.lstrip("+")
    aliases = all_aliases()
    if key in aliases:
        return aliases[key]
    for alias, target in aliases.items():
        if alias.endswith(".*") and key.startswith(alias[:-1]):
            return target[:-1] + key[len(alias) - 1 :]
    for prefix, reason in VERL_WITHOUT_MEANING.items():
        if key == prefix or key.startswith(prefix + "."):
            raise ConfigError(f"verl key {key!r} has no meaning in queryrl: {reason}; remove it")
    return key
