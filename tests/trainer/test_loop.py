"""The training loop on the tiny model: GRPO and PPO steps, invariance, resume, LoRA, rewards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg, metrics_of, params


@pytest.mark.slow
def test_grpo_steps_run_and_change_the_parameters(tmp_path: Path, model_cache: Path) -> None:
    trainer = Trainer(make_cfg(tmp_path, model_cache))
    before = params(trainer.c.policy.model)
    metrics = trainer.fit()
    after = params(trainer.c.policy.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for key in [
        "critic/score/mean",
        "critic/advantages/mean",
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
        "response_length/mean",
        "timing_s/gen",
        "timing_s/update_actor",
        "perf/throughput",
    ]:
        assert key in metrics, key
    rows = metrics_of(tmp_path / "toy_grpo")
    assert [r["step"] for r in rows] == [1, 2]
    assert (tmp_path / "toy_grpo" / "checkpoints" / "step_2" / "state.json").is_file()
    assert (tmp_path / "toy_grpo" / "samples" / "step_2.jsonl").is_file()
    saved = (tmp_path / "toy_grpo" / "config.yaml").read_text()
    assert "toy_target_string" in saved


def test_ppo_gae_steps_train_actor_and_critic(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_cfg(
        tmp_path,
        model_cache,
        "algo.adv_estimator=gae",
        "algo.lam=0.95",
        "actor.ppo_epochs=2",
        "actor.ppo_mini_batch_size=2",
        "trainer.total_steps=3",
        "critic.warmup_steps=1",
    )
    trainer = Trainer(cfg)
    assert trainer.c.critic is not None
    actor0, critic0 = params(trainer.c.policy.model), params(trainer.c.critic)
    trainer.fit()
    rows = metrics_of(tmp_path / "toy_grpo")
    assert "actor/pg_loss" not in rows[0], "critic warm-up: no actor update at step 1"
    assert "critic/vf_loss" in rows[0]
    assert "actor/pg_loss" in rows[2]
    assert "critic/values/mean" in rows[2]
    assert any(not torch.equal(actor0[k], v) for k, v in params(trainer.c.policy.model).items())
    assert any(not torch.equal(critic0[k], v) for k, v in params(trainer.c.critic).items())


def _captured_actor_grads(tmp_path: Path, model_cache: Path, micro: int) -> list[torch.Tensor]:
    trainer = Trainer(
        make_cfg(
            tmp_path / f"m{micro}",
            model_cache,
            f"actor.ppo_micro_batch_size={micro}",
            "actor.use_kl_loss=true",
            "actor.entropy_coeff=0.01",
            "actor.loss_agg_mode=seq-mean-token-mean",
        )
    )
    grads: list[torch.Tensor] = []
    opt = trainer.c.optimizer

    def record(*args: Any, **kwargs: Any) -> None:
        grads.extend(p.grad.clone() for p in trainer.c.trainable_params if p.grad is not None)

    opt.step = record  # type: ignore[method-assign]
    trainer.fit(max_steps=1)
    return grads


def test_micro_batch_size_does_not_change_the_update(tmp_path: Path, model_cache: Path) -> None:
    full = _captured_actor_grads(tmp_path, model_cache, micro=16)  # the whole mini-batch at once
    for micro in (1, 3):  # uneven splits, each micro-batch trimmed to its own lengths
        split = _captured_actor_grads(tmp_path, model_cache, micro=micro)
        assert len(split) == len(full)
        for a, b in zip(split, full, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(
    "estimator",
    [("algo.adv_estimator=grpo",), ("algo.adv_estimator=gae", "critic.warmup_steps=1")],
    ids=["grpo", "ppo"],
)
def test_resumed_run_ends_with_the_same_parameters(
    tmp_path: Path, model_cache: Path, estimator: tuple[str, ...]
) -> None:
    """PPO too: its critic (backbone and value head) and the critic's optimizer come back from the checkpoint."""
    overrides = ("trainer.total_steps=4", "actor.ppo_epochs=2", "actor.ppo_mini_batch_size=2", "actor.use_kl_loss=true",
                 "trainer.save_every=2", *estimator)  # fmt: skip
    straight = Trainer(make_cfg(tmp_path / "a", model_cache, *overrides))
    straight.fit()

    first = Trainer(make_cfg(tmp_path / "b", model_cache, *overrides))
    first.fit(max_steps=2)
    del first
    resumed = Trainer(make_cfg(tmp_path / "b", model_cache, *overrides))
    assert resumed.step == 2
    resumed.fit()

    a, b = params(straight.c.policy.model), params(resumed.c.policy.model)
    if straight.c.critic is not None:
        assert resumed.c.critic is not None
        a |= {f"critic.{k}": v for k, v in params(straight.c.critic).items()}
        b |= {f"critic.{k}": v for k, v in params(resumed.c.critic).items()}
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=0, rtol=0, msg=k)
    assert [r["step"] for r in metrics_of(tmp_path / "b" / "toy_grpo")] == [1, 2, 3, 4]


