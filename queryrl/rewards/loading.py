"""Loading reward functions: ``reward.function`` (one, verl- or TRL-style) and ``reward.functions`` (several
TRL-style functions with weights). Here, not beside the function contract (:mod:`.functions`) or the TRL
wrapper (:mod:`.trl_style`), because it needs both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from queryrl.plugins import PluginError, load_callable
from queryrl.rewards.functions import CUSTOM_REWARD_HINT, RewardError, RewardFn, default_compute_score
from queryrl.rewards.trl_style import TRLRewardFunction, WeightedTRLRewards, with_style


def load_reward_function(path: str | None, name: str = "compute_score", style: str = "auto") -> RewardFn:
    """The reward function: the built-ins when `path` is None, else `name` from the ``.py`` file at `path`,
    or from the importable module `path` (a dotted name such as ``queryrl.apps.query_rewrite.reward.score``:
    used when `path` is not an existing file and does not end in ``.py``).

    `style` (``reward.function.style``): ``verl``, ``trl`` or ``auto`` (detect by the signature,
    :func:`queryrl.rewards.trl_style.is_trl_style`). A TRL-style function comes back wrapped in a
    :class:`queryrl.rewards.trl_style.TRLRewardFunction`, which the managers call once per batch.

    Loaded as :func:`queryrl.plugins.load_callable` loads ``path:name``: a file is imported as a module
    of its own (registered in ``sys.modules`` under a name unique to its absolute path, so dataclasses
    and pickling by reference work inside it); a module path is imported normally.

    Raises:
        RewardError: the file is missing or not a ``.py`` file, the module is not found, either fails
            to import (the message carries the original error), has no attribute `name`, or that
            attribute is not callable; `style` is unknown, or ``trl`` for the built-ins.
    """
    if path is None or path == "":
        if style == "trl":
            raise RewardError(f"reward.function.style=trl needs a function of yours; {CUSTOM_REWARD_HINT}")
        return with_style(default_compute_score, "verl")
    try:
        fn = load_callable(f"{path}:{name}", what="reward function", hint="set reward.function.name")
    except PluginError as e:
        raise RewardError(str(e)) from e
    return with_style(fn, style)


def load_weighted_functions(
    entries: Sequence[Mapping[str, Any]], aggregation: str = "sum_then_normalize"
) -> WeightedTRLRewards:
    """``reward.functions``: each entry ``{path, name, style, weight}`` loaded like ``reward.function``
    (:func:`queryrl.rewards.load_reward_function`); each must be TRL-style (called once per batch).
    `aggregation`: ``reward.multi_objective_aggregation`` (:class:`WeightedTRLRewards`).

    Raises:
        RewardError: an entry without ``path``, a function that does not load, or one that is verl-style
            (the message names the entry).
    """
    members: list[tuple[TRLRewardFunction, float, str]] = []
    for i, entry in enumerate(entries):
        where = f"reward.functions[{i}]"
        if not entry.get("path"):
            raise RewardError(f"{where}: needs a path (a .py file or a module) and a name")
        fn = load_reward_function(
            str(entry["path"]), str(entry.get("name") or "compute_score"), entry.get("style") or "auto"
        )
        if not isinstance(fn, TRLRewardFunction):
            raise RewardError(
                f"{where} ({entry['path']}:{entry.get('name')}) is verl-style (one sample per call); several "
                "functions are combined the TRL way, each called once per batch: write it as "
                "f(prompts, completions, **kwargs), set its style: trl, or use reward.function alone"
            )
        label = getattr(fn.fn, "__name__", None) or f"function_{i}"
        if any(label == other for _, _, other in members):
            label = f"{label}_{i}"
        members.append((fn, float(entry.get("weight", 1.0)), label))
    return WeightedTRLRewards(members, aggregation)
