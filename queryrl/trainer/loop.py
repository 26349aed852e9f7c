"""The single-controller GRPO/PPO loop.

One step, each phase timed as ``timing_s/<phase>`` (verl's phase names):

1. ``gen``           sample ``rollout.n`` responses per prompt (ReMax: also one greedy response)
2. ``reward``        score every response; a sample whose reward failed is dropped, not scored 0
3. ``old_log_prob``  log-probs under the policy that sampled (skipped when the update is a single
                     on-policy pass: they equal the update's own log-probs, detached)
4. ``ref``           log-probs under the frozen reference (KL loss or KL in reward)
5. ``values``        the critic's values (GAE only)
6. ``adv``           KL inside the reward if configured, then the registered estimator
7. ``update_critic`` / ``update_actor``  ppo_epochs x mini-batches x micro-batches, with one loss
                     normaliser per mini-batch so the micro-batch size never changes the update
8. ``testing`` every ``trainer.eval_every`` steps, ``save_checkpoint`` every ``trainer.save_every``
   and at the last step (``trainer.save_last``), its size logged (``checkpoint/size_mb``)

A failed sample's group mates are left out with it (``reward.drop_failed_groups``); a step where more than
``reward.max_failed_frac`` of the samples are left out (strictly more) is skipped;
``reward.max_skipped_steps`` of them in a row stop the run with
:class:`~queryrl.trainer.skips.RewardsFailing`, naming the first failed sample's error.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor

from queryrl.algos import ADVANTAGE_ESTIMATORS, LossNormalizer
from queryrl.algos.kl import make_kl_controller
from queryrl.application import learning_problem_check
from queryrl.config import save_config
from queryrl.engine.batch import Batch
from queryrl.engine.seeding import seed_everything
from queryrl.engine.update import add_metrics, role_settings
from queryrl.models.vocab import VOCAB_FILE, write_vocab_ids
from queryrl.redaction import redact, register_config_secrets
from queryrl.rollout import SamplingParams
from queryrl.trainer import checkpoint as ckpt
from queryrl.trainer.components import Components, build_components
from queryrl.trainer.machine_record import record_machine, warn_emulated_bf16
from queryrl.trainer.metrics import PhaseTimer, data_metrics, rollout_probs_diff
from queryrl.trainer.run_folder import plan_resume, read_config_yaml, train_data_paths
from queryrl.trainer.samples import sample_records, write_samples
from queryrl.trainer.scoring import (
    apply_scores,
    batch_advantages,
    generate_and_score,
    reference_baselines,
    reward_side_metrics,
    train_sampling,
)
from queryrl.trainer.skips import (
    NoSignalWatch,
    NothingToLearn,
    NothingTrained,
    RewardFunctionRaised,
    RewardsFailing,
    SkipWatch,
    has_signal,
    nothing_trained_message,
)
from queryrl.trainer.validation import validate


class Trainer:
    """Trains the policy described by `cfg` (see :mod:`queryrl.config`).

    Args:
        cfg: a resolved config from :func:`queryrl.config.load_config`.
    """

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        register_config_secrets(cfg)  # their values are redacted from every message, log line and sample
        seed_everything(cfg.trainer.seed)
        warn_emulated_bf16(cfg)  # bf16 forced on a CPU that emulates it: one line, before the model loads
        self.run_dir = Path(cfg.trainer.output_dir) / cfg.trainer.experiment_name
        # reads only: refuses a folder trained with another config, picks the newest intact checkpoint
        plan = plan_resume(self.run_dir, cfg)
        # the run folder is written only once the model, data and reward have loaded: a bad setting
        # found on the way leaves nothing behind
        self.c: Components = build_components(cfg, plan.checkpoint / VOCAB_FILE if plan.checkpoint else None)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resume_from = plan.apply()  # before config.yaml is overwritten: an earlier run's is set aside
        save_config(cfg, self.run_dir / "config.yaml")
        record_machine(self.run_dir)  # machine.json and one line: the CPU, native bf16, matmul rates
        if self.c.vocab_ids is not None:  # model.vocab.restrict: the kept ids, once per run (and in each checkpoint)
            write_vocab_ids(self.run_dir / VOCAB_FILE, self.c.vocab_ids)
            kept = len(self.c.vocab_ids)
            print(f"vocabulary: the policy's head keeps {kept} tokens (model.vocab.restrict)", flush=True)
        self.kl_ctrl = make_kl_controller(
            cfg.algo.kl_ctrl.type, cfg.algo.kl_ctrl.kl_coef, cfg.algo.kl_ctrl.target_kl, cfg.algo.kl_ctrl.horizon
        )
        self.step = 0
        self.updated_steps = 0  # the steps of this process that updated the weights
        self.skips = SkipWatch(cfg.reward.max_skipped_steps)
        self.no_signal = NoSignalWatch(cfg.trainer.max_no_signal_steps, problem_of=learning_problem_check(cfg))
        self._data_prints: dict[str, Any] | None = None  # the training files' fingerprints, for checkpoints
        self._set_aside: list[Batch] = []  # this step's rows not trained on (failed; a skipped step's), for samples
        self._resume(resume_from)
        self.train_sampling = train_sampling(cfg)
        val = cfg.rollout.val
        self.val_sampling = SamplingParams(
            temperature=val.temperature if val.do_sample else 1.0,
            top_p=val.top_p,
            top_k=val.top_k,
            n=val.n,
            do_sample=val.do_sample,
            max_new_tokens=cfg.data.max_response_length,
        )

    def close(self) -> None:
        """Release what the run holds outside this process (reward worker pools, event loops, Ray workers)."""
        try:
            self.c.reward.close()
        finally:
            self.c.workers.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop -------------------------------------------------------------------------------

    def fit(self, max_steps: int | None = None) -> dict[str, float]:
        """Train until ``total_steps`` (or, if given, stop after step `max_steps` with a checkpoint).

        Returns the last step's metrics.

        Raises:
            NothingTrained: no step of this call updated the weights (every one skipped, in a row or not).
        """
        cfg = self.cfg.trainer
        stop_at = min(self.c.total_steps, max_steps) if max_steps is not None else self.c.total_steps
        metrics: dict[str, float] = {}
        first = self.step + 1
        from queryrl.tracking import Tracker

        with Tracker(
            self.run_dir,
            list(cfg.logger),
            cfg.project_name,
            cfg.experiment_name,
            read_config_yaml(self.run_dir / "config.yaml"),
            total_steps=self.c.total_steps,
            start_step=self.step,
        ) as tracker:
            if cfg.eval_before_train and self.step == 0 and self.c.val_datasets:
                tracker.log(self.validate(), step=0)
            while self.step < stop_at:
                metrics = self._next_step(tracker, stop_at)
        if self.step >= first and not self.updated_steps:  # skips not in a row never reached max_skipped_steps
            raise NothingTrained(nothing_trained_message(self.skips, first, self.step))
        if cfg.plot and self.step == self.c.total_steps:
            from queryrl.report import write_report
            from queryrl.trainer.plot import plot_run

            plot_run(self.run_dir)
            try:  # the run page is a convenience: a failure to write it must not fail the run
                write_report(self.run_dir)
            except Exception as exc:
                warnings.warn(f"report.html not written: {exc!r}", stacklevel=2)
        return metrics

    def _next_step(self, tracker: Any, stop_at: int) -> dict[str, float]:
        """Train, validate, checkpoint and log step ``self.step + 1``; stop the run if it cannot learn."""
        cfg = self.cfg.trainer
        self.step += 1
        timer = PhaseTimer(cpu=cfg.cpu_timing)
        pending: ckpt.Pending | None = None
        with timer("step"):
            metrics = self.train_step(self.c.loader.next_batch(), timer)
            last = self.step == self.c.total_steps
            if self.c.val_datasets and ((cfg.eval_every and self.step % cfg.eval_every == 0) or last):
                with timer("testing"):
                    metrics |= self.validate()
            # the run's last step obeys trainer.save_last; an early stop (max_steps) always saves, to resume;
            # nothing is saved while no step has trained: those would be the starting weights, the steps lost
            due = (cfg.save_every and self.step % cfg.save_every == 0) or (
                self.step == stop_at and (cfg.save_last or not last)
            )
            if due and self.updated_steps:
                with timer("save_checkpoint"):
                    pending = self._write_checkpoint()
                    echo = "console" in cfg.logger
                    metrics["checkpoint/size_mb"] = ckpt.report_size(pending.tmp, echo, pending.final)
        metrics |= timer.metrics()
        metrics["perf/throughput"] = metrics.get("perf/total_num_tokens", 0.0) / max(metrics["timing_s/step"], 1e-9)
        metrics["training/epoch"] = float(self.c.loader.epoch)
        stop = self.skips.stop_message()
        quiet = self.no_signal.stop_message()
        if self.step % max(cfg.log_every, 1) == 0 or self.step == stop_at or stop or quiet:
            tracker.log(metrics, step=self.step)
        if pending is not None:  # after the row: a kill in between redoes the step, row included
            pending.commit()
        if stop:
            self._stop(RewardsFailing(stop), saved=pending is not None)
        if quiet:
            self._stop(NothingToLearn(quiet), saved=pending is not None)
        return metrics

    def train_step(self, items: list[Any], timer: PhaseTimer) -> dict[str, float]:
        """One step over the prompts in `items`; returns its metrics."""
        cfg, c = self.cfg, self.c
        metrics: dict[str, float] = {}
        scored = self._scored_batch(items, timer, metrics)
        if scored is None:
            self._save_samples(None)
            return metrics
        batch, baselines = scored
        scores = torch.tensor(batch.non_tensor["score"], dtype=torch.float32)
        signal = has_signal(scores, batch.group_ids.cpu(), None if baselines is None else baselines.cpu())
        metrics |= self.no_signal.observe(self.step, signal, metrics)
        if cfg.algo.filter_groups.enable:
            batch = self._informative_groups(batch, len(items), timer, metrics)
            if len(batch) == 0:
                warnings.warn(f"step {self.step}: every group had equal rewards: no update", stacklevel=2)
                return metrics | {"reward/step_skipped": 1.0}
        self._save_samples(batch)
        needs_old = cfg.algo.use_kl_in_reward or cfg.actor.ppo_epochs > 1 or self._num_mini_batches(batch) > 1
        # Ray: all three start at once, so pools of their own (ray.ref_workers, ray.critic_workers)
        # work in parallel with the actor pool; each phase's timer then holds what is left to wait
        wanted = [
            w
            for w, on in (("logprobs", needs_old), ("ref_logprobs", c.need_ref), ("values", c.critic is not None))
            if on
        ]
        started = {w: c.workers.submit(w, batch) for w in wanted}
        if needs_old:
            with timer("old_log_prob"):
                batch.old_logprobs = started["logprobs"]()
            metrics |= rollout_probs_diff(batch)
        if c.need_ref:
            with timer("ref"):
                batch.ref_logprobs = started["ref_logprobs"]().to(c.device)
        if c.critic is not None:
            with timer("values"):
                batch.values = started["values"]()
        with timer("adv"):
            metrics |= batch_advantages(batch, cfg.algo, self.kl_ctrl, baselines)
        if c.critic is not None:
            with timer("update_critic"):
                metrics |= self._update_critic(batch)
        if self.step > cfg.critic.warmup_steps:
            with timer("update_actor"):
                metrics |= self._update_actor(batch)
            c.rollout.update_weights(c.policy.model)
        self.updated_steps += int(c.critic is not None or self.step > cfg.critic.warmup_steps)
        metrics |= data_metrics(batch, cfg.data.max_response_length, cfg.data.max_prompt_length) | c.data_stats
        if cfg.rollout.multi_turn.enable:
            from queryrl.agent import episode_metrics

            metrics |= episode_metrics(batch.non_tensor["rollout_extras"])
        metrics["perf/total_num_tokens"] = float((batch.prompt_lengths + batch.response_lengths).sum())
        return metrics

    # --- phases ---------------------------------------------------------------------------------

    def _scored_batch(
        self, items: list[Any], timer: PhaseTimer, metrics: dict[str, float]
    ) -> tuple[Batch, Tensor | None] | None:
        """Generate for `items`, score, drop failed samples; None (step skipped) when too many failed.

        Adds the reward metrics to `metrics`. Returns the scored batch and, for ReMax, the greedy
        baselines of its rows.
        """
        cfg, c = self.cfg, self.c
        batch, results = generate_and_score(
            c.rollout, c.reward, c.policy.tokenizer, items, self.train_sampling, timer, c.device, c.select, self.step,
            self._progress(),
        )  # fmt: skip
        fatal = next((r for r in results if r.stop), None)
        if fatal is not None:  # a TRL-style function raised: TRL stops there, so does this run
            self._stop(RewardFunctionRaised(redact(f"stopped at step {self.step}: {fatal.error}")), saved=False)
        needs = ADVANTAGE_ESTIMATORS.needs(cfg.algo.adv_estimator)
        baselines = self._greedy_baselines(items, batch) if "greedy_baseline" in needs else None
        if "reference_baseline" in needs:  # what the reference's own response scored, from the reward
            baselines = reference_baselines(results, cfg.algo.adv_estimator)
        with timer("reward"):
            batch, reward_metrics, keep, failed = apply_scores(batch, results, cfg.reward.drop_failed_groups)
            metrics |= reward_metrics | reward_side_metrics(c.reward)
            if len(failed):  # for the samples file: dropped from training, shown to a person
                self._set_aside.append(failed)
            if baselines is not None:
                baselines = baselines[keep]
        # failed (and dropped group mates) / total, not 1 - kept / total: 3 of 10 must be exactly 0.3
        failed_frac = (len(results) - len(batch)) / max(len(results), 1)
        metrics["reward/failed_frac"] = failed_frac
        if len(batch) == 0 or failed_frac > cfg.reward.max_failed_frac:
            warnings.warn(
                f"step {self.step}: {len(results) - len(batch)} of {len(results)} samples failed their reward"
                f"{' or are in a group with one that did' if cfg.reward.drop_failed_groups else ''} "
                f"(more than reward.max_failed_frac={cfg.reward.max_failed_frac}): the step is skipped, no update",
                stacklevel=2,
            )
            metrics |= {"reward/step_skipped": 1.0, "reward/all_failed": float(len(batch) == 0)}
            self.skips.skipped(self.step, results)
            self._set_aside.insert(0, batch)
            return None
        self.skips.trained(self.step)
        return batch, baselines

    def _progress(self) -> dict[str, Any]:
        """Where training stands, as TRL's ``TrainerState`` says it (a TRL-style reward function's
        ``trainer_state``): the run's steps, the epochs done (a float) and the epochs it covers."""
        per_epoch = max(len(self.c.loader), 1)
        return {
            "max_steps": int(self.c.total_steps),
            "epoch": (self.step - 1) / per_epoch,
            "num_train_epochs": math.ceil(self.c.total_steps / per_epoch),
        }

    def _informative_groups(
        self, batch: Batch, num_prompts: int, timer: PhaseTimer, metrics: dict[str, float]
    ) -> Batch:
        """DAPO's dynamic sampling: keep the groups whose rewards differ; while fewer than
        ``data.train_batch_size`` such groups, generate for the loader's next prompts (at most
        ``algo.filter_groups.max_num_gen_batches`` rounds in all), then train on the first
        ``train_batch_size`` of them. Logs ``filter_groups/num_gen_batches`` and ``/num_groups``."""
        cfg, c = self.cfg, self.c
        wanted, limit = cfg.data.train_batch_size, cfg.algo.filter_groups.max_num_gen_batches
        parts: list[Batch] = []
        groups: list[int] = []
        rounds, offset = 0, 0
        current: Batch | None = batch
        while True:
            rounds += 1
            if current is not None:
                current.group_ids = current.group_ids + offset
                scores = torch.tensor(current.non_tensor["score"], dtype=torch.float32)
                for g in torch.unique(current.group_ids).tolist():
                    rows = (current.group_ids == g).nonzero(as_tuple=True)[0]
                    values = scores[rows.cpu()]
                    values = values[~torch.isnan(values)]  # unscored samples spread nothing
                    if values.numel() > 1 and bool((values != values[0]).any()):
                        groups.append(g)
                parts.append(current)
            offset += num_prompts
            if len(groups) >= wanted or (limit and rounds >= limit):
                break
            extra: dict[str, float] = {}
            scored = self._scored_batch(self.c.loader.next_batch(), timer, extra)
            current = scored[0] if scored is not None else None
            metrics["reward/failed"] = metrics.get("reward/failed", 0.0) + extra.get("reward/failed", 0.0)
        keep = set(groups[:wanted])
        merged = Batch.concat(parts, int(c.policy.tokenizer.pad_token_id))
        rows = [i for i, g in enumerate(merged.group_ids.tolist()) if g in keep]
        metrics["filter_groups/num_gen_batches"] = float(rounds)
        metrics["filter_groups/num_groups"] = float(len(keep))
        return merged.select(rows)

    def _greedy_baselines(self, items: list[Any], batch: Batch) -> Tensor:
        """ReMax: the reward of one greedy response per prompt, for each sampled row."""
        greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=self.cfg.data.max_response_length)
        c = self.c
        _, results = generate_and_score(
            c.rollout, c.reward, c.policy.tokenizer, items, greedy, PhaseTimer(), c.device, step=self.step,
            progress=self._progress(),
        )  # fmt: skip
        per_prompt = torch.tensor([r.score if r.score is not None else 0.0 for r in results]).nan_to_num(0.0)
        return per_prompt[batch.group_ids.cpu()]

    def _num_mini_batches(self, batch: Batch) -> int:
        return math.ceil(len(batch) / self._mini_batch_sequences())

    def _mini_batch_sequences(self) -> int:
        cfg = self.cfg
        prompts = cfg.actor.ppo_mini_batch_size or cfg.data.train_batch_size
        return max(prompts * cfg.rollout.n, 1)

    def _ppo_updates(self, batch: Batch, role: str) -> dict[str, float]:
        """``ppo_epochs`` x mini-batches x micro-batches of `role` (``actor`` or ``critic``).

        One optimizer step per mini-batch; its loss normaliser is computed once from the whole
        mini-batch and shared by its micro-batches (and, with ``trainer.backend=ray``, by every
        data-parallel rank's shard), so neither the micro-batch size nor the number of workers
        changes the update. Returns the metrics averaged over the optimizer steps, with
        ``<role>/grad_norm`` and ``<role>/lr``.
        """
        cfg, c = self.cfg, self.c
        settings = role_settings(role, cfg)
        optimizer = c.optimizer if role == "actor" else c.critic_optimizer
        assert optimizer is not None
        totals: dict[str, float] = {}
        updates = 0
        for _ in range(settings.ppo_epochs):
            for mini in batch.split(self._mini_batch_sequences()):
                norm = LossNormalizer.from_mask(mini.response_mask, horizon=cfg.data.max_response_length)
                # with Ray every rank steps on its shard; gradients summed over the ranks
                summed, after = c.workers.optimizer_step(role, mini, norm, optimizer.param_groups[0]["lr"])
                totals = add_metrics(totals, summed | after)
                updates += 1
        out = {k: v if k.endswith("_max") else v / updates for k, v in totals.items()}  # a max is not averaged
        out[f"{role}/lr"] = optimizer.param_groups[0]["lr"]
        return out

    def _update_actor(self, batch: Batch) -> dict[str, float]:
        c = self.c
        c.policy.model.train()
        metrics = self._ppo_updates(batch, "actor")
        _schedule(c.scheduler)
        c.workers.sync_policy(c.policy.model)  # whatever generates the next rollouts takes the new weights
        return metrics

    def _update_critic(self, batch: Batch) -> dict[str, float]:
        c = self.c
        assert c.critic is not None
        assert c.critic_scheduler is not None
        c.critic.train()
        metrics = self._ppo_updates(batch, "critic")
        _schedule(c.critic_scheduler)
        return metrics

    # --- validation, samples, checkpoints -----------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Greedy (by default) generation on every validation set; scores per ``data_source``
        (:func:`queryrl.trainer.validation.validate`)."""
        return validate(self.c, self.cfg, self.val_sampling, self.step, self._progress())

    def _save_samples(self, batch: Batch | None) -> None:
        """``samples/step_N.jsonl``: the first ``trainer.save_samples`` rows of `batch` (the rows that train;
        None: the step was skipped), then as many of the step's rows set aside: its failed samples, and a
        skipped step's scored ones (:mod:`queryrl.trainer.samples`)."""
        count = self.cfg.trainer.save_samples
        aside, self._set_aside = self._set_aside, []
        if count <= 0:
            return
        tokenizer = self.c.policy.tokenizer
        records = sample_records(batch, tokenizer, self.step, count) if batch is not None else []
        records += [r for b in aside for r in sample_records(b, tokenizer, self.step, count)][:count]
        if not records:
            return
        write_samples(self.run_dir / "samples", self.step, records)

    def _stop(self, error: RewardsFailing, saved: bool) -> None:
        """End a run that cannot learn; what it learned before is checkpointed, to resume once fixed."""
        if self.skips.trained_any and not saved:
            self.save()
        raise error

    def save(self) -> Path:
        """Checkpoint the run at the current step."""
        return self._write_checkpoint().commit()

    def _write_checkpoint(self) -> ckpt.Pending:
        """The current step's checkpoint, written under a temporary name; ``commit()`` makes it visible."""
        if self._data_prints is None:  # once per run: what a resume must find again (run_folder.data_differences)
            self._data_prints = ckpt.data_fingerprints(train_data_paths(self.cfg))
        state = {
            "kl_coef": self.kl_ctrl.value,
            "config": read_config_yaml(self.run_dir / "config.yaml"),
            "data": self._data_prints,
        }
        self.c.workers.pull_state(self.c)  # Ray: the driver's mirrors take the workers' optimizer and critic states
        return ckpt.write_components(self.c, self.run_dir / "checkpoints", self.step, state, self.cfg.trainer.keep_last)

    def _resume(self, folder: Path | None) -> None:
        if folder is None:
            return
        state = ckpt.restore_components(self.c, folder)
        self.c.workers.push_state(self.c)
        self.kl_ctrl.value = state["kl_coef"]
        self.step = int(state["step"])


def _schedule(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """The next step's learning rate. With Ray or FSDP workers the ranks' optimizers step and the driver's
    scheduler only sets the rate they are given, so torch's warning that this optimizer never stepped
    ("Detected call of `lr_scheduler.step()` before `optimizer.step()`") does not apply."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        scheduler.step()
