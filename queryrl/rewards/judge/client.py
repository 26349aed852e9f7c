"""LLM-as-judge client: any OpenAI-compatible chat API, with bounded concurrency, retries, a disk cache
and per-step accounting. Used by the query-rewrite judge (docs/query-rewriter.md) and by any reward function::

    client = JudgeClient("https://api.openai.com/v1", "gpt-5", reasoning_effort="low", cache_dir="~/.cache/judge")
    print(client.check_sync())  # before a long job: the key, GET /models, one small request with these settings
    result = await client.judge(messages, schema=VERDICT_SCHEMA)  # the caller's JSON schema of a verdict
    if result.verdict is None:
        ...  # failed: result.error says why. Never replace it with a neutral score (the users' code returns 0.5).
    metrics = collect_judge_metrics()  # the trainer, once per step: judge/* summed over every live client

Failure policy (:mod:`~queryrl.rewards.judge.policy`): transient failures are retried with backoff, a request the server
refuses is sent once, a failed judgment is ``verdict=None`` with ``error`` saying why, a missing key is
:class:`JudgeConfigError`. :meth:`JudgeClient.check` tests the service before a long job depends on it.

The API key is read from ``os.environ[api_key_env]`` at each request (the SDK's key-provider hook), never
stored, cached, put in ``repr`` or an error text (a server echoing it is scrubbed); ``api_key_env=None``
sends the placeholder ``"EMPTY"`` (local / vLLM servers).

Request settings. Only what is set is sent: ``temperature`` (default None: not sent, the model's default;
GPT-5 and o-series reject any other value with HTTP 400), a token limit ``max_tokens`` sent under the
name ``token_limit_param`` (default ``max_completion_tokens``, which OpenAI's reasoning models require and
current servers accept; ``"max_tokens"`` for old servers), ``reasoning_effort`` (``minimal`` / ``low`` /
``medium`` / ``high``, ...; None: not sent) and ``extra_body`` (merged into the JSON body as given).

Accounting (``pop_stats`` / ``collect_judge_metrics``, sums since the last pop): ``judge/requests``
(``judge()`` invocations, cache hits included), ``judge/calls`` (HTTP requests, retries included),
``judge/retries``, ``judge/cache_hits``; ``judge/failed`` (``verdict=None``), of them ``judge/invalid`` (the
reply was unparseable, schema-invalid or cut off), ``judge/cut_off`` (stopped at the token limit:
``finish_reason: length``, the error names the setting to raise, :func:`~.usage.cut_off_error`),
``judge/client_errors`` (a 4xx that is not retried: a setting, the key, the model name),
``judge/repeat_refusals`` (such a refusal remembered, not re-sent); ``judge/config_errors``
(:class:`JudgeConfigError` raised); ``judge/prompt_tokens``, ``judge/completion_tokens``,
``judge/reasoning_tokens`` (the API's ``usage``, 0 when absent; reasoning is part of completion and billed
as output); ``judge/latency_s`` (seconds in HTTP calls, failed and retried ones too) and
``judge/latency_s_mean`` (``latency_s / calls``, recomputed after summing across clients); with the user's
prices, ``judge/cost``. ``JudgeResult.latency_s``: one ``judge()``'s wall time from its concurrency slot on.

Concurrency: at most ``max_concurrency`` requests in flight per event loop (an ``asyncio.Semaphore``
made lazily in the running loop, next to that loop's SDK client). Cache: with ``cache_dir``, successful
verdicts are kept on disk by the request's hash (:class:`~.memory.VerdictCache`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from queryrl.redaction import add_secret
from queryrl.rewards.json_extract import parse_verdict
from queryrl.rewards.judge.memory import JudgeResult, RefusalMemory, VerdictCache
from queryrl.rewards.judge.policy import (
    Backoff,
    JudgeConfigError,
    JudgeUnavailable,
    check_settings,
    closest_names,
    config_error,
    describe_error,
    is_client_error,
    is_retryable,
    scrub_echoed_key,
)
from queryrl.rewards.judge.usage import (
    STAT_KEYS,
    ReplyUsage,
    check_prices,
    cut_off_error,
    judge_cost,
    read_reply,
    register,
    with_mean,
)

if TYPE_CHECKING:  # openai takes ~1 s to import: only when a judge is used
    import openai

log = logging.getLogger(__name__)

NO_KEY_PLACEHOLDER = "EMPTY"
CACHE_VERSION = 2  # 2: verdicts are whole replies (a verdict read from a refusal's prose is not reused)


@dataclass
class _LoopState:
    semaphore: asyncio.Semaphore
    sdk: openai.AsyncOpenAI


def _read_key(env: str | None) -> str:
    if env is None:
        return NO_KEY_PLACEHOLDER
    key = os.environ.get(env)
    if not key:
        raise JudgeConfigError(
            f"judge API key: environment variable {env} is not set or empty; export it (for a server that "
            "needs no key: api_key_env null in the config, --judge-api-key-env '' on the command line)"
        )
    add_secret(key)  # whatever echoes it from now on (a reply, an error, a log line) shows <redacted>
    return key


class JudgeClient:
    """An LLM judge behind an OpenAI-compatible chat API (see the module doc for every policy).

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8001/v1``.
        model: the model name sent with every request.
        api_key_env: name of the environment variable holding the key; None sends a placeholder.
        max_concurrency: requests in flight at once (per event loop).
        timeout_s: limit on one HTTP attempt, seconds.
        max_retries: re-sends after the first attempt for 429 / 5xx / timeout / connection errors.
        cache_dir: folder for the verdict cache; None disables it.
        temperature: sent when not None (GPT-5 / o-series accept only their default: leave it None).
        max_tokens: the reply's token limit, sent when not None, under the name `token_limit_param`.
        token_limit_param: ``"max_completion_tokens"`` (OpenAI's current name; required by reasoning
            models) or ``"max_tokens"`` (servers that predate it).
        reasoning_effort: sent when not None: ``minimal``, ``low``, ``medium``, ``high`` (also ``none``,
            ``xhigh`` for the models that take them).
        extra_body: extra JSON fields merged into the request body as given (the SDK's ``extra_body``).
        backoff_base_s, backoff_max_s, retry_after_max_s: the wait before a retry (:class:`~.policy.Backoff`).
        setting_prefix: where these settings live in a config (``app.query_rewrite.judge``), named in errors.
        whole_reply: the verdict is the whole reply or its one fenced block (json_extract.reply_object);
            False: the first object passing the schema anywhere in it (not for a judge: e.g. a rewriter).
        price_per_million_input, price_per_million_output: the user's prices per million prompt / completion
            tokens (reasoning is billed as completion): with both, ``judge/cost`` is counted. No built-in prices.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        cache_dir: str | Path | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
        token_limit_param: str = "max_completion_tokens",
        reasoning_effort: str | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
        retry_after_max_s: float = 30.0,
        setting_prefix: str | None = None,
        whole_reply: bool = True,
        price_per_million_input: float | None = None,
        price_per_million_output: float | None = None,
    ) -> None:
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError(
                f"need max_concurrency >= 1, max_retries >= 0, timeout_s > 0; "
                f"got {max_concurrency}, {max_retries}, {timeout_s}"
            )
        check_settings(temperature, max_tokens, token_limit_param, reasoning_effort, extra_body)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.token_limit_param = token_limit_param
        self.reasoning_effort = reasoning_effort
        self.extra_body = dict(extra_body) if extra_body else None
        self.setting_prefix = setting_prefix
        self.prices = check_prices(price_per_million_input, price_per_million_output)
        self.whole_reply = whole_reply
        self._backoff = Backoff(backoff_base_s, backoff_max_s, retry_after_max_s)
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._stats = self._fresh()
        self._logged: set[str] = set()  # failure texts already logged as warnings
        self._refusals = RefusalMemory()
        self._cache = VerdictCache(self.cache_dir, model) if self.cache_dir is not None else None
        register(self)

    def __repr__(self) -> str:
        return (
            f"JudgeClient(base_url={self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r}, "
            f"max_concurrency={self.max_concurrency}, timeout_s={self.timeout_s}, max_retries={self.max_retries}, "
            f"cache_dir={str(self.cache_dir) if self.cache_dir else None!r})"
        )

    # --- public API -----------------------------------------------------------------------------

    async def judge(self, messages: list[dict[str, Any]], schema: dict[str, Any] | None = None) -> JudgeResult:
        """Ask the judge; the first JSON object of the reply that passes `schema` is the verdict.

        Raises:
            JudgeConfigError: the API key variable is not set (only checked when the cache misses).
        """
        key = self.cache_key(messages, schema)
        self._add("judge/requests", 1)
        hit = self._cache.read(key) if self._cache is not None else None
        if hit is not None:
            self._add("judge/cache_hits", 1)
            return hit
        self._key_or_raise()  # fail loudly before queueing, not as a failed sample
        refused = self._refusals.recall(key)
        if refused is not None:  # e.g. a reward manager retrying the sample: the answer would be the same 4xx
            self._add("judge/failed", 1)
            self._add("judge/repeat_refusals", 1)
            return refused
        state = self._state()
        async with state.semaphore:
            start = time.perf_counter()
            result = await self._judge_uncached(state.sdk, messages, schema, start)
        if result.verdict is None:
            self._add("judge/failed", 1)
            self._log_failure(result.error or "")
            if result.refused:
                self._refusals.remember(key, result)
        elif self._cache is not None:
            self._cache.write(key, result)
        return result

    def judge_sync(self, messages: list[dict[str, Any]], schema: dict[str, Any] | None = None) -> JudgeResult:
        """:meth:`judge` for scripts: runs its own event loop (so not from inside a running one)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("judge_sync() called inside a running event loop; use `await client.judge(...)`")

        async def once() -> JudgeResult:
            try:
                return await self.judge(messages, schema)
            finally:
                await self.aclose()

        return asyncio.run(once())

    async def aclose(self) -> None:
        """Close the HTTP connections this client opened in the running event loop."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.sdk.close()

    async def check(self) -> str:
        """Test the service before a long job depends on it; returns what was checked.

        In order: the key variable is set; ``GET {base_url}/models`` answers (not served -- 404, 405 -- is
        fine: local servers may lack it); one tiny chat request with this client's settings (temperature,
        the configured token limit, reasoning effort, extra body) is accepted and not cut off at that limit,
        so a setting the model rejects, or a limit its reasoning uses up, fails here rather than on every
        sample. The request is retried as a judge call is; its reply text is not parsed. It counts in
        ``judge/calls`` and the token counters (it is a paid call).

        Raises:
            JudgeConfigError: the key variable is not set.
            JudgeUnavailable: no answer, the key refused, the request refused (the server's message), or
                the reply cut off at the token limit (:func:`~.usage.cut_off_error`).
        """
        import openai

        self._key_or_raise()
        sdk = self._state().sdk
        where = f"judge {self.model!r} at {self.base_url}"
        listed = "GET /models not served"
        unlisted = ""  # the configured model is not in the list: what to say, with the closest listed names
        try:
            async with asyncio.timeout(self.timeout_s):
                page = await sdk.models.list()
            listed = f"GET /models lists {len(page.data)} model(s)"
            ids = [str(m.id) for m in page.data]
            if ids and self.model not in ids:
                unlisted = f"GET /models does not list {self.model!r}" + closest_names(self.model, ids)
        except openai.APIStatusError as e:
            if e.status_code in (401, 403):
                raise JudgeUnavailable(f"{where} refused the key in ${self.api_key_env}: {self._describe(e)}") from None
            if e.status_code not in (404, 405):
                listed = f"GET /models answered HTTP {e.status_code}"
        except (openai.APIConnectionError, TimeoutError) as e:
            raise JudgeUnavailable(f"{where} does not answer: {self._describe(e)}") from None
        probe = [{"role": "user", "content": 'Reply with the JSON object {"ok": true} and nothing else.'}]
        retrying = self._retrying()
        try:
            reply = read_reply(await retrying(self._call_once, sdk, probe))
        except Exception as e:
            if (cause := config_error(e)) is not None:
                raise cause from None
            hint = f" ({unlisted})" if unlisted else ""
            raise JudgeUnavailable(f"{where}: a test request failed: {self._describe(e)}{hint}") from None
        self._count_tokens(reply)
        if reply.cut_off:
            raise JudgeUnavailable(f"{where}: {cut_off_error(reply, self.max_tokens, self.setting_prefix)}")
        if unlisted:  # served all the same (an alias, a proxy): say so, it may still be a typo
            listed = f"{listed}, not {self.model!r}{closest_names(self.model, ids)}"
        return f"{where}: {listed}; a test request with the judge's settings succeeded"

    def check_sync(self) -> str:
        """:meth:`check` for scripts (its own event loop)."""

        async def once() -> str:
            try:
                return await self.check()
            finally:
                await self.aclose()

        return asyncio.run(once())

    def cache_key(self, messages: list[dict[str, Any]], schema: dict[str, Any] | None = None) -> str:
        """sha256 of the full request: everything that can change the verdict."""
        request = {
            "v": CACHE_VERSION,
            "base_url": self.base_url,
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "token_limit_param": self.token_limit_param,
            "reasoning_effort": self.reasoning_effort,
            "extra_body": self.extra_body,
            "schema": schema,
        }
        blob = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def pop_stats(self) -> dict[str, float]:
        """This client's ``judge/*`` counters since the last pop (see the module doc), then reset."""
        return with_mean(self._pop_raw())

    # --- one request ------------------------------------------------------------------------------

    async def _judge_uncached(
        self, sdk: openai.AsyncOpenAI, messages: list[dict[str, Any]], schema: dict[str, Any] | None, start: float
    ) -> JudgeResult:
        retrying = self._retrying()
        try:
            completion: Any = await retrying(self._call_once, sdk, messages)
        except Exception as e:  # anything the call raised, after the retries it deserved
            cause = config_error(e)
            if cause is not None:  # the key vanished mid-run: a configuration error, never a sample
                self._add("judge/config_errors", 1)
                raise cause from None
            refused = is_client_error(e)
            if refused:
                self._add("judge/client_errors", 1)
            attempts = retrying.statistics.get("attempt_number", 1)
            failure = f"call failed after {attempts} attempt(s): {self._describe(e)}"
            return JudgeResult(None, None, failure, latency_s=time.perf_counter() - start, refused=refused)
        reply = read_reply(completion)
        self._count_tokens(reply)
        verdict: dict[str, Any] | None = None
        if reply.cut_off:  # a verdict cut off is no verdict, even when what arrived happens to parse
            error: str | None = cut_off_error(reply, self.max_tokens, self.setting_prefix)
            self._add("judge/cut_off", 1)
        elif reply.content is not None:
            verdict, error = parse_verdict(reply.content, schema, self.whole_reply)
        else:
            error = "unparseable verdict: the reply has no text content"
        if verdict is None:
            self._add("judge/invalid", 1)
        tokens = (reply.prompt_tokens, reply.completion_tokens)
        latency = time.perf_counter() - start
        return JudgeResult(
            verdict, reply.content, error, False, *tokens, latency, reasoning_tokens=reply.reasoning_tokens
        )

    def request_options(self, max_tokens: int | None = None) -> dict[str, Any]:
        """The SDK keyword arguments of a request: only the settings that are set (see the module doc)."""
        options: dict[str, Any] = {}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        limit = self.max_tokens if max_tokens is None else max_tokens
        if limit is not None:
            options[self.token_limit_param] = limit
        if self.reasoning_effort is not None:
            options["reasoning_effort"] = self.reasoning_effort
        if self.extra_body:
            options["extra_body"] = self.extra_body
        return options

    async def _call_once(
        self, sdk: openai.AsyncOpenAI, messages: list[dict[str, Any]], max_tokens: int | None = None
    ) -> Any:
        options = self.request_options(max_tokens)
        self._add("judge/calls", 1)
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                return await sdk.chat.completions.create(model=self.model, messages=messages, **options)  # type: ignore[arg-type]
        finally:
            self._add("judge/latency_s", time.perf_counter() - start)

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._backoff.wait,
            retry=retry_if_exception(is_retryable),
            before_sleep=self._before_sleep,
            reraise=True,
        )

    def _before_sleep(self, state: RetryCallState) -> None:
        self._add("judge/retries", 1)
        error = state.outcome.exception() if state.outcome is not None else None
        log.debug("judge %s: retry %d after %s", self.model, state.attempt_number, self._describe(error))

    def _describe(self, error: BaseException | None) -> str:
        # scrubbed before the cut: a key cut in half would not be found
        return self._scrub(describe_error(error, self.timeout_s))[:600]

    def _scrub(self, text: str) -> str:
        """`text` without the key: a server echoing it (or, as OpenAI does, a masked piece of it) is cut."""
        text = scrub_echoed_key(text)
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return text.replace(key, "<redacted>") if key else text

    def _log_failure(self, error: str) -> None:
        """A warning the first time an error text is seen (a refused setting fails every sample the same
        way: one line names the cause, not thousands), a debug line after that."""
        with self._lock:
            first = error not in self._logged and len(self._logged) < 1000  # bounded memory
            if first:
                self._logged.add(error)
        if first:
            log.warning("judge %s: %s", self.model, error)
        else:
            log.debug("judge %s (again): %s", self.model, error)

    def _key_or_raise(self) -> None:
        try:
            _read_key(self.api_key_env)
        except JudgeConfigError:
            self._add("judge/config_errors", 1)
            raise

    # --- per-loop state, cache, counters ------------------------------------------------------------

    def _state(self) -> _LoopState:
        """The running loop's semaphore and SDK client, made on first use (both are bound to one loop)."""
        import openai

        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._loops.get(loop)
            if state is None:
                env = self.api_key_env  # the provider must not hold `self` (it would keep the client alive)

                async def provide_key() -> str:  # the SDK calls it before every request
                    return _read_key(env)

                sdk = openai.AsyncOpenAI(
                    api_key=provide_key, base_url=self.base_url, max_retries=0, timeout=self.timeout_s
                )
                state = self._loops[loop] = _LoopState(asyncio.Semaphore(self.max_concurrency), sdk)
        return state

    def _add(self, key: str, value: float) -> None:
        with self._lock:
            self._stats[key] += value

    def _fresh(self) -> dict[str, float]:
        return dict.fromkeys((*STAT_KEYS, "judge/cost") if self.prices else STAT_KEYS, 0.0)

    def _count_tokens(self, reply: ReplyUsage) -> None:
        """The reply's tokens, and their estimated cost at the user's prices (reasoning billed as output)."""
        with self._lock:
            self._stats["judge/prompt_tokens"] += reply.prompt_tokens
            self._stats["judge/completion_tokens"] += reply.completion_tokens
            self._stats["judge/reasoning_tokens"] += reply.reasoning_tokens
            if self.prices:
                self._stats["judge/cost"] += judge_cost(reply.prompt_tokens, reply.completion_tokens, *self.prices)

    def _pop_raw(self) -> dict[str, float]:
        with self._lock:
            stats, self._stats = self._stats, self._fresh()
        return stats
