"""``queryrl train``'s preflight: before any model is loaded, call what the rewards depend on, once.

A judge whose key is wrong, a RAG service that is down, or a reward file that raises on every sample
would otherwise cost the model load and a few skipped steps before the run stops
(``reward.max_skipped_steps``). The checks, in order, each printing one line on success and raising
:class:`PreflightError` with one message on failure:

1. the service checks the application contributes (the query-rewrite app: the judge's key variable,
   ``GET /models`` and one tiny request with its settings; the RAG service's ``GET /health``);
2. the reward function loads (a file that is missing or fails to import is a ``RewardError``) and
   scores the first row of the first training file. The response it scores is an application's reply for
   the row where it gives one (:attr:`RewardSpec.probe`; the query-rewrite app: the reference rewrite, in
   the answer format the row asks for), else the row's own ground truth when that is a string (e.g. a
   GSM8K answer), else the empty string; the line printed says which reply was scored. The check is that
   the function returns a number (or a dict with ``score``) without raising and within
   ``reward.timeout_s``, not what it returns. ``extra_info`` is the row's (no rollout extras such as
   ``num_tool_calls``). A TRL-style function (or ``reward.functions``) is only loaded, not called: TRL
   makes no such call, and a valid TRL function may read ``trainer_state`` or return None for a row.

``trainer.preflight=false`` skips all of it (``queryrl train --dry-run`` checks files and key
variables without calling anything).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from queryrl.data import line_byte_limit, load_records
from queryrl.data.builtin import resolve_data_path
from queryrl.rewards import RewardInput, RewardResult, load_reward_function
from queryrl.rewards.functions import RewardFn
from queryrl.rewards.loading import load_weighted_functions
from queryrl.rewards.manager import LoopRunner, score_sample
from queryrl.rewards.trl_style import TRLRewardFunction, describe_weighted

Check = Callable[[], str]  # returns the line to print; raises PreflightError
Probe = Callable[[Mapping[str, Any]], tuple[str, str]]  # a row -> (what the reply is, in words; the reply)


class PreflightError(RuntimeError):
    """A service or the reward function failed its check before training (the message says which)."""


@dataclass(frozen=True)
class RewardSpec:
    """The reward function the run will call: ``reward.function`` unless an application supplies its own."""

    path: str | None
    name: str
    kwargs: Mapping[str, Any]
    style: str = "auto"  # reward.function.style
    functions: tuple[Mapping[str, Any], ...] = ()  # reward.functions: several TRL-style ones, weighted
    aggregation: str = "sum_then_normalize"  # reward.multi_objective_aggregation
    fn: RewardFn | None = None  # an application's reward object, called as it is (path and name describe it)
    probe: Probe | None = None  # an application's reply to score the first row with (default: ground_truth_reply)

    def load(self) -> RewardFn:
        """The function the managers call (a weighted combination for ``reward.functions``).

        Raises:
            RewardError: as :func:`~queryrl.rewards.load_reward_function` and
                :func:`~queryrl.rewards.loading.load_weighted_functions`.
        """
        if self.fn is not None:
            return self.fn
        if self.functions:
            return load_weighted_functions(self.functions, self.aggregation)
        return load_reward_function(self.path, self.name, self.style)

    def describe(self) -> str:
        """How messages name it."""
        if self.functions:
            named = [(float(f["weight"]), f"{f['path']}:{f['name']}") for f in self.functions]
            return f"reward functions {describe_weighted(named)}"
        return f"reward function {self.name!r} of {self.path}" if self.path else "the built-in reward"


def config_reward_spec(cfg: DictConfig) -> RewardSpec:
    kwargs = OmegaConf.to_container(cfg.reward.kwargs, resolve=True) if cfg.reward.kwargs else {}
    assert isinstance(kwargs, dict)
    f = cfg.reward.function
    functions = OmegaConf.to_container(cfg.reward.functions, resolve=True) or []
    assert isinstance(functions, list)
    return RewardSpec(
        f.path,
        f.name,
        {str(k): v for k, v in kwargs.items()},
        f.style,
        tuple(functions),
        cfg.reward.multi_objective_aggregation,
    )


def run_preflight(
    cfg: DictConfig, say: Callable[[str], None], checks: Sequence[Check] = (), reward: RewardSpec | None = None
) -> None:
    """The checks of the module doc; `reward` defaults to ``reward.function``. Raises :class:`PreflightError`."""
    for check in checks:
        say(f"preflight: {check()}")
    say(f"preflight: {check_reward(cfg, reward or config_reward_spec(cfg))}")


def first_row(cfg: DictConfig) -> tuple[str, dict[str, Any]]:
    """(the first training file, its first row)."""
    path = str(cfg.data.train_files[0])
    limit = line_byte_limit(cfg.data.max_prompt_length)  # an overlong line is skipped here, counted by the loader
    rows = load_records(
        resolve_data_path(path, cfg.model.cache_dir), cfg.data.prompt_key, limit, on_overlong=lambda line, size: None
    )
    if not rows:
        raise PreflightError(f"data.train_files: {path} has no rows")
    return path, rows[0]


def shown(reply: str, limit: int = 80) -> str:
    """`reply` quoted for a message line, cut to `limit` characters."""
    return repr(reply if len(reply) <= limit else reply[: limit - 3] + "...")


def ground_truth_reply(row: Mapping[str, Any]) -> tuple[str, str]:
    """The reply scored where the application gives none: the row's ground truth when it is a string, else ''."""
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if isinstance(truth, str):
        return f"the reply {shown(truth)} (the row's reward_model.ground_truth)", truth
    return "an empty reply (the row has no string reward_model.ground_truth)", ""