def test_lora_trains_adapters_only_and_the_reference_is_the_base(tmp_path: Path, model_cache: Path) -> None:
    trainer = Trainer(make_cfg(tmp_path, model_cache, "model.lora.rank=4", "actor.use_kl_loss=true"))
    assert trainer.c.policy.lora
    assert trainer.c.policy.ref_model is None
    before = params(trainer.c.policy.model)
    trainer.fit()
    after = params(trainer.c.policy.model)
    lora = [k for k in before if "lora_" in k]
    base = [k for k in before if "lora_" not in k]
    assert lora
    assert base
    assert all(torch.equal(before[k], after[k]) for k in base)
    assert any(not torch.equal(before[k], after[k]) for k in lora)


def test_kl_in_reward_with_an_adaptive_controller(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_cfg(
        tmp_path,
        model_cache,
        "algo.use_kl_in_reward=true",
        "algo.kl_ctrl.type=adaptive",
        "algo.kl_ctrl.kl_coef=0.1",
        "algo.kl_ctrl.target_kl=0.01",
        "algo.kl_ctrl.horizon=10",
        "trainer.total_steps=3",
    )
    trainer = Trainer(cfg)
    trainer.fit()
    rows = metrics_of(tmp_path / "toy_grpo")
    assert all("actor/reward_kl_penalty" in r for r in rows)
    assert rows[0]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    assert trainer.kl_ctrl.value != pytest.approx(0.1)  # moved by the controller


def test_custom_reward_file_and_failed_samples_are_dropped(tmp_path: Path, model_cache: Path) -> None:
    reward = tmp_path / "my_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if extra_info['index'] % 2:\n"
        "        raise RuntimeError('judge down')\n"
        "    return {'score': 0.5, 'bonus': 1.0, 'answer': 'x' + str(extra_info['index']), 'gone': None}\n"
    )
    cfg = make_cfg(
        tmp_path,
        model_cache,
        f"custom_reward_function.path={reward}",
        "trainer.total_steps=1",
        "trainer.save_samples=4",
    )
    metrics = Trainer(cfg).fit()
    assert metrics["reward/failed"] > 0
    assert metrics["critic/score/mean"] == pytest.approx(0.5)
    assert metrics["reward/bonus/mean"] == pytest.approx(1.0)
    assert metrics["reward/zero_std_group_frac"] == pytest.approx(1.0)
    samples = [
        json.loads(line) for line in (tmp_path / "toy_grpo" / "samples" / "step_1.jsonl").read_text().splitlines()
    ]
    kept = [s for s in samples if not s.get("failed")]
    failed = [s for s in samples if s.get("failed")]
    assert len(kept) == 4
    # the reward's other numbers, and its other values but None, for the run page
    assert all(s["reward_parts"] == {"bonus": 1.0} for s in kept)
    assert all(s["reward_info"]["answer"].startswith("x") and "gone" not in s["reward_info"] for s in kept)
    # failed samples are not trained on, but kept in the file with their error (at most save_samples of them)
    assert 0 < len(failed) <= 4
    assert all(s["score"] is None and "judge down" in s["error"] and s["response"] is not None for s in failed)


def test_validation_reports_per_data_source(tmp_path: Path, model_cache: Path) -> None:
    cfg = make_cfg(
        tmp_path,
        model_cache,
        "data.val_files=[builtin://toy_target_string/val]",
        "data.max_val_samples=8",
        "trainer.total_steps=1",
    )
    metrics = Trainer(cfg).fit()
    assert "val/toy/target_string/score/mean" in metrics
    assert "val/score/mean" in metrics


def test_an_unavailable_device_is_a_clear_error(tmp_path: Path, model_cache: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        Trainer(make_cfg(tmp_path, model_cache, "trainer.device=cuda"))


def test_overlong_prompts_are_filtered_counted_and_reported(tmp_path: Path, model_cache: Path) -> None:
    from queryrl.data import build_prompt_dataset
    from queryrl.data.builtin import resolve_data_path
    from queryrl.models import load_tokenizer

    cfg = make_cfg(tmp_path, model_cache, "trainer.total_steps=1")
    path = resolve_data_path("builtin://toy_target_string/train", str(model_cache))
    full = build_prompt_dataset(path, load_tokenizer(cfg.model), max_prompt_length=10_000)
    longest = max(len(item.input_ids) for item in full.items)
    expected = sum(len(item.input_ids) == longest for item in full.items)
    with pytest.warns(UserWarning, match="prompts longer than data.max_prompt_length"):
        trainer = Trainer(
            make_cfg(tmp_path, model_cache, "trainer.total_steps=1", f"data.max_prompt_length={longest - 1}")
        )
    metrics = trainer.fit()
    assert metrics["data/filtered_prompts"] == expected
