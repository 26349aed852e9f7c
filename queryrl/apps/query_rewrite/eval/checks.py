"""``queryrl eval``'s checks before any model is loaded: the services answer, the systems are model folders.

Generating with a model takes minutes to hours; a judge key that is not exported, a judge that refuses
a setting, a RAG service that is down or breaks the response contract, or a training checkpoint given
where a model folder is expected must each cost one clear message, not that time. :func:`check_services`
runs first (after the cheap argument checks): the judge's :meth:`~queryrl.rewards.judge.JudgeClient.check`
(key variable, ``GET /models``, one tiny request with the judge's settings), the RAG service's ``GET
/health`` and, given a row, :func:`check_rag_endpoint` for ``/rag/chat_8b`` and ``/rag/chat``: one request
each with the fields training sends for that row, validated as training validates every answer (the
same check ``queryrl train``'s preflight makes with the first training row).
:func:`not_a_model_message` says what a folder without ``config.json`` is instead, and for a queryrl
checkpoint (``checkpoints/step_N``: ``state.json``, ``actor/``, ``optim.pt``, ``rng.pt``; see
:mod:`queryrl.trainer.checkpoint`) the ``queryrl export`` command that makes a model folder of it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queryrl.apps.query_rewrite.config import QueryRewriteRAGConfig
    from queryrl.rewards.judge import JudgeClient

CHECKPOINT_FILES = ("state.json", "actor")  # what every queryrl checkpoint holds (optim.pt, rng.pt too)
_STEP_DIR = re.compile(r"^step_(\d+)$")


class ServiceCheckFailed(RuntimeError):
    """A service the evaluation needs does not answer, or refuses the request (the message says which)."""


def is_checkpoint(path: Path) -> bool:
    """A queryrl training checkpoint folder (``checkpoints/step_N``)."""
    return all((path / name).exists() for name in CHECKPOINT_FILES)


def _export_target(checkpoint: Path) -> Path:
    """Where to suggest exporting `checkpoint`: ``<run>/export/step_N`` beside ``<run>/checkpoints``."""
    if checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent / "export" / checkpoint.name
    return checkpoint.with_name(f"{checkpoint.name}_hf")


def _steps(folder: Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def not_a_model_message(name: str, path: Path) -> str:
    """Why `path` (given for system `name`) is not a Hugging Face model folder, and what to do instead."""
    if not path.exists():
        return f"system {name!r}: model folder {str(path)!r} does not exist"
    if not path.is_dir():
        return f"system {name!r}: {str(path)!r} is a file, not a model folder (a folder with config.json)"
    export = "queryrl export {src} {dst}"
    if is_checkpoint(path):
        dst = _export_target(path)
        return (
            f"system {name!r}: {str(path)!r} is a queryrl training checkpoint, not a model folder; make one with "
            f"`{export.format(src=path, dst=dst)}`, then evaluate {name}={dst}"
        )
    for holder in (path, path / "checkpoints"):  # a checkpoints/ folder, or a run folder holding one
        steps = [s for s in _steps(holder) if is_checkpoint(s)] if holder.is_dir() else []
        if steps:
            latest = steps[-1]
            dst = _export_target(latest)
            return (
                f"system {name!r}: {str(path)!r} holds training checkpoints ({', '.join(s.name for s in steps)}), "
                f"not a model; export one with `{export.format(src=latest, dst=dst)}`, then evaluate {name}={dst}"
            )
    return (
        f"system {name!r}: {str(path)!r} is not a model folder (no config.json): a Hugging Face model folder "
        "holds config.json and the weights (*.safetensors), as written by save_pretrained or `queryrl export`"
    )


def rag_health_url(rag_url: str) -> str:
    """``GET /health`` of a service root, or of a ``{endpoint}`` template (``{endpoint}`` -> ``health``)."""
    if "{endpoint}" in rag_url:
        return rag_url.replace("{endpoint}", "health")
    return rag_url.rstrip("/") + "/health"


def check_rag(rag_url: str, timeout_s: float) -> str:
    """The RAG service answers ``GET /health`` (a 404 or 405 counts as an answer: a service without that
    route; its endpoints are probed next). Raises :class:`ServiceCheckFailed`."""
    import httpx

    url = rag_health_url(rag_url)
    try:
        response = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ServiceCheckFailed(
            f"RAG service at {rag_url} does not answer: GET {url}: {type(exc).__name__}: {exc or 'no reply'}"
        ) from None
    if response.status_code >= 500 or response.status_code in (401, 403):
        text = response.text.strip().replace("\n", " ")[:200]
        raise ServiceCheckFailed(f"RAG service at {rag_url}: GET {url} answered HTTP {response.status_code}: {text}")
    if response.status_code in (404, 405):
        return f"RAG service at {rag_url} answers (no /health route)"
    return f"RAG service at {rag_url}: /health HTTP {response.status_code}"


def probe_query(info: Mapping[str, Any]) -> str:
    """The rewrite a service check sends for a row's ``extra_info``: its current (last) user turn as written."""
    turns = [str(m.get("content") or "") for m in info.get("contexts") or [] if m.get("role") == "user"]
    return next((t.strip() for t in reversed(turns) if t.strip()), "") or "你好"


