"""A model folder as the reference pipeline's rewriter: e.g. the frozen initial policy.

The users' reference is their 32B pipeline; without one, the natural reference for "did training help"
is the policy as it was before RL: the same prompt (:func:`~queryrl.apps.query_rewrite.prompts.build_messages`
with the data's domain line and answer fields: pass the ones the rows were prepared with), greedy
decoding, and the reward's parser (:func:`~queryrl.apps.query_rewrite.reward.modes.parse_answer`): a reply
cut off after a complete query is used, and an empty query ("no retrieval needed") is returned as is, so
the reference retrieves nothing on small talk, as the heuristic reference does. Registered as
``"policy"`` in :data:`queryrl.rag.rewriters.REWRITERS` when :mod:`queryrl.apps` is imported, so
``queryrl serve-rag --rewriter policy --model PATH`` serves it (and
``app.query_rewrite.rag.reference_rewriter=policy`` uses it in the embedded service).

The model never changes: it is loaded once, in eval mode, and calls are serialised by a lock (one
``generate`` at a time; the RAG service caches the reference per prompt anyway). An answer that does
not parse falls back to the last user turn, so the reference pipeline always answers; the fallbacks
are counted in :attr:`PolicyRewriter.fallbacks`, the cut-off replies in :attr:`PolicyRewriter.truncated`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from queryrl.apps.query_rewrite.prompts import (
    DEFAULT_ANSWER_FIELDS,
    build_messages,
    check_answer_fields,
    check_answer_format,
)
from queryrl.apps.query_rewrite.reward.modes import parse_answer
from queryrl.rag.rewriters import last_user_turn


class PolicyRewriter:
    """Greedy rewrites by the causal LM in `model_path` (a Hugging Face folder).

    Args:
        model_path: the model (and tokenizer) folder, e.g. the SFT warm start or ``model.path``.
        lang: the prompt language (``zh`` or ``en``).
        max_new_tokens: the answer budget.
        device: where the model runs.
        domain: the prompt's domain line (default neutral).
        answer_fields: the keys the prompt asks for (default only ``rewritten_query``), a sequence or a
            comma-separated string.
        answer_format: ``json`` (default) or ``text`` (:mod:`~queryrl.apps.query_rewrite.prompts`).
    """

    def __init__(
        self,
        model_path: str | Path,
        lang: str = "zh",
        max_new_tokens: int = 64,
        device: str = "cpu",
        domain: str | None = None,
        answer_fields: str | Sequence[str] = DEFAULT_ANSWER_FIELDS,
        answer_format: str = "json",
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.answer_fields = check_answer_fields(answer_fields)
        self.answer_format = check_answer_format(answer_format, self.answer_fields)
        self.domain = domain

        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"reference rewriter model: {path} is not a Hugging Face model folder")
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path)
        model: Any = AutoModelForCausalLM.from_pretrained(path)
        self.model: Any = model.to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.lang = lang
        self.max_new_tokens = max_new_tokens
        self.device = torch.device(device)
        self.fallbacks = 0
        self.truncated = 0
        self._lock = threading.Lock()

    async def rewrite(self, contexts: list[dict[str, Any]], user_profile: str = "", history_summary: str = "") -> str:
        return await asyncio.to_thread(self.rewrite_sync, contexts, user_profile, history_summary)

    def rewrite_sync(self, contexts: list[dict[str, Any]], user_profile: str = "", history_summary: str = "") -> str:
        _, last = last_user_turn(contexts)
        if not contexts or str(contexts[-1].get("role")) != "user":
            return last.strip()
        messages = build_messages(
            contexts,
            user_profile,
            history_summary,
            self.lang,
            domain=self.domain,
            answer_fields=self.answer_fields,
            answer_format=self.answer_format,
        )
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = self.tokenizer(text, return_tensors="pt").to(self.device)
        with self._lock, torch.no_grad():
            out = self.model.generate(
                **inputs,
                do_sample=False,
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
            )
        answer = self.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        parsed = parse_answer(answer, answer_format=self.answer_format)
        if parsed is None:
            self.fallbacks += 1
            return last.strip()
        self.truncated += parsed.truncated
        return parsed.rewritten_query
