"""The checks OpenAI's Chat Completions API makes of a request, as the loopback judge server
(:mod:`.judge_server`) makes them to rehearse a GPT-5 judge offline, with OpenAI's statuses and messages.

Strict mode (``strict=True``): the request is checked as OpenAI's API checks it, and refused with its
status, message and ``param`` / ``code`` (:func:`openai_rules`):

- a field the API does not know: 400 ``Unrecognized request argument supplied: NAME``;
- a reasoning model (a name starting ``gpt-5``, ``o1``, ``o3`` or ``o4``): ``temperature`` other than 1
  (400 ``unsupported_value``: "Unsupported value: 'temperature' does not support 0.0 with this model. Only
  the default (1) value is supported."), ``max_tokens`` (400 ``unsupported_parameter``: "... Use
  'max_completion_tokens' instead."), ``top_p``, ``presence_penalty``, ``frequency_penalty``,
  ``logprobs``, ``top_logprobs``, ``logit_bias`` (400 ``unsupported_parameter``), a ``reasoning_effort``
  the model does not take (400 ``unsupported_value``);
- another model: ``reasoning_effort`` (400 ``unsupported_parameter``);
- with ``served_models``, a model not among them: 404 ``model_not_found``.

With ``api_key`` (either mode) every ``/v1`` route wants ``Authorization: Bearer <api_key>``: a missing
one gets 401 "You didn't provide an API key. ...", a wrong one 401 ``invalid_api_key`` "Incorrect API key
provided: sk-ab***...wxyz. ..." (masked as OpenAI masks it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from queryrl.service_auth import bearer_matches, bearer_token


def api_error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


# --- strict mode: OpenAI's own checks ------------------------------------------------------------

# the Chat Completions request fields the API knows (openai-python 3.x `chat.completions.create`)
KNOWN_FIELDS = frozenset(
    (
        "messages",
        "model",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    )
)
REASONING_PREFIXES = ("gpt-5", "o1", "o3", "o4")
# sampling controls a reasoning model refuses outright
REASONING_UNSUPPORTED = ("top_p", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "logit_bias")
KEY_HELP = "You can find your API key at https://platform.openai.com/account/api-keys."


def is_reasoning_model(model: str) -> bool:
    """OpenAI's reasoning models by name: ``gpt-5*``, ``o1*``, ``o3*``, ``o4*`` (after a ``provider/`` prefix)."""
    name = model.rsplit("/", 1)[-1].lower()
    return name.startswith(REASONING_PREFIXES)


def _efforts(model: str) -> tuple[str, ...]:
    return ("minimal", "low", "medium", "high") if model.lower().startswith("gpt-5") else ("low", "medium", "high")


def _listing(values: Sequence[str]) -> str:
    quoted = [f"'{v}'" for v in values]
    return ", ".join(quoted[:-1]) + f", and {quoted[-1]}" if len(quoted) > 1 else quoted[0]


def _unsupported_parameter(param: str, extra: str = "") -> JSONResponse:
    message = f"Unsupported parameter: '{param}' is not supported with this model.{extra}"
    return api_error(400, message, param=param, code="unsupported_parameter")


def openai_rules(body: Mapping[str, Any]) -> JSONResponse | None:
    """The 400 OpenAI's API gives this request body, or None when it would accept it (see the module doc)."""
    unknown = sorted(set(body) - KNOWN_FIELDS)
    if unknown:
        return api_error(400, f"Unrecognized request argument supplied: {unknown[0]}")
    model = str(body.get("model") or "")
    effort = body.get("reasoning_effort")
    if not is_reasoning_model(model):
        return _unsupported_parameter("reasoning_effort") if effort is not None else None
    temperature = body.get("temperature")
    if temperature is not None and temperature != 1:
        message = (
            f"Unsupported value: 'temperature' does not support {json.dumps(temperature)} with this model. "
            "Only the default (1) value is supported."
        )
        return api_error(400, message, param="temperature", code="unsupported_value")
    if "max_tokens" in body:
        return _unsupported_parameter("max_tokens", " Use 'max_completion_tokens' instead.")
    for param in REASONING_UNSUPPORTED:
        if param in body:
            return _unsupported_parameter(param)
    if effort is not None and effort not in _efforts(model):
        message = (
            f"Unsupported value: 'reasoning_effort' does not support '{effort}' with this model. "
            f"Supported values are: {_listing(_efforts(model))}."
        )
        return api_error(400, message, param="reasoning_effort", code="unsupported_value")
    return None


@dataclass(frozen=True)
class ServerRules:
    """What the server checks of each request: the key, the served models and, when `strict`, OpenAI's rules."""

    strict: bool
    api_key: str | None
    served_models: tuple[str, ...] | None
    reasoning_tokens: int | Mapping[str, int] = 0  # hidden tokens each reply spends first (judge_server's doc)

    def auth(self, authorization: str | None) -> JSONResponse | None:
        """401 as OpenAI answers it, when a key is configured and this one is missing or wrong."""
        if self.api_key is None:
            return None
        given = bearer_token(authorization)
        if given is None:  # no header, another scheme, or a bare key without "Bearer "
            message = (
                "You didn't provide an API key. You need to provide your API key in an Authorization header "
                f"using Bearer auth (i.e. Authorization: Bearer YOUR_KEY). {KEY_HELP}"
            )
            return api_error(401, message)
        if not bearer_matches(authorization, self.api_key):  # constant-time
            masked = given[:5] + "*" * max(0, len(given) - 9) + given[-4:] if len(given) > 9 else "*" * len(given)
            return api_error(401, f"Incorrect API key provided: {masked}. {KEY_HELP}", code="invalid_api_key")
        return None

    def check(self, body: Mapping[str, Any]) -> JSONResponse | None:
        model = str(body.get("model") or "")
        if self.served_models is not None and model not in self.served_models:
            message = f"The model `{model}` does not exist or you do not have access to it."
            return api_error(404, message, code="model_not_found")
        return openai_rules(body) if self.strict else None