def check_rag_endpoint(rag: QueryRewriteRAGConfig, endpoint: str, info: Mapping[str, Any], row: str) -> str:
    """One ``POST`` to `endpoint` (``chat_8b`` or ``chat``) of the service at ``rag.url`` with the fields
    training sends for the row whose ``extra_info`` is `info` (:func:`~.reward.rag.rag_request_fields`, the
    rewrite being :func:`probe_query`), through a :class:`~queryrl.rag.RAGClient` made as training's (the
    same retries, token, ``document_fields`` and contract check). `row` names the row in messages.

    Raises:
        ServiceCheckFailed: the call failed or its answer breaks the contract: one line naming the URL
            and the field, its value and what was expected.
    """
    from queryrl.apps.query_rewrite.reward.rag import make_rag_client, rag_request_fields
    from queryrl.rag import RAGError
    from queryrl.rag.client import CHAT_FIELDS, endpoint_url

    assert rag.url is not None, "an external RAG service is checked, not the embedded one"
    fields = rag_request_fields(info, probe_query(info))
    if endpoint == "chat":
        fields = {k: v for k, v in fields.items() if k in CHAT_FIELDS}
    try:
        client = make_rag_client(rag)
    except (OSError, ValueError) as exc:  # TokenError: the token variable is not set
        raise ServiceCheckFailed(f"RAG service at {rag.url}: {exc}") from None
    url = endpoint_url(rag.url, endpoint)

    async def call() -> dict[str, Any]:
        try:
            return await (client.chat_8b(**fields) if endpoint == "chat_8b" else client.chat(**fields))
        finally:
            await client.aclose()

    try:
        answer = asyncio.run(call())
    except RAGError as exc:
        raise ServiceCheckFailed(f"RAG service at {rag.url}: POST {url} with {row}: {exc.error}") from None
    n = len(answer["response"])
    return f"RAG service: POST {url} with {row} answered {n} documents that keep the contract"


def check_judge(client: JudgeClient) -> str:
    """:meth:`JudgeClient.check` in its own event loop; raises :class:`ServiceCheckFailed`."""
    from queryrl.rewards.judge import JudgeConfigError, JudgeUnavailable

    try:
        return client.check_sync()
    except JudgeConfigError as exc:
        raise ServiceCheckFailed(str(exc)) from None  # "judge API key: environment variable ... is not set"
    except JudgeUnavailable as exc:
        raise ServiceCheckFailed(str(exc)) from None


def check_services(
    judge: JudgeClient | None,
    rag_url: str | None,
    rag_timeout_s: float,
    say: Callable[[str], None],
    endpoints: tuple[QueryRewriteRAGConfig, Mapping[str, Any], str] | None = None,
) -> None:
    """The judge (when an OpenAI-compatible one is used) and the external RAG service (when `rag_url`),
    in that order; with `endpoints` (the RAG settings, a row's ``extra_info``, how to name the row) also
    both endpoints (:func:`check_rag_endpoint`). Each check prints one line. Raises
    :class:`ServiceCheckFailed` at the first failure."""
    if judge is not None:
        say(f"checked {check_judge(judge)}")
    if rag_url is not None:
        say(f"checked {check_rag(rag_url, rag_timeout_s)}")
        if endpoints is not None:
            for endpoint in ("chat_8b", "chat"):
                say(f"checked {check_rag_endpoint(endpoints[0], endpoint, endpoints[1], endpoints[2])}")
