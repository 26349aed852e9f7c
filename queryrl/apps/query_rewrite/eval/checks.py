"""``queryrl eval``'s checks before any model is loaded: the services answer, the systems are model folders.

Generating with a model takes minutes to hours; a judge key that is not exported, a judge that refuses
a setting, a RAG service that is down, or a training checkpoint given where a model folder is expected
must each cost one clear message, not that time. :func:`check_services` runs first (after the cheap
argument checks): the judge's :meth:`~queryrl.rewards.judge.JudgeClient.check` (key variable, ``GET
/models``, one tiny request with the judge's settings) and the RAG service's ``GET /health``.
:func:`not_a_model_message` says what a folder without ``config.json`` is instead, and for a queryrl
checkpoint (``checkpoints/step_N``: ``state.json``, ``actor/``, ``optim.pt``, ``rng.pt``; see
:mod:`queryrl.trainer.checkpoint`) the ``queryrl export`` command that makes a model folder of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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


PROBE_TURN = [{"role": "user", "content": "你好，介绍一下你们的产品"}]


def check_rag_contract(
    rag_url: str, timeout_s: float, document_fields: dict[str, str] | None = None, token_env: str | None = None
) -> str:
    """One ``POST /rag/chat`` with a one-turn conversation: an answer that breaks the response contract
    (:func:`~queryrl.rag.client.contract_problem`, after `document_fields`) raises
    :class:`ServiceCheckFailed` naming the fields; an answer that is not a success (a service that needs
    real ids) leaves the contract to be checked on every answer during the run, and says so."""
    import httpx

    from queryrl.rag.client import check_document_fields, contract_problem, endpoint_url, map_document_fields
    from queryrl.service_auth import bearer_header

    fields = check_document_fields(document_fields or {})
    url = endpoint_url(rag_url.rstrip("/"), "chat")
    body = {"tenant_id": "", "contact_id": "", "account_id": "", "message_id": "", "contexts": PROBE_TURN}
    try:
        headers = bearer_header(token_env, "app.query_rewrite.rag.token_env")
        response = httpx.post(url, json=body, timeout=timeout_s, headers=headers)
        answer = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        return f"RAG contract not probed ({type(exc).__name__}); every answer is checked during the run"
    if answer is None or (isinstance(answer, dict) and answer.get("status") not in (None, "success")):
        return f"RAG contract not probed (POST {url}: HTTP {response.status_code}); every answer is checked"
    problem = contract_problem(map_document_fields(answer, fields), fields)
    if problem is not None:
        raise ServiceCheckFailed(f"RAG service at {rag_url}: POST {url}: {problem}")
    docs = answer.get("response") or []
    return f"RAG contract: POST {url} answered {len(docs)} documents with doc_id, title, content"


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
    judge: JudgeClient | None, rag_url: str | None, rag_timeout_s: float, say: Callable[[str], None]
) -> None:
    """The judge (when an OpenAI-compatible one is used) and the external RAG service (when `rag_url`),
    in that order; each check prints one line. Raises :class:`ServiceCheckFailed` at the first failure."""
    if judge is not None:
        say(f"checked {check_judge(judge)}")
    if rag_url is not None:
        say(f"checked {check_rag(rag_url, rag_timeout_s)}")
