"""What one judge reply used and how it ended (:func:`read_reply`), the failure text of a reply cut off at
its token limit (:func:`cut_off_error`), the ``judge/*`` counters (:data:`STAT_KEYS`) and the estimated cost
of the tokens at the user's prices (:func:`judge_cost`).

Reasoning models (GPT-5, o-series) spend part of ``max_completion_tokens`` on reasoning that the reply does
not show (``usage.completion_tokens_details.reasoning_tokens``); when reasoning eats the whole budget the
reply is empty with ``finish_reason: "length"``. Reasoning tokens are part of ``completion_tokens`` and are
billed as output tokens.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

STAT_KEYS = (
    "judge/requests",
    "judge/calls",
    "judge/retries",
    "judge/cache_hits",
    "judge/failed",
    "judge/invalid",
    "judge/cut_off",
    "judge/client_errors",
    "judge/repeat_refusals",
    "judge/config_errors",
    "judge/prompt_tokens",
    "judge/completion_tokens",
    "judge/reasoning_tokens",
    "judge/latency_s",
)


@dataclass(frozen=True)
class ReplyUsage:
    """One chat completion as the judge reads it: the reply text (None when empty or absent), why it ended
    (``"stop"``, ``"length"``, ...) and its token counts (0 where the server sends none)."""

    content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int

    @property
    def cut_off(self) -> bool:
        """The server stopped the reply at its token limit."""
        return self.finish_reason == "length"


def _count(obj: Any, name: str) -> int:
    value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def read_reply(completion: Any) -> ReplyUsage:
    """The :class:`ReplyUsage` of an SDK ``ChatCompletion`` (or anything shaped like one); never raises."""
    usage = getattr(completion, "usage", None)
    details = getattr(usage, "completion_tokens_details", None)
    choices = getattr(completion, "choices", None) or []
    first = choices[0] if choices else None
    content = getattr(getattr(first, "message", None), "content", None)
    finish = getattr(first, "finish_reason", None)
    return ReplyUsage(
        content if isinstance(content, str) and content else None,
        finish if isinstance(finish, str) else None,
        _count(usage, "prompt_tokens"),
        _count(usage, "completion_tokens"),
        _count(details, "reasoning_tokens"),
    )


def cut_off_error(reply: ReplyUsage, max_tokens: int | None, setting_prefix: str | None) -> str:
    """The failure of a reply cut off at its token limit, naming the setting to raise, e.g. "the judge's
    reply was cut off (finish_reason=length) after 512 completion tokens, 512 of them reasoning; raise
    app.query_rewrite.judge.max_tokens (or lower reasoning_effort)"."""
    spent = f"after {reply.completion_tokens} completion tokens"
    if reply.reasoning_tokens:
        spent += f", {reply.reasoning_tokens} of them reasoning"
    key = f"{setting_prefix}.max_tokens" if setting_prefix else "the judge's max_tokens"
    if max_tokens is None:
        action = f"set {key} (unset: the server's default limit applied)"
    else:
        action = f"raise {key} above {max_tokens}"
    if reply.reasoning_tokens:
        action += " (or lower reasoning_effort)"
    shown = "the reply is empty" if reply.content is None else "its text is incomplete"
    return f"the judge's reply was cut off (finish_reason=length) {spent}; {action}; {shown}"


def with_mean(stats: dict[str, float]) -> dict[str, float]:
    """`stats` with ``judge/latency_s_mean`` = ``latency_s / calls`` (0 without calls)."""
    calls = stats["judge/calls"]
    return {**stats, "judge/latency_s_mean": stats["judge/latency_s"] / calls if calls else 0.0}


def check_prices(price_input: float | None, price_output: float | None) -> tuple[float, float] | None:
    """(input, output) prices per million tokens, or None when neither is set.

    Raises:
        ValueError: only one of them is set, or one is negative or not finite.
    """
    if price_input is None and price_output is None:
        return None
    if price_input is None or price_output is None:
        raise ValueError("judge prices: set both price_per_million_input and price_per_million_output, or neither")
    for name, value in (("input", price_input), ("output", price_output)):
        if not 0.0 <= float(value) < float("inf"):
            raise ValueError(f"judge price_per_million_{name} must be a number >= 0, got {value}")
    return float(price_input), float(price_output)


def judge_cost(prompt_tokens: float, completion_tokens: float, price_input: float, price_output: float) -> float:
    """Estimated cost of the tokens at the user's prices per million tokens (no built-in price list).
    Reasoning tokens are inside `completion_tokens`: billed as output, as OpenAI bills them."""
    return (prompt_tokens * price_input + completion_tokens * price_output) / 1_000_000


class _Counted(Protocol):
    def _pop_raw(self) -> dict[str, float]: ...


_LIVE_CLIENTS: weakref.WeakSet[Any] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()  # clients may be made in one thread while the trainer collects in another


def register(client: _Counted) -> None:
    """Count `client` in :func:`collect_judge_metrics` while it lives."""
    with _LIVE_LOCK:
        _LIVE_CLIENTS.add(client)


def collect_judge_metrics() -> dict[str, float]:
    """``judge/*`` summed over every live judge client, each reset; ``{}`` when there is none.
    ``judge/cost`` is there only when some client has prices (the sum of those clients' costs)."""
    with _LIVE_LOCK:
        clients = list(_LIVE_CLIENTS)
    if not clients:
        return {}
    totals = dict.fromkeys(STAT_KEYS, 0.0)
    for client in clients:
        for key, value in client._pop_raw().items():
            totals[key] = totals.get(key, 0.0) + value
    return with_mean(totals)
