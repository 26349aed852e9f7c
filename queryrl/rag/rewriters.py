"""Reference query rewriters: what ``POST /rag/chat`` uses to turn a conversation into a search query.

A rewriter is any object with ``async rewrite(contexts, user_profile, history_summary) -> str`` where
`contexts` is the conversation as ``[{"role": "user" | "assistant" | ..., "content": str}, ...]``, oldest
first. :data:`REWRITERS` maps a name to a factory (keyword arguments -> rewriter), so an application can
register its own (e.g. the frozen initial policy) and the CLI can choose by name.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from queryrl.rag.index import entity_tokenizer, normalise_entities, tokenize
from queryrl.registry import Registry, RegistryError

USER_ROLES = frozenset({"user", "human", "customer"})
_ENTITY_CHARS = re.compile(r"[0-9a-z]")
# Small talk that asks for nothing: greetings, thanks, acknowledgements, goodbyes. A short word list on
# purpose, longest first: a turn made only of these words (and punctuation) needs no retrieval. Anything
# else ("您好，想咨询一下", "hello", "稍等，我接个电话") is not recognised, as a cheap reference rewriter
# would not: it is a stand-in for a large model, not an oracle.
CHITCHAT_WORDS = tuple(
    sorted(
        (
            "在吗", "在不在", "有人吗", "你好", "您好", "谢谢", "多谢", "感谢", "好的", "嗯嗯", "嗯", "哈哈",
            "哈", "哦哦", "哦", "好", "行", "拜拜", "再见", "收到", "明白了", "懂了", "了解", "ok", "我再想想",
            "我再考虑考虑", "考虑一下", "先这样吧", "我看看", "我想想", "辛苦了", "不错", "嗨", "亲", "谢谢你",
            "喂", "哎", "早上好", "晚上好", "这样啊", "挺好的", "回头再说", "客服", "啦", "呀",
            "啊", "吧", "了",
        ),
        key=len,
        reverse=True,
    )
)  # fmt: skip
_NOT_WORD = re.compile(r"[\W_]+")


def is_chitchat(text: str) -> bool:
    """True when `text` is only small talk (:data:`CHITCHAT_WORDS`) and punctuation, or nothing at all."""
    rest = _NOT_WORD.sub("", text.lower())
    for word in CHITCHAT_WORDS:
        rest = rest.replace(word, "")
    return not rest


REWRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["rewritten_query"],
    "properties": {"rewritten_query": {"type": "string"}},
}
REWRITE_SYSTEM_PROMPT = (
    "You rewrite the last user message of a conversation into a standalone search query for a "
    "retrieval system: resolve pronouns and ellipsis from the history, keep product names, models and "
    "numbers, add nothing that was not said. Answer with JSON only: "
    '{"rewritten_query": "..."}'
)


class Rewriter(Protocol):
    async def rewrite(self, contexts: list[dict[str, Any]], user_profile: str, history_summary: str) -> str: ...


def last_user_turn(contexts: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
    """(index, text) of the last user message; (-1, "") when there is none."""
    for i in range(len(contexts) - 1, -1, -1):
        if str(contexts[i].get("role", "")).lower() in USER_ROLES:
            return i, str(contexts[i].get("content", ""))
    return -1, ""


class LastTurnRewriter:
    """Baseline: the last user message as is."""

    async def rewrite(self, contexts: list[dict[str, Any]], user_profile: str = "", history_summary: str = "") -> str:
        return last_user_turn(contexts)[1].strip()


class HeuristicRewriter:
    """Deterministic rewrite: the last user message plus the entity terms of the most recent earlier turn.

    Rule. A token (:func:`~queryrl.rag.index.tokenize`) is *entity-like* when it contains a latin letter
    or a digit (product names and models: ``iphone``, ``15``, ``mate60``; unless `latin_entities` is
    False) or belongs to `entities` (known names, e.g. brands or document titles, for names written in
    Chinese). The text is cut with `entities` in the jieba dictionary, so a known multi-character name
    (``"古北水镇"``) is one token, not its pieces. If the last user message already holds an entity-like
    token it is taken as standalone (a topic switch) and returned as is. Otherwise the earlier turns
    (both roles) are scanned newest first; the entity-like tokens of the first turn that has any other than
    bare numbers (prices and capacities in a reply name nothing) (at most `max_terms`, in their order there)
    are prepended to the last user message, separated by a space.
    With no such turn the last message is returned unchanged; with no user message, "". Small talk
    (:func:`is_chitchat`: "在吗", "谢谢", "好的") gives "" unless `abstain` is False: the turn needs no
    retrieval, and an empty query says so.

    Args:
        entities: extra entity words (matched after lowercasing; see
            :func:`~queryrl.rag.index.normalise_entities`).
        max_terms: cap on the carried-over terms.
        use_summary: also scan `history_summary` as the oldest turn.
        latin_entities: tokens with a latin letter or digit are entity-like (the product-catalogue rule);
            False: only `entities` are (for corpora whose names are Chinese and whose digits are
            prices, years and hours).
        abstain: answer "" for small talk.
    """

    def __init__(
        self,
        entities: Iterable[str] = (),
        max_terms: int = 4,
        use_summary: bool = True,
        latin_entities: bool = True,
        abstain: bool = True,
    ) -> None:
        self.entities = normalise_entities(entities)
        self.max_terms = max_terms
        self.use_summary = use_summary
        self.latin_entities = latin_entities
        self.abstain = abstain
        self._tokenizer = entity_tokenizer(self.entities)

    def entity_terms(self, text: str) -> list[str]:
        """The entity-like tokens of `text`, first occurrence order, without repeats."""
        terms: list[str] = []
        for token in tokenize(text, self._tokenizer):
            latin = self.latin_entities and _ENTITY_CHARS.search(token)
            if (latin or token in self.entities) and token not in terms:
                terms.append(token)
        return terms

    async def rewrite(self, contexts: list[dict[str, Any]], user_profile: str = "", history_summary: str = "") -> str:
        return self.rewrite_sync(contexts, history_summary)

    def rewrite_sync(self, contexts: Sequence[Mapping[str, Any]], history_summary: str = "") -> str:
        index, last = last_user_turn(contexts)
        last = last.strip()
        if index < 0 or (self.abstain and is_chitchat(last)):
            return ""
        if self.entity_terms(last):
            return last
        earlier = [str(m.get("content", "")) for m in contexts[: max(index, 0)]]
        if self.use_summary and history_summary:
            earlier.insert(0, history_summary)
        for text in reversed(earlier):
            terms = self.entity_terms(text)[: self.max_terms]
            # numbers alone (a price, a capacity in a reply) name nothing: look further back
            if terms and not all(t.replace(".", "").isdigit() for t in terms):
                return " ".join([*terms, last]).strip()
        return last


class OpenAICompatibleRewriter:
    """An LLM behind an OpenAI-compatible chat API, through :class:`queryrl.rewards.judge.JudgeClient`.

    The model sees :data:`REWRITE_SYSTEM_PROMPT` and the conversation (with profile and summary) and must
    answer ``{"rewritten_query": ...}``. A failed call or an unusable reply falls back to `fallback`
    (default: the last user message), so the reference pipeline always answers; failures are counted in
    the client's ``judge/*`` stats.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        fallback: Rewriter | None = None,
        **client_kwargs: Any,
    ) -> None:
        from queryrl.rewards.judge import JudgeClient

        # a rewrite is not a verdict: the first {"rewritten_query": ...} in the reply is taken, prose around it too
        client_kwargs.setdefault("whole_reply", False)
        self.client = JudgeClient(base_url, model, api_key_env=api_key_env, **client_kwargs)
        self.fallback: Rewriter = fallback or LastTurnRewriter()

    @staticmethod
    def messages(contexts: list[dict[str, Any]], user_profile: str, history_summary: str) -> list[dict[str, str]]:
        payload = {"user_profile": user_profile, "history_summary": history_summary, "conversation": contexts}
        return [
            {"role": "system", "content": REWRITE_SYSTEM_PROMPT},
            {"role": "user", "content": json.dumps(payload, ensure_ascii=False)},
        ]

    async def rewrite(self, contexts: list[dict[str, Any]], user_profile: str = "", history_summary: str = "") -> str:
        result = await self.client.judge(self.messages(contexts, user_profile, history_summary), REWRITE_SCHEMA)
        query = str(result.verdict["rewritten_query"]).strip() if result.verdict else ""
        return query or await self.fallback.rewrite(contexts, user_profile, history_summary)


