"""How the trainer runs the query-rewrite application (``app.query_rewrite.enable=true``).

The trainer stays generic; this module turns the ``app.query_rewrite`` config section into

- the reward: :func:`queryrl.apps.query_rewrite.reward.score.compute_score` on the ``async`` manager, with
  its keyword arguments (:func:`reward_kwargs`) derived from the mode, the weights, the judge and
  the RAG settings;
- for ``seed_hybrid``, the candidate selector (:func:`make_selector`): seed 000 v4.0 picks one
  candidate per group by the z-score of its sequence log-prob, only that candidate is judged, and
  the update is on the selected candidates only (groups of one: verl's GRPO gives a group of one
  mean 0 and std 1, so the advantage is the hybrid reward itself, a REINFORCE step without baseline).

Mode -> default weights over the reward components (``judge`` in [-1, 1], ``retrieval_rank`` in
[0, 2], ``format`` in [0, 1]); ``app.query_rewrite.weights`` overrides any of them:

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
from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from queryrl.apps.query_rewrite.reward.modes import select_candidate
from queryrl.rollout import RolloutOutput

REWARD_FUNCTION = "queryrl.apps.query_rewrite.reward"
MODE_WEIGHTS: dict[str, dict[str, float]] = {
    "group_judge": {"judge": 1.0, "retrieval_rank": 0.0, "format": 0.2},
    "retrieval_rank": {"judge": 0.0, "retrieval_rank": 1.0, "format": 0.2},
    "mix": {"judge": 1.0, "retrieval_rank": 0.5, "format": 0.2},
    "seed_hybrid": {"judge": 1.0, "retrieval_rank": 0.0, "format": 0.0},
}


def reward_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """``compute_score``'s keyword arguments for this config (``reward.kwargs`` entries win)."""
    qr = cfg.app.query_rewrite
    chosen = {str(k): float(v) for k, v in qr.weights.items() if v is not None}
    weights = MODE_WEIGHTS[qr.reward_mode] | chosen
    kwargs: dict[str, Any] = {
        "mode": qr.reward_mode,
        "weights": weights,
        "judge": qr.judge.backend,
        "judge_base_url": qr.judge.base_url,
        "judge_model": qr.judge.model,
        "judge_api_key_env": qr.judge.api_key_env,
        "judge_timeout_s": qr.judge.timeout_s,
        "judge_max_retries": qr.judge.max_retries,
        "judge_temperature": qr.judge.temperature,  # None: not sent (GPT-5 / o-series take only their default)
        "judge_max_tokens": qr.judge.max_tokens,
        "judge_token_limit_param": qr.judge.token_limit_param,
        "judge_reasoning_effort": qr.judge.reasoning_effort,
        "judge_extra_body": OmegaConf.to_container(qr.judge.extra_body, resolve=True) or None,
        "judge_lang": qr.judge.lang,
        "position_swap": qr.judge.position_swap,
        "rag_url": qr.rag.url,
        "rag_token_env": qr.rag.token_env,
        "rag_document_fields": dict(qr.rag.document_fields) or None,
        "corpus": qr.rag.corpus,
        "top_k": qr.rag.top_k,
        "rank_depth": qr.rag.rank_depth,
        "rag_timeout_s": qr.rag.timeout_s,
        "rag_max_retries": qr.rag.max_retries,
        "max_query_chars": qr.max_query_chars,
        "unparsed": qr.unparsed,
        "intent_penalty": qr.intent_penalty,
        "retriever": qr.rag.retriever,
        "embedder": qr.rag.embedder,
        "reference_rewriter": qr.rag.reference_rewriter,
        "reference_model": qr.rag.reference_model,
        "reference_base_url": qr.rag.reference_base_url,
        "reference_api_key_env": qr.rag.reference_api_key_env,
    }
    if qr.rag.reference_rewriter == "policy" and not qr.rag.reference_model:  # the frozen initial policy
        from queryrl.models import resolve_model_path

        kwargs["reference_model"] = str(resolve_model_path(cfg.model))
    if qr.reward_mode == "seed_hybrid":
        kwargs |= {"gpt5_weight": qr.seed_hybrid.gpt5_weight, "grpo_weight": qr.seed_hybrid.grpo_weight}
    extra = OmegaConf.to_container(cfg.reward.kwargs, resolve=True) if cfg.reward.kwargs else {}
    assert isinstance(extra, dict)
    return kwargs | {str(k): v for k, v in extra.items()}


def make_selector(cfg: DictConfig) -> Callable[[RolloutOutput], tuple[Tensor, list[dict[str, Any]]]] | None:
    """Seed 000's selector for ``seed_hybrid`` (None for every other mode).

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
