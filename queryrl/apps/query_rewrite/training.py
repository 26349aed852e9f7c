"""How the trainer runs the query-rewrite application (``app.query_rewrite.enable=true``).

The trainer stays generic; this module turns the ``app.query_rewrite`` config section into

- the reward's settings (:func:`~queryrl.apps.query_rewrite.config.settings_of`): the node as its dataclass,
  which :class:`~queryrl.apps.query_rewrite.reward.score.QueryRewriteReward` scores with on the ``async`` manager;
- for ``seed_hybrid``, the candidate selector (:func:`make_selector`): the users' recipe (v4.0) picks one
  candidate per group by the z-score of its sequence log-prob, only that candidate is judged, and
  the update is on the selected candidates only (groups of one: verl's GRPO gives a group of one
  mean 0 and std 1, so the advantage is the hybrid reward itself, a REINFORCE step without baseline).

Mode -> default weights over the reward components (``judge`` in [-1, 1], ``retrieval_rank`` in
[0, 2], ``format`` in [0, 1]; :data:`~queryrl.apps.query_rewrite.config.MODE_WEIGHTS`);
``app.query_rewrite.weights`` overrides any of them:

- ``group_judge``: judge 1, format 0.2;
- ``retrieval_rank``: retrieval_rank 1, format 0.2 (no judge call at all);
- ``mix``: judge 1, retrieval_rank 0.5, format 0.2;
- ``seed_hybrid``: ``gpt5_weight * (2q - 1) + grpo_weight * z`` (the weights of
  ``app.query_rewrite.seed_hybrid``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from queryrl.apps.query_rewrite.reward.modes import select_candidate
from queryrl.rollout import RolloutOutput

REWARD_FUNCTION = "queryrl.apps.query_rewrite.reward"


def make_selector(cfg: DictConfig) -> Callable[[RolloutOutput], tuple[Tensor, list[dict[str, Any]]]] | None:
    """The users' selector for ``seed_hybrid`` (None for every other mode).

    The returned function takes a step's rollout and returns the selected row of each group (in
    group order) and, per selected row, ``{"seed_hybrid_z": z}`` for the reward. The
    ``weighted_sample`` draws come from one generator seeded by ``trainer.seed``.
    """
    qr = cfg.app.query_rewrite
    if not (qr.enable and qr.reward_mode == "seed_hybrid"):
        return None
    method = str(qr.seed_hybrid.selection_method)
    rng = np.random.default_rng(int(cfg.trainer.seed))

    def select(out: RolloutOutput) -> tuple[Tensor, list[dict[str, Any]]]:
        seq_logprob = (out.rollout_logprobs * out.response_mask).sum(-1)  # (N,)
        rows: list[int] = []
        extras: list[dict[str, Any]] = []
        for group in torch.unique(out.prompt_index, sorted=True).tolist():
            members = (out.prompt_index == group).nonzero(as_tuple=True)[0]  # (G,)
            index, z = select_candidate(seq_logprob[members].double().numpy(), method, rng)
            rows.append(int(members[index]))
            extras.append({"seed_hybrid_z": z})
        return torch.tensor(rows, dtype=torch.long), extras

    return select
