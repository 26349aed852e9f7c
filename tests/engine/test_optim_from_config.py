"""One way to build each role's optimizer: :func:`~queryrl.engine.optim.optimizer_from_config` from the role's node.

The actor's and SFT's optimizers are what the call sites built before from the same settings; the critic now
honours its own betas and schedule (it had AdamW's default betas and a constant rate after any warm-up); every
site (the local trainer, SFT, the Ray worker) builds through the one function.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from queryrl.config import ConfigError, load_config
from queryrl.engine import optim
from queryrl.engine.optim import make_optimizer, optimizer_from_config

PACKAGE = Path(__file__).resolve().parents[2] / "queryrl"
STEPS = (0, 1, 2, 3, 5, 8, 9, 10, 12)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))


def _groups(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def _rates(scheduler: torch.optim.lr_scheduler.LambdaLR) -> list[float]:
    return [scheduler.lr_lambdas[0](step) for step in STEPS]


@pytest.mark.parametrize(
    ("role", "overrides", "old"),
    [
        # actor: components.py's selection, field by field
        (
            "actor",
            [],
            {"lr": 1e-6, "weight_decay": 0.01, "betas": (0.9, 0.999), "warmup_steps": 0, "schedule": "constant"},
        ),
        (
            "actor",
            ["actor.lr=3e-5", "actor.betas=[0.8,0.95]", "actor.warmup_steps=2", "actor.lr_schedule=cosine",
             "actor.min_lr_ratio=0.1", "actor.weight_decay=0.05"],
            {"lr": 3e-5, "weight_decay": 0.05, "betas": (0.8, 0.95), "warmup_steps": 2, "schedule": "cosine",
             "min_lr_ratio": 0.1},
        ),
        # sft: sft.py's selection (fixed betas, which are sft.betas' default)
        (
            "sft",
            [],
            {"lr": 1e-4, "weight_decay": 0.0, "betas": (0.9, 0.999), "warmup_steps": 0, "schedule": "cosine"},
        ),
        (
            "sft",
            ["sft.warmup_steps=3", "sft.lr_schedule=linear", "sft.min_lr_ratio=0.2"],
            {"lr": 1e-4, "weight_decay": 0.0, "betas": (0.9, 0.999), "warmup_steps": 3, "schedule": "linear",
             "min_lr_ratio": 0.2},
        ),
    ],
)  # fmt: skip
def test_actor_and_sft_get_the_optimizer_the_sites_built_before(
    role: str, overrides: list[str], old: dict[str, Any]
) -> None:
    cfg = load_config(None, overrides)
    new_opt, new_sched = optimizer_from_config(_model().parameters(), cfg, role, total_steps=10)
    old_opt, old_sched = make_optimizer(_model().parameters(), total_steps=10, **old)
    assert _groups(new_opt) == _groups(old_opt)
    assert [p.shape for p in new_opt.param_groups[0]["params"]] == [p.shape for p in old_opt.param_groups[0]["params"]]
    assert _rates(new_sched) == _rates(old_sched)


def test_the_critic_honours_its_betas_and_schedule(model_cache: Path) -> None:
    from queryrl.trainer.components import _critic

    cfg = load_config(
        None,
        [
            f"model.cache_dir={model_cache}",
            "critic.lr=2e-5",
            "critic.betas=[0.8,0.95]",
            "critic.lr_warmup_steps=2",
            "critic.lr_schedule=linear",
            "critic.min_lr_ratio=0.25",
        ],
    )
    _, optimizer, scheduler = _critic(cfg, torch.device("cpu"), total_steps=10)
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.95)
    # warm-up 1/3, 2/3, then linear from 1 down to 0.25 at step 10
    expected = [1 / 3, 2 / 3, 1.0, 1 - 0.75 / 8, 1 - 0.75 * 3 / 8, 1 - 0.75 * 6 / 8, 1 - 0.75 * 7 / 8, 0.25, 0.25]
    assert _rates(scheduler) == pytest.approx(expected)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2e-5 / 3)


def test_the_critics_defaults_are_todays_behaviour() -> None:
    critic = load_config(None, []).critic
    assert (list(critic.betas), critic.lr_schedule, critic.min_lr_ratio) == ([0.9, 0.999], "constant", 0.0)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("critic.lr_schedule=step", "critic.lr_schedule"),
        ("critic.betas=[0.9]", "critic.betas must be two numbers"),
        ("sft.betas=[0.9,1.5]", "sft.betas must be two numbers"),
        ("critic.min_lr_ratio=2", "critic.min_lr_ratio"),
        ("critic.lr_warmup_steps=-1", "critic.lr_warmup_steps"),
    ],
)
def test_bad_optimizer_settings_are_one_clear_error(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_verl_critic_optim_keys_are_read() -> None:
    cfg = load_config(None, ["critic.optim.betas=[0.85,0.99]", "critic.optim.min_lr_ratio=0.5"])
    assert (list(cfg.critic.betas), cfg.critic.min_lr_ratio) == ([0.85, 0.99], 0.5)


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="no optimizer for role 'ref'"):
        optimizer_from_config(_model().parameters(), load_config(None, []), "ref", 1)


def _calls(path: Path, name: str) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)
    )


def test_no_site_assembles_an_optimizer_from_picked_arguments() -> None:
    # make_optimizer is called by optimizer_from_config alone; each building site calls optimizer_from_config
    callers = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if _calls(p, "make_optimizer")]
    assert callers == ["engine/optim.py"]
    assert _calls(PACKAGE / "engine" / "optim.py", "make_optimizer") == 1
    sites = {"trainer/components.py": 2, "trainer/sft.py": 1, "distributed/worker.py": 3}
    assert {site: _calls(PACKAGE / site, "optimizer_from_config") for site in sites} == sites


def test_the_ray_worker_builds_each_role_through_the_function(
    model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queryrl.distributed.worker import PolicyWorker

    roles: list[str] = []

    def recording(params: Any, cfg: Any, role: str, total_steps: int) -> Any:
        roles.append(role)
        return optimizer_from_config(params, cfg, role, total_steps)

    monkeypatch.setattr(optim, "optimizer_from_config", recording)
    cfg = load_config(
        None,
        [f"model.cache_dir={model_cache}", "algo.adv_estimator=gae", "ray.use_gpu=false", "critic.betas=[0.7,0.9]"],
    )
    worker = PolicyWorker(OmegaConf.to_container(cfg, resolve=True), 0, 1, roles=("actor", "critic"))  # type: ignore[arg-type]
    assert roles == ["actor", "critic"]
    assert worker.optimizers["critic"].param_groups[0]["betas"] == (0.7, 0.9)
    assert worker.optimizers["actor"].param_groups[0]["betas"] == (0.9, 0.999)
