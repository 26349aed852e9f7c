"""Parity with verl 0.9.1 on reference cases produced by verl's own functions.

Reads every ``*.json`` in ``$QUERYRL_GOLDEN_DIR`` (default: the committed cases in ``tests/golden/verl-0.9.1``,
whose README states their source, verl's version and licence; ``tools/verl_cases.py`` makes more). A case is
``{"name", "fn", "params", "inputs", "outputs"}``. Every case is checked; an unknown ``fn`` fails, and so does a
folder that is missing or holds no case: nothing here skips.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from queryrl.algos import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveKLController,
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    masked_whiten,
    value_loss,
)

ATOL, RTOL = 1e-5, 1e-4  # the golden README's tolerances (float32 inputs)
REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = Path(os.environ.get("QUERYRL_GOLDEN_DIR") or REPO / "tests" / "golden" / "verl-0.9.1")
ADVANTAGE_FNS = {
    "grpo",
    "grpo_passk",
    "rloo",
    "opo",
    "gpg",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "gae",
}
POLICY_LOSS_FNS = {"vanilla", "gspo", "cispo", "sapo", "gpg", "geo_mean"}
Case = dict[str, Any]


def _load_cases() -> list[tuple[str, Case]]:
    if not GOLDEN_DIR.is_dir():
        return []
    cases = []
    for path in sorted(GOLDEN_DIR.glob("*.json")):
        for case in json.loads(path.read_text())["cases"]:
            cases.append((f"{path.stem}:{case['name']}", case))
    return cases


CASES = _load_cases()


def t(x: Any) -> Tensor:
    return torch.tensor(x, dtype=torch.float32)


def close(actual: Tensor | float, expected: Any, what: str) -> None:
    actual_t = actual if isinstance(actual, Tensor) else torch.tensor(actual)
    torch.testing.assert_close(
        actual_t.detach().to(torch.float32), t(expected), atol=ATOL, rtol=RTOL, msg=lambda m: f"{what}: {m}"
    )


def check_advantages(case: Case) -> None:
    inp, params = case["inputs"], case["params"]
    values = t(inp["values"]) if "values" in inp else None
    baselines = t(inp["reward_baselines"]) if "reward_baselines" in inp else None
    adv, ret = ADVANTAGE_ESTIMATORS.get(case["fn"])(
        t(inp["token_level_rewards"]),
        t(inp["response_mask"]),
        group_ids=inp.get("index"),
        values=values,
        reward_baselines=baselines,
        gamma=params.get("gamma", 1.0),
        lam=params.get("lam", 1.0),
        epsilon=params.get("epsilon", 1e-6),
        norm_adv_by_std=params.get("norm_adv_by_std", params.get("norm_adv_by_std_in_grpo", True)),
    )
    close(adv, case["outputs"]["advantages"], "advantages")
    close(ret, case["outputs"]["returns"], "returns")


def loss_params(params: dict[str, Any]) -> dict[str, Any]:
    """verl's actor-config names -> keyword arguments (``clip_ratio`` fills an unset low/high)."""
    out = dict(params)
    clip_ratio = out.pop("clip_ratio", None)
    if clip_ratio is not None:
        out.setdefault("clip_ratio_low", clip_ratio)
        out.setdefault("clip_ratio_high", clip_ratio)
    for key in ("clip_ratio_low", "clip_ratio_high"):
        if out.get(key, 0) is None:
            out[key] = clip_ratio
    return out


def check_policy_loss(case: Case) -> None:
    inp, params = case["inputs"], loss_params(case["params"])
    log_prob = t(inp["log_prob"]).requires_grad_(True)
    weights = t(inp["rollout_is_weights"]) if inp.get("rollout_is_weights") is not None else None
    out = POLICY_LOSSES.get(case["fn"])(
        t(inp["old_log_prob"]),
        log_prob,
        t(inp["advantages"]),
        t(inp["response_mask"]),
        rollout_is_weights=weights,
        **params,
    )
    out.loss.backward()
    expected = case["outputs"]
    close(out.loss, expected["loss"], "loss")
    assert log_prob.grad is not None
    close(log_prob.grad, expected["grad_log_prob"], "grad_log_prob")
    for key, value in expected.items():
        if key.startswith("actor/"):
            metric = key.removeprefix("actor/")
            assert metric in out.metrics, f"metric {metric} missing"
            close(out.metrics[metric], value, key)


