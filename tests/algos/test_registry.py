"""Registries: lookup by name, clear errors, no silent re-registration."""

from __future__ import annotations

import pytest

from queryrl.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, Registry, RegistryError


def double(x: int) -> int:
    return 2 * x


def triple(x: int) -> int:
    return 3 * x


def test_lookup_and_names() -> None:
    reg: Registry[object] = Registry("widget")
    reg.register("double")(double)
    assert reg.get("double") is double
    assert "double" in reg
    assert reg.names() == ["double"]
    assert len(reg) == 1


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(RegistryError, match=r"unknown policy loss 'ppo'.*cispo.*vanilla"):
        POLICY_LOSSES.get("ppo")
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'grpoo'.*gae.*grpo"):
        ADVANTAGE_ESTIMATORS.get("grpoo")


def test_registering_a_name_twice_with_different_code_is_refused() -> None:
    reg: Registry[object] = Registry("widget")
    reg.register("f")(double)
    reg.register("f")(double)  # the same function again is fine
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("f")(triple)
    assert reg.get("f") is double


def test_a_builtin_name_cannot_be_taken_over() -> None:
    with pytest.raises(RegistryError, match="already registered"):
        ADVANTAGE_ESTIMATORS.register("grpo")(ADVANTAGE_ESTIMATORS.get("rloo"))


def _load_plugin(reg: Registry[object], body: str) -> None:
    """Execute a user's plugin file as a fresh module, as loading it by path twice would."""
    source = f"@reg.register('plugin')\ndef plugin(x):\n    return {body}\n"
    exec(compile(source, "user_plugin.py", "exec"), {"reg": reg, "__name__": "user_plugin"})


def test_loading_the_same_plugin_twice_is_not_a_conflict() -> None:
    reg: Registry[object] = Registry("widget")
    _load_plugin(reg, "x + 1")
    _load_plugin(reg, "x + 1")  # same code, new function object
    with pytest.raises(RegistryError, match="already registered"):
        _load_plugin(reg, "x + 2")


def test_an_enum_member_registers_and_looks_up_by_its_value() -> None:
    """verl 0.9.1's test_register_with_enum: register_adv_est(AdvantageEstimator.X) is looked up as "x"."""
    from enum import Enum

    class Estimator(str, Enum):  # noqa: UP042 (verl's AdvantageEstimator is a str, Enum)
        DOUBLE = "double"

    class Plain(Enum):
        TRIPLE = "triple"

    reg: Registry[object] = Registry("widget")
    reg.register(Estimator.DOUBLE)(double)
    reg.register(Plain.TRIPLE, needs={"values"})(triple)
    assert reg.names() == ["double", "triple"]
    assert reg.get("double") is reg.get(Estimator.DOUBLE) is double
    assert reg.get("triple") is reg.get(Plain.TRIPLE) is triple
    assert Plain.TRIPLE in reg
    assert "triple" in reg
    assert reg.needs(Plain.TRIPLE) == {"values"}
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("triple")(double)
    reg.unregister(Plain.TRIPLE)
    assert "triple" not in reg


def test_a_lazy_entry_is_named_at_once_and_imported_when_asked_for() -> None:
    import sys

    reg: Registry[object] = Registry("widget")
    reg.register_lazy("json_dumps", "json:dumps", needs={"text"})
    reg.register("double")(double)
    assert reg.names() == ["double", "json_dumps"]
    assert "json_dumps" in reg
    assert len(reg) == 2
    assert reg.needs("json_dumps") == frozenset({"text"})
    assert reg.get("json_dumps") is sys.modules["json"].dumps
    with pytest.raises(RegistryError, match=r"unknown widget 'dumps'; valid names: double, json_dumps"):
        reg.get("dumps")


def test_a_lazy_name_is_not_taken_twice() -> None:
    reg: Registry[object] = Registry("widget")
    reg.register_lazy("w", "json:dumps")
    reg.register_lazy("w", "json:dumps")  # the same place again: fine
    with pytest.raises(RegistryError, match="already registered"):
        reg.register_lazy("w", "json:loads")
    with pytest.raises(RegistryError, match="already registered to json:dumps"):
        reg.register("w")(double)
    with pytest.raises(RegistryError, match="not 'module:attribute'"):
        reg.register_lazy("v", "json.dumps")


def test_the_backends_and_managers_are_named_before_their_modules_load() -> None:
    from queryrl.rewards.manager import REWARD_MANAGERS
    from queryrl.rollout.base import ROLLOUT_BACKENDS

    assert {"hf", "vllm"} <= set(ROLLOUT_BACKENDS.names())
    assert {"naive", "batch", "dapo", "parallel", "async"} <= set(REWARD_MANAGERS.names())
    assert REWARD_MANAGERS.get("async").__name__ == "AsyncRewardManager"
