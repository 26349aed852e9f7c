"""One config schema: structured dataclasses, YAML presets, dotted overrides, verl key aliases.

A run is ``queryrl train --config configs/X.yaml key.sub=value ...``. The schema is the whole
truth: an unknown key or a value of the wrong type is an error that names the key. The common
verl launch-script keys are accepted as aliases (see :data:`VERL_ALIASES`), with a leading ``+``
tolerated, so a verl user's script runs with only its entry point swapped.

- :mod:`~queryrl.config.schema`: the core dataclasses; applications add ``app.<name>`` at load time;
- :mod:`~queryrl.config.aliases`: verl's keys;
- :mod:`~queryrl.config.validation`: cross-field checks against the registries;
- :mod:`~queryrl.config.loading`: file + overrides -> a validated config; saving it redacted.
"""

from queryrl.config.aliases import VERL_ALIASES, VERL_WITHOUT_MEANING, translate_key
from queryrl.config.loading import as_list, known_keys, load_config, redacted, save_config
from queryrl.config.schema import (
    ActorConfig,
    AlgoConfig,
    ConfigError,
    CriticConfig,
    DataConfig,
    ModelConfig,
    QueryRLConfig,
    RayConfig,
    RewardConfig,
    RolloutConfig,
    SFTConfig,
    TrainerConfig,
    build_schema,
)
from queryrl.config.validation import check_precision, choice, validate

__all__ = [
    "VERL_ALIASES",
    "VERL_WITHOUT_MEANING",
    "ActorConfig",
    "AlgoConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "ModelConfig",
    "QueryRLConfig",
    "RayConfig",
    "RewardConfig",
    "RolloutConfig",
    "SFTConfig",
    "TrainerConfig",
    "as_list",
    "build_schema",
    "check_precision",
    "choice",
    "known_keys",
    "load_config",
    "redacted",
    "save_config",
    "translate_key",
    "validate",
]