def check_agg_loss(case: Case) -> None:
    inp = case["inputs"]
    loss = agg_loss(t(inp["loss_mat"]), t(inp["loss_mask"]), case["params"]["loss_agg_mode"])
    close(loss, case["outputs"]["loss"], "loss")


def check_kl(case: Case) -> None:
    inp = case["inputs"]
    log_prob = t(inp["log_prob"]).requires_grad_(True)
    mask = t(inp["response_mask"])
    kl = kl_penalty(log_prob, t(inp["ref_log_prob"]), case["params"]["kl_penalty"])
    (kl * mask).sum().backward()
    close(kl, case["outputs"]["kl"], "kl")
    assert log_prob.grad is not None
    close(log_prob.grad, case["outputs"]["grad_log_prob_of_masked_sum"], "grad of sum(kl * mask)")


def check_value_loss(case: Case) -> None:
    inp, params = case["inputs"], case["params"]
    loss, clipfrac = value_loss(
        t(inp["vpreds"]),
        t(inp["returns"]),
        t(inp["values"]),
        t(inp["response_mask"]),
        cliprange_value=params["cliprange_value"],
        loss_agg_mode=params["loss_agg_mode"],
    )
    close(loss, case["outputs"]["loss"], "loss")
    close(clipfrac, case["outputs"]["clipfrac"], "clipfrac")


def check_entropy(case: Case) -> None:
    inp = case["inputs"]
    entropy = entropy_from_logits(t(inp["logits"]))
    close(entropy, case["outputs"]["entropy"], "entropy")
    loss = agg_loss(entropy, t(inp["response_mask"]), case["params"]["loss_agg_mode"])
    close(loss, case["outputs"]["loss"], "loss")


def check_masked_whiten(case: Case) -> None:
    inp = case["inputs"]
    close(masked_whiten(t(inp["values"]), t(inp["response_mask"])), case["outputs"]["whitened"], "whitened")


def check_adaptive_kl(case: Case) -> None:
    params, inp = case["params"], case["inputs"]
    ctrl = AdaptiveKLController(params["init_kl_coef"], params["target_kl"], params["horizon"])
    trajectory = []
    for current_kl, n_steps in zip(inp["current_kl"], inp["n_steps"], strict=True):
        ctrl.update(current_kl, n_steps)
        trajectory.append(ctrl.value)
    close(torch.tensor(trajectory, dtype=torch.float64), case["outputs"]["kl_coef"], "kl_coef")


CHECKS: dict[str, Callable[[Case], None]] = {
    **dict.fromkeys(ADVANTAGE_FNS, check_advantages),
    **dict.fromkeys(POLICY_LOSS_FNS - {"gpg"}, check_policy_loss),
    "agg_loss": check_agg_loss,
    "kl_penalty": check_kl,
    "value_loss": check_value_loss,
    "entropy": check_entropy,
    "masked_whiten": check_masked_whiten,
    "adaptive_kl_controller": check_adaptive_kl,
}


def _check(case: Case) -> None:
    fn = case["fn"]
    if fn == "gpg":  # the name is both an estimator and a loss: the inputs say which
        (check_policy_loss if "log_prob" in case["inputs"] else check_advantages)(case)
        return
    if fn not in CHECKS:
        pytest.fail(f"golden case {case['name']!r} has fn {fn!r}, which this test does not know how to check")
    CHECKS[fn](case)


def test_golden_folder_has_cases() -> None:
    assert GOLDEN_DIR.is_dir(), f"no golden folder at {GOLDEN_DIR} (QUERYRL_GOLDEN_DIR names another one)"
    assert CASES, f"{GOLDEN_DIR} holds no cases"


@pytest.mark.parametrize(("case_id", "case"), CASES, ids=[c[0] for c in CASES])
def test_verl_parity(case_id: str, case: Case) -> None:
    _check(case)


def test_the_committed_cases_say_where_they_come_from() -> None:
    """The shipped cases are verl 0.9.1's outputs, and their README says so with verl's licence."""
    shipped = REPO / "tests" / "golden" / "verl-0.9.1"
    readme = (shipped / "README.md").read_text(encoding="utf-8")
    for needed in ("verl", "0.9.1", "Apache License 2.0", "tools/verl_cases.py", "QUERYRL_GOLDEN_DIR"):
        assert needed in readme, f"{shipped / 'README.md'} does not say {needed!r}"
    sources = {json.loads(p.read_text())["source"] for p in shipped.glob("*.json")}
    assert sources, f"{shipped} holds no case file"
    assert all(s.startswith("verl==0.9.1 ") for s in sources), sources