RewriterFactory = Callable[..., Rewriter]
REWRITERS: Registry[RewriterFactory] = Registry("rewriter")
REWRITERS.register("heuristic")(HeuristicRewriter)
REWRITERS.register("last_turn")(LastTurnRewriter)
REWRITERS.register("openai")(OpenAICompatibleRewriter)


def register_rewriter(name: str, factory: RewriterFactory) -> None:
    """Make `factory` available as ``make_rewriter(name, ...)``; an existing name is an error."""
    if name in REWRITERS:
        raise RegistryError(f"rewriter {name!r} is already registered")
    REWRITERS.register(name)(factory)


def _factory(name: str) -> RewriterFactory:
    if name not in REWRITERS:  # an installed application's rewriter (query_rewrite's "policy")
        from queryrl.application import load_apps

        load_apps()
    return REWRITERS.get(name)


def missing_parameters(name: str, available: Mapping[str, Any]) -> list[str]:
    """The required parameters of rewriter `name`'s factory that `available` lacks or holds as None."""
    params = inspect.signature(_factory(name)).parameters
    required = [
        k for k, p in params.items() if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    return [k for k in required if available.get(k) is None]


def build_rewriter(name: str, available: Mapping[str, Any], given: Mapping[str, Any] | None = None) -> Rewriter:
    """The rewriter `name`, built from the values in `available` that its factory takes, and `given`.

    Each factory takes what it needs by keyword (``entities`` and ``latin_entities`` for ``heuristic``;
    ``base_url``, ``model``, ``api_key_env``, ``fallback`` for ``openai``; an application's own, e.g.
    ``model_path`` for query_rewrite's ``policy``), so the caller offers every value it has and never
    asks which rewriter it builds. `given` (the user's own settings) are passed as they are and win over
    `available`. A required parameter that neither has (or that is None) is an error naming it.
    """
    factory = _factory(name)
    params = inspect.signature(factory).parameters
    kwargs = {k: v for k, v in available.items() if k in params} | dict(given or {})
    missing = missing_parameters(name, kwargs)
    if missing:
        raise ValueError(f"rewriter {name!r} needs {', '.join(missing)}")
    return factory(**kwargs)


def make_rewriter(name: str = "heuristic", **kwargs: Any) -> Rewriter:
    """The rewriter registered as `name`, built with `kwargs`; an unknown name lists the valid ones.

    The installed applications register theirs (query_rewrite: ``policy``) when they are loaded.
    """
    return _factory(name)(**kwargs)
