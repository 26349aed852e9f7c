"""Applications: plugins that bring a config node, a reward, a selector, services and commands.

The library never imports an application. An application is a :class:`Application` subclass,
published under the ``queryrl.apps`` entry-point group of its package (queryrl's own
``query_rewrite`` is, in ``pyproject.toml``), or registered in code with :func:`register_app`.
:func:`load_apps` imports the installed ones once; the config schema then holds a node
``app.<name>`` for each, and the trainer, the planner, preflight and the CLI ask the enabled
application (``app.<name>.enable: true``) for what they need instead of knowing it.

    class MyApp(Application):
        name = "my_app"
        config = MyAppConfig          # a dataclass with an ``enable: bool`` field

        def reward(self, cfg):
            return AppReward(MyReward(cfg.app.my_app), manager="async")

Only the standard library and :mod:`queryrl.registry` are imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

from queryrl.registry import Registry

ENTRY_POINT_GROUP = "queryrl.apps"


@dataclass(frozen=True)
class AppReward:
    """What an application scores with.

    Attributes:
        fn: the reward function, verl's contract ``fn(data_source, solution_str, ground_truth,
            extra_info=None, **kwargs) -> float | dict`` (sync or async). An object may also have
            ``pop_metrics() -> dict[str, float]``: the manager adds what it returns to each step's metrics.
        kwargs: keyword arguments for every call (the application's settings, from its config node).
        manager: the reward manager it runs under when ``reward.manager`` is ``auto``.
        label: how the plan names it (e.g. ``"query_rewrite app, reward_mode mix"``).
    """

    fn: Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    manager: str = "naive"
    label: str = ""


@dataclass(frozen=True)
class CommandLine:
    """What an application's :meth:`Application.commands` adds its commands to.

    Attributes:
        app: the ``queryrl`` command (a ``typer.Typer``).
        prepare: ``queryrl prepare`` (a ``typer.Typer``): data preparation commands.
        guard: wraps a command so that a known error (``queryrl.errors``) is one line and exit 2.
    """

    app: Any
    prepare: Any
    guard: Callable[[Any], Any]


class Application:
    """Base class of an application; every hook has a do-nothing default.

    Attributes:
        name: the config node's name (``app.<name>``) and the registry's key.
        config: the node's dataclass; it must have an ``enable: bool`` field.
        aliases: extra config-key aliases, as ``config.VERL_ALIASES`` (``"x.y.*": "app.<name>.z.*"``).
        free_form: dotted keys of dict-typed fields whose keys are the user's.
        resume_may_differ: dotted keys (or prefixes ending in ``.``) that may change when a run resumes.
    """

    name: ClassVar[str] = ""
    config: ClassVar[type] = object
    aliases: ClassVar[Mapping[str, str]] = {}
    free_form: ClassVar[tuple[str, ...]] = ()
    resume_may_differ: ClassVar[tuple[str, ...]] = ()

    def setup(self) -> None:
        """Register what the application adds to the library's registries (datasets, rewriters); runs once."""

    def resolve(self, cfg: Any) -> None:
        """After the file and the overrides are applied: derive keys from others (e.g. launch-script keys)."""

    def validate(self, cfg: Any) -> None:
        """Cross-field checks of the application's node (and of the rest of the config it relies on)."""

    def reward(self, cfg: Any) -> AppReward | None:
        """The reward when enabled; None = the config's ``reward.function``."""
        return None

    def reward_plan(self, cfg: Any) -> tuple[str, str] | None:
        """(label, manager) of :meth:`reward` for ``--dry-run``, which loads and writes nothing: override it
        where building the reward does (query_rewrite's resolves the reference model folder)."""
        spec = self.reward(cfg)
        return (spec.label or self.name, spec.manager) if spec is not None else None

    def selector(self, cfg: Any) -> Any:
        """A callable choosing the rollout rows to score and train on, or None (every row)."""
        return None

    def preflight(self, cfg: Any) -> tuple[list[Any], Any]:
        """The service checks (``queryrl.trainer.preflight.Check``) and the reward spec to try before step 1."""
        return [], None

    def plan(self, cfg: Any, add: Callable[..., None], problem: Callable[[str], None]) -> None:
        """Lines for ``--dry-run``'s plan (``add(title, *lines)``) and the problems that would stop the run."""

    def commands(self, cli: CommandLine) -> None:
        """Add the application's commands to the ``queryrl`` command line."""

    def sft_targets(
        self, cfg: Any, source: str, rows: Sequence[tuple[int, Mapping[str, Any]]]
    ) -> Sequence[tuple[str, str] | None] | None:
        """``queryrl sft``'s targets where the application makes them itself (e.g. from its service).

        Args:
            cfg: the run's config.
            source: the file the rows come from (for messages).
            rows: (row index in the file, row) of each example.

        Returns:
            Per row, (target, where it came from) or None (the row's own, at ``sft.target_key``); None for all
            rows alike (the default).
        """
        return None

    def vocab_texts(self, cfg: Any) -> Iterable[str]:
        """Texts whose tokens a run with ``model.vocab.restrict`` keeps besides its data's (e.g. a knowledge base
        the policy's answers copy names from); none by default."""
        return ()

    def learning_problem(self, cfg: Any, metrics: Mapping[str, float]) -> str | None:
        """Why one training step's `metrics` show that the run cannot learn (e.g. no answer parsed), or None.

        A step with a problem counts toward ``trainer.max_no_signal_steps`` as a step whose groups all had
        equal rewards does: the trainer says it on the console and stops the run with exit 3 after that many
        steps in a row, naming the problem."""
        return None


APPS: Registry[Any] = Registry("application")
_loaded = False


def register_app(app: Application) -> Application:
    """Register `app` (an instance) under ``app.name`` and run its :meth:`Application.setup`."""
    if not app.name or not app.name.isidentifier():
        raise ValueError(f"an application needs a name that is a Python identifier, got {app.name!r}")
    if app.name in APPS:
        existing = APPS.get(app.name)
        if existing is app or type(existing) is type(app):  # the same plugin found twice (entry point and code)
            return existing
        raise ValueError(f"application {app.name!r} is already registered to {type(existing).__qualname__}")
    APPS.register(app.name)(app)
    app.setup()
    return app


def load_apps() -> list[Application]:
    """The installed applications (entry-point group ``queryrl.apps``), imported on the first call."""
    global _loaded
    if not _loaded:
        _loaded = True
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            obj = ep.load()
            app = obj() if isinstance(obj, type) else obj
            if not isinstance(app, Application):
                raise TypeError(f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}) is not an Application")
            register_app(app)
    return [APPS.get(name) for name in APPS.names()]


def enabled_app(cfg: Any) -> Application | None:
    """The application whose node has ``enable: true`` in `cfg` (validation allows at most one)."""
    for app in load_apps():
        node = getattr(cfg.app, app.name, None) if "app" in cfg else None
        if node is not None and node.get("enable", False):
            return app
    return None


def learning_problem_check(cfg: Any) -> Callable[[Mapping[str, float]], str | None] | None:
    """The enabled application's :meth:`Application.learning_problem` for `cfg`, as a function of a step's
    metrics (None without an enabled application)."""
    app = enabled_app(cfg)
    if app is None:
        return None
    return lambda metrics: app.learning_problem(cfg, metrics)
