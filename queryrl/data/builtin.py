"""Built-in datasets, generated in code: a config names one as ``builtin://NAME/SPLIT``.

Each is written once, deterministically, as verl-format parquet into the cache folder, and the
path of the split's file is returned, so everything downstream reads it like any data file.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from queryrl.atomic import atomic_path

PREFIX = "builtin://"
TOY_TARGET = "hello"
TOY_PROMPTS = ("Say {w}.", "Please say {w}.", "Reply with the word {w}.", "Greet me: {w}!", "Answer {w} and stop.")


def toy_target_string(split: str) -> list[dict[str, Any]]:
    """Prompts asking for ``hello`` in several phrasings; the reward is string similarity to it.

    Deliberately trivial: a randomly initialised tiny model can learn it from reward alone in
    about a minute on one CPU thread, which is what the toy preset demonstrates.
    """
    rng = random.Random(f"toy_target_string/{split}")
    size = {"train": 512, "val": 32}.get(split)
    if size is None:
        raise ValueError(f"builtin://toy_target_string has splits train and val, not {split!r}")
    rows = []
    for i in range(size):
        word = TOY_TARGET
        rows.append(
            {
                "data_source": "toy/target_string",
                "prompt": [{"role": "user", "content": rng.choice(TOY_PROMPTS).format(w=word)}],
                "ability": "toy",
                "reward_model": {"style": "rule", "ground_truth": word},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


ARITHMETIC_SYSTEM = (
    'Call the calculator as <tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call>, '
    "read its result, then answer with the number."
)


def arithmetic_tool(split: str) -> list[dict[str, Any]]:
    """Arithmetic questions for the calculator agent (``configs/agent_calculator.yaml``).

    Each row asks for ``a op b`` (two-digit operands; + - *) and carries, in
    ``assistant_prefix``, a *forced* first assistant turn: the calculator call for the question,
    closed with ChatML's ``<|im_end|>``. The agent loop puts it in the response with mask 0 (the
    policy did not write it), runs the call and shows the result; the policy is trained on the
    turn it writes after that: the answer. A random tiny model never writes a well-formed call
    by itself, so this forcing is what makes its rollouts call the tool.
    """
    rng = random.Random(f"arithmetic_tool/{split}")
    size = {"train": 512, "val": 32}.get(split)
    if size is None:
        raise ValueError(f"builtin://arithmetic_tool has splits train and val, not {split!r}")
    rows = []
    for i in range(size):
        a, b, op = rng.randint(2, 99), rng.randint(2, 99), rng.choice("+-*")
        expression = f"{a} {op} {b}"
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        rows.append(
            {
                "data_source": "arithmetic/tool",
                "prompt": [
                    {"role": "system", "content": ARITHMETIC_SYSTEM},
                    {"role": "user", "content": f"What is {expression}? Use the calculator."},
                ],
                "ability": "math",
                "agent_name": "tool_agent",
                "assistant_prefix": f"<tool_call>{call}</tool_call><|im_end|>",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                # the call as an SFT target (queryrl sft): the policy learns to write it itself
                "extra_info": {
                    "split": split,
                    "index": i,
                    "expression": expression,
                    "sft_target": f"<tool_call>{call}</tool_call>",
                },
            }
        )
    return rows


BUILTIN_DATASETS: dict[str, Callable[[str], list[dict[str, Any]]]] = {
    "toy_target_string": toy_target_string,
    "arithmetic_tool": arithmetic_tool,
}
# bumped by a generator whose rows change, so a cached parquet of an older version is not reused
BUILTIN_VERSIONS: dict[str, int] = {"arithmetic_tool": 1}


def cache_root(cache_dir: str | None = None) -> Path:
    """``cache_dir``, else ``$QUERYRL_CACHE``, else ``~/.cache/queryrl``: built datasets and tiny models."""
    root = cache_dir or os.environ.get("QUERYRL_CACHE") or Path.home() / ".cache" / "queryrl"
    return Path(root)


def register_builtin_dataset(name: str, make_rows: Callable[[str], list[dict[str, Any]]], version: int = 0) -> None:
    """Make ``builtin://<name>/<split>`` available; an application calls this in its ``setup``."""
    existing = BUILTIN_DATASETS.get(name)
    if existing is not None and existing is not make_rows:
        raise ValueError(f"built-in dataset {name!r} is already registered")
    BUILTIN_DATASETS[name] = make_rows
    BUILTIN_VERSIONS[name] = version


def builtin_datasets() -> dict[str, Callable[[str], list[dict[str, Any]]]]:
    """The built-in datasets: the library's and the installed applications' (e.g. ``sales_demo``)."""
    from queryrl.application import load_apps

    load_apps()  # each application's setup registers its datasets
    return BUILTIN_DATASETS


def resolve_data_path(path: str, cache_dir: str | None = None) -> str:
    """`path` itself, or for ``builtin://NAME/SPLIT`` the generated parquet file's path."""
    if not path.startswith(PREFIX):
        return path
    name, _, split = path[len(PREFIX) :].partition("/")
    if name not in builtin_datasets():
        raise ValueError(f"unknown built-in dataset {name!r} in {path!r}; known: {', '.join(BUILTIN_DATASETS)}")
    version = BUILTIN_VERSIONS.get(name, 0)
    suffix = f".v{version}" if version else ""
    out = cache_root(cache_dir) / "data" / name / f"{split or 'train'}{suffix}.parquet"
    if not out.is_file():
        rows = BUILTIN_DATASETS[name](split or "train")
        with atomic_path(out) as tmp:
            pd.DataFrame(rows).to_parquet(tmp, index=False)
    return str(out)
