"""The built-in scorers, verl's ``compute_score`` contract each (``reward.function.path`` may name any of
them; :data:`~queryrl.rewards.functions.BUILTIN_SCORERS` picks one by ``data_source``): ``gsm8k``, ``math``,
``math_dapo``, ``code`` (tests run in a sandbox: :mod:`.sandbox`, :mod:`.code_rpc`), ``format``, ``toy``,
``arithmetic``."""
