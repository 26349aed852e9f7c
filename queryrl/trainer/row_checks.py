"""Rows the run's reward cannot score, found before anything loads.

The built-in reward (no application, no ``reward.function.path``, no ``reward.functions``) compares each
response against the row's ``reward_model.ground_truth``; a row whose ``reward_model`` is null, or holds no
``ground_truth``, was scored against the string ``"None"`` and trained on it. Such a row is a
:class:`~queryrl.data.DataError` naming file and row: in the plan (``queryrl train`` and ``--dry-run`` stop
there) and when the trainer loads the data. A function of the user's, or an application's reward (the
query-rewrite app's rows may have no gold), decides itself what a row without ground truth means.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from queryrl.application import enabled_app
from queryrl.data import DataError, line_byte_limit, load_records
from queryrl.rewards.functions import builtin_scorer


def truth_rule(cfg: DictConfig) -> Callable[[str], bool] | None:
    """Whether a row of a ``data_source`` needs ``reward_model.ground_truth`` under `cfg`'s reward: those the
    built-in reward scores, when the run uses it; None when the reward is the user's or an application's."""
    if enabled_app(cfg) is not None or cfg.reward.function.path or cfg.reward.functions:
        return None
    return lambda source: builtin_scorer(source) is not None


def row_problem(cfg: DictConfig) -> str | None:
    """The first row of the train and validation files that `cfg`'s reward cannot score (see the module doc), as
    one line naming file and row; None when every row can be scored or the reward decides for itself."""
    rule = truth_rule(cfg)
    if rule is None:
        return None
    limit = line_byte_limit(cfg.data.max_prompt_length)  # an overlong line is skipped here, counted by the loader
    for f in [*cfg.data.train_files, *cfg.data.val_files]:
        path = Path(str(f)).expanduser()
        if str(f).startswith("builtin://") or not path.is_file():
            continue  # built-in data carries its answers; a missing file is a problem of its own in the plan
        try:
            load_records(path, cfg.data.prompt_key, limit, lambda line, size: None, rule)
        except DataError as exc:
            return str(exc)
    return None
