"""The RL math core: pure tensor functions, no config objects, no ``.item()`` in the math.

Same names and same numbers as verl 0.9.1's ``core_algos`` on the same inputs.
"""

from queryrl.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageFn,
    GroupIds,
    compute_advantages,
    group_index,
    group_mean_std,
)
from queryrl.algos.aggregation import LOSS_AGG_MODES, LossNormalizer, agg_loss
from queryrl.algos.kl import (
    KL_PENALTIES,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_in_reward,
    kl_penalty,
    make_kl_controller,
)
from queryrl.algos.masked import clip_by_value, masked_mean, masked_sum, masked_var, masked_whiten
from queryrl.algos.policy_losses import POLICY_LOSSES, PolicyLossFn, PolicyLossOutput
from queryrl.algos.value import entropy_from_logits, entropy_loss, value_loss
from queryrl.registry import Registry, RegistryError

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_PENALTIES",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageFn",
    "FixedKLController",
    "GroupIds",
    "KLController",
    "LossNormalizer",
    "PolicyLossFn",
    "PolicyLossOutput",
    "Registry",
    "RegistryError",
    "agg_loss",
    "apply_kl_in_reward",
    "clip_by_value",
    "compute_advantages",
    "entropy_from_logits",
    "entropy_loss",
    "group_index",
    "group_mean_std",
    "kl_penalty",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "value_loss",
]
