"""Helpers shared by the agent tests: a rollout backend that replays scripted turns, tool-call text."""

from __future__ import annotations

import json
from typing import Any

import torch

from queryrl.rollout import RolloutOutput, SamplingParams, left_pad

NOEOS = "<noeos>"  # a scripted turn ending with this marker is cut before its EOS


def fake_logprob(token: int) -> float:
    """The scripted policy's log-prob of `token`: distinct per token, so misalignment shows."""
    return -0.001 * (token + 1)


class ScriptedPolicy:
    """A rollout backend that replays predetermined turns.

    Each prompt's first token names its script; the policy answers the script's turns in order,
    whatever the context. Every call's contexts are recorded.
    """

    def __init__(self, tokenizer: Any, scripts: dict[int, list[str]]) -> None:
        self.tok = tokenizer
        self.scripts = scripts
        self.turn: dict[int, int] = dict.fromkeys(scripts, 0)
        self.contexts: list[list[list[int]]] = []

    def ids(self, text: str) -> list[int]:
        if text.endswith(NOEOS):
            return list(self.tok(text[: -len(NOEOS)], add_special_tokens=False)["input_ids"])
        return [*self.tok(text, add_special_tokens=False)["input_ids"], self.tok.eos_token_id]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutOutput:
        assert params.n == 1
        self.contexts.append([list(p) for p in prompts])
        turns = []
        for p in prompts:
            key = p[0]
            turns.append(self.ids(self.scripts[key][self.turn[key]])[: params.max_new_tokens])
            self.turn[key] += 1
        width = max(len(t) for t in turns)
        ids = torch.full((len(turns), width), self.tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(turns), width)
        lps = torch.zeros(len(turns), width)
        for i, t in enumerate(turns):
            ids[i, : len(t)] = torch.tensor(t)
            mask[i, : len(t)] = 1
            lps[i, : len(t)] = torch.tensor([fake_logprob(x) for x in t])
        prompt_ids, prompt_mask = left_pad(prompts, self.tok.pad_token_id)
        return RolloutOutput(
            prompt_ids, prompt_mask, ids, mask, lps, torch.arange(len(turns)), torch.zeros(len(turns), dtype=torch.bool)
        )

    def update_weights(self, source: Any) -> None:
        pass


def call(name: str, **arguments: Any) -> str:
    """A Hermes-style tool call of `name` with `arguments`, as the policy would write it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
