"""The reward: parsing the answer, retrieval, the judge, the intent check, the mix.

``queryrl.apps.query_rewrite.reward:compute_score`` (a reward function path in configs and saved runs) is
:func:`.score.compute_score`, loaded when first asked for (a submodule's import does not load it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["QueryRewriteReward", "compute_score"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from queryrl.apps.query_rewrite.reward import score

        return getattr(score, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
