"""One name -> code registry, used wherever a config value chooses code.

Advantage estimators and policy losses (``algos``), rollout backends, agent loops, reward
managers, RAG rewriters and applications each have one :class:`Registry`. One signature per
registry (the registry is typed by it); an unknown name is an error that lists the valid names;
registering a name twice with different code is refused. An entry may declare what it needs from
its caller (``needs={"values"}``) so that the caller asks instead of testing names.

A registry that lives beside a base class its implementations import names them lazily
(:meth:`Registry.register_lazy`, ``"module:attribute"``): the name is valid at once, its module is imported
the first time it is asked for, and the registry's module imports none of them (no import cycle).

Only the standard library is imported here: every layer may use it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable[..., object])


class RegistryError(ValueError):
    """An unknown name, or a second registration of a name with different code."""


def _key(name: str | Enum) -> str:
    """The name an entry is stored under: an Enum member by its value, as verl's registries do
    (``register_adv_est(AdvantageEstimator.GRPO)`` and ``"grpo"`` are one entry)."""
    return str(name.value) if isinstance(name, Enum) else name


def _same_code(a: Callable[..., object], b: Callable[..., object]) -> bool:
    """True when `a` and `b` are the same function, also across a module reload."""
    if a is b:
        return True
    a, b = inspect.unwrap(a), inspect.unwrap(b)  # look through decorators such as no_grad
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (
        code_a is not None
        and code_b is not None
        and getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
        and code_a.co_code == code_b.co_code
        and code_a.co_consts == code_b.co_consts
        and code_a.co_names == code_b.co_names
    )


class Registry(Generic[F]):
    """Functions (or classes) of one signature, looked up by name.

    Args:
        kind: what the entries are, for error messages (e.g. ``"advantage estimator"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, F] = {}
        self._needs: dict[str, frozenset[str]] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attribute", imported on first use

    def register(self, name: str | Enum, *, needs: Iterable[str] = ()) -> Callable[[F], F]:
        """Decorator that registers a function under `name`.

        Args:
            name: the config value that chooses it (an Enum member: its value).
            needs: what the entry needs its caller to provide beyond the common signature (e.g. an
                advantage estimator's ``{"values"}`` from a critic); read with :meth:`needs`.
        """

        name = _key(name)

        def decorator(fn: F) -> F:
            lazy = self._lazy.get(name)
            if lazy is not None and lazy != f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}":
                raise RegistryError(f"{self.kind} {name!r} is already registered to {lazy}; pick another name")
            existing = self._fns.get(name)
            if existing is not None and not _same_code(existing, fn):
                raise RegistryError(
                    f"{self.kind} {name!r} is already registered to "
                    f"{getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', '?')}; "
                    "pick another name"
                )
            self._fns[name] = fn
            self._needs[name] = frozenset(needs)
            return fn

        return decorator

    def register_lazy(self, name: str | Enum, target: str, *, needs: Iterable[str] = ()) -> None:
        """Register `name` as ``"module:attribute"``, imported when :meth:`get` first asks for it.

        Args:
            name: the config value that chooses it.
            target: where the entry is, e.g. ``"queryrl.rollout.hf:make_hf_rollout"``.
            needs: as :meth:`register`'s.
        """
        name = _key(name)
        if ":" not in target:
            raise RegistryError(f"{self.kind} {name!r}: the lazy target {target!r} is not 'module:attribute'")
        if name in self._fns or self._lazy.get(name, target) != target:
            raise RegistryError(f"{self.kind} {name!r} is already registered; pick another name")
        self._lazy[name] = target
        self._needs[name] = frozenset(needs)

    def get(self, name: str | Enum) -> F:
        """The function registered under `name` (an Enum member: its value); an unknown name lists the valid ones."""
        name = _key(name)
        if name not in self._fns and name in self._lazy:
            module, attribute = self._lazy[name].split(":", 1)
            self._fns[name] = getattr(importlib.import_module(module), attribute)
        try:
            return self._fns[name]
        except KeyError:
            raise RegistryError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}") from None

    def needs(self, name: str | Enum) -> frozenset[str]:
        """What the entry `name` declared it needs (empty when nothing); an unknown name raises."""
        self.get(name)
        return self._needs.get(_key(name), frozenset())

    def unregister(self, name: str | Enum) -> None:
        """Remove `name` (a plugin unloading, a test cleaning up); an unknown name is ignored."""
        self._fns.pop(_key(name), None)
        self._needs.pop(_key(name), None)
        self._lazy.pop(_key(name), None)

    def names(self) -> list[str]:
        """The registered names (the lazy ones too), sorted."""
        return sorted(self._fns.keys() | self._lazy.keys())

    def __contains__(self, name: object) -> bool:
        key = _key(name) if isinstance(name, Enum | str) else name
        return key in self._fns or key in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
