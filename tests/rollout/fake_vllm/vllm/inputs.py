"""vLLM's ``TokensPrompt``: a dict with the prompt's token ids."""

from __future__ import annotations

from typing import TypedDict


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]