def probe_input(row: Mapping[str, Any], reply: str) -> RewardInput:
    """The reward input of the check: `reply` as the response to `row`."""
    truth = (row.get("reward_model") or {}).get("ground_truth")
    return RewardInput(
        data_source=str(row.get("data_source", "")),
        solution_str=reply,
        ground_truth=truth,
        extra_info=dict(row.get("extra_info") or {}),
        row=row,  # a TRL-style function's prompts and columns
    )


def check_reward(cfg: DictConfig, spec: RewardSpec) -> str:
    """The reward function loads and scores the first training row (see the module doc)."""
    # RewardError: missing file, failed import, no such name
    fn = spec.load()
    what = spec.describe()
    if isinstance(fn, TRLRewardFunction):  # TRL calls it only in training, with training's arguments
        return f"{what}: a TRL-style function, loaded; not called before training (as TRL)"
    path, row = first_row(cfg)
    timeout_s = float(cfg.reward.timeout_s)
    scored, reply = (spec.probe or ground_truth_reply)(row)
    result = _score_with_timeout(fn, probe_input(row, reply), spec.kwargs, timeout_s)
    if result is None:
        raise PreflightError(
            f"{what} did not return within reward.timeout_s={timeout_s:g} s on the first row of {path} "
            "(trainer.preflight=false skips this check)"
        )
    if result.failed:
        raise PreflightError(
            f"{what} failed on {scored}, on the first row of {path}: {result.error} "
            "(trainer.preflight=false skips this check)"
        )
    return f"{what} scored {scored}, on the first row of {path}: {result.score:.4g}"


def _score_with_timeout(
    fn: Callable[..., Any], x: RewardInput, kwargs: Mapping[str, Any], timeout_s: float
) -> RewardResult | None:
    """``score_sample`` in a daemon thread (a function that hangs must not hang the CLI); None on timeout."""
    out: list[RewardResult] = []

    def run() -> None:
        loop = LoopRunner()
        try:
            out.append(score_sample(fn, x, kwargs, loop))
        finally:
            loop.close()

    worker = threading.Thread(target=run, name="queryrl-preflight-reward", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return out[0] if out else None
