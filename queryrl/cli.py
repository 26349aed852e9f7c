"""The command line: ``queryrl train | sft | pass-rate | prepare | export | convert-gguf | plot | serve-*``.

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


ConfigFile = Annotated[Path | None, typer.Option("--config", "-c", help="A YAML preset (configs/*.yaml).")]


def _run_config(ctx: typer.Context, config: Path | None, command: str, dry_run: bool) -> Any:
    """``train`` and ``sft``: the preset `config` with the command line's ``key=value`` overrides, its plan checked
    (printed and exit with --dry-run) and its secrets registered for redaction. Errors are left to
    :func:`_one_line_errors`."""
    from queryrl.config import load_config

    cfg = load_config(config, list(ctx.args))
    _check_plan(cfg, command, dry_run)
    _secrets_of(cfg)
    return cfg


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
def train(ctx: typer.Context, config: ConfigFile = None, dry_run: DryRun = False, debug: Debug = False) -> None:
    """Train with RL: queryrl train --config FILE key.sub=value ... (verl keys accepted)."""
    cfg = _run_config(ctx, config, "train", dry_run)
    if cfg.trainer.preflight:
        _preflight(cfg)
    from queryrl.trainer.loop import Trainer

    with Trainer(cfg) as trainer:  # writes machine.json: the CPU, native bf16, matmul rates
        metrics = trainer.fit()
    score = metrics.get("critic/score/mean")
    typer.echo(
        f"done: {cfg.trainer.output_dir}/{cfg.trainer.experiment_name}"
        + (f" (last score {score:.3f})" if score is not None else "")
    )


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_one_line_errors
def sft(ctx: typer.Context, config: ConfigFile = None, dry_run: DryRun = False, debug: Debug = False) -> None:
    """Supervised fine-tuning (a warm start before RL): queryrl sft --config FILE key.sub=value ..."""
    cfg = _run_config(ctx, config, "sft", dry_run)
    from queryrl.trainer.sft import train_sft

    result = train_sft(cfg)
    typer.echo(f"done: {result.output_dir} (final loss {result.final_loss:.3f})")


@app.command("pass-rate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_one_line_errors
def pass_rate(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Parquet file for the kept rows (a JSON report beside it).")],
    config: ConfigFile = None,
    samples: Annotated[int | None, typer.Option(help="Samples per prompt (default: rollout.n).", min=2)] = None,
    rows: Annotated[int | None, typer.Option(help="Only this many prompts, after a seeded shuffle.", min=1)] = None,
    keep_flat: Annotated[float, typer.Option(help="Share of the flat prompts kept too (seeded).")] = 0.0,
    debug: Debug = False,
) -> None:
    """Sample every training prompt with the run's starting policy and reward (the train config), and write the
    prompts whose samples' rewards differ, for data.train_files: queryrl pass-rate --config FILE --out FILE ..."""
    import json

    from queryrl.atomic import atomic_write_text
    from queryrl.machine import machine_info
    from queryrl.trainer.pass_rate import kept_rows, rate_rows, report_of, write_rows

    cfg = _run_config(ctx, config, "train", False)
    items, rates, seconds = rate_rows(cfg, samples, rows, progress=typer.echo)
    keep = kept_rows(rates, keep_flat, int(cfg.trainer.seed))
    report = report_of(cfg, rates, keep, keep_flat, seconds)
    write_rows(out, items, rates, keep)
    record = {**report.__dict__, "machine": machine_info().as_dict()}
    atomic_write_text(out.with_suffix(".json"), json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    typer.echo(f"{report.summary()} -> {out}")


@prepare_app.command("gsm8k")
@_one_line_errors
def prepare_gsm8k(
    input: Annotated[Path, typer.Option("--input", help="GSM8K JSONL ({question, answer} per line).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder for <split>.parquet.")],
    split: Annotated[str | None, typer.Option(help="Split name; default: the input file's stem.")] = None,
    debug: Debug = False,
) -> None:
    """GSM8K JSONL -> verl-format parquet."""
    from queryrl.data.gsm8k import prepare_gsm8k as run

    path = run(input, out, split)
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


def _add_serve_commands() -> None:
    """``serve-judge`` and ``serve-rag`` (queryrl.cli_serve)."""
    from queryrl.cli_serve import register

    register(app)


_add_serve_commands()


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
