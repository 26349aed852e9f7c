"""The query-rewrite application's commands: ``queryrl prepare conversations | kdconv`` and ``queryrl eval``.

The ``queryrl`` command line adds them through the plugin's
:meth:`~queryrl.application.Application.commands` (:func:`add_commands`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from queryrl.application import CommandLine

Debug = Annotated[
    bool,
    typer.Option("--debug", help="Show an error's traceback instead of its one-line message (or QUERYRL_DEBUG=1)."),
]


def _fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    raise typer.Exit(code=2)


class _ConversationsCommand(typer.core.TyperCommand):
    """Appends the mappable fields and roles to ``--help``, generated from the code's field list when shown."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from queryrl.apps.query_rewrite.data.log_import import fields_help

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
AnswerFormat = Annotated[
    str,
    typer.Option(
        help='json (the default: {"rewritten_query": ...}) or text (the query alone on one line, 无需检索 when no '
        "retrieval is needed; for small models that cannot write JSON yet). Stored in each row: the reward and "
        "eval parse what the prompt asked for."
    ),
]


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
    empty_messages: Annotated[
        str,
        typer.Option(
            help="skip: drop and count messages with an empty text (stickers, images, recalled messages) and "
            "conversations left without a user message; error: stop on them as bad rows."
        ),
    ] = "skip",
    rewrite_column: Annotated[
        str | None,
        typer.Option(
            help="Your reference pipeline's rewrite of each user turn, e.g. 改写query: the SFT target of that turn "
            "(default: queryrl's heuristic rewriter, which is not your pipeline)."
        ),
    ] = None,
    val_fraction: Annotated[float, typer.Option(help="Share of conversations for validation.")] = 0.1,
    test_fraction: Annotated[float, typer.Option(help="Share of conversations for test.")] = 0.1,
    seed: Annotated[int, typer.Option(help="Seed of the split by conversation.")] = 0,
    answer_fields: AnswerFields = "rewritten_query",
    answer_format: AnswerFormat = "json",
    domain: Annotated[
        str | None, typer.Option(help="The prompt's domain line, e.g. '电子产品销售客服' (default: 客服对话).")
    ] = None,
) -> None:
    """Conversation logs -> one query-rewrite prompt per user turn (verl parquet, split by conversation)."""
    from queryrl.apps.query_rewrite.data.conversations import check_empty_messages
    from queryrl.apps.query_rewrite.data.log_import import check_columns, parse_json_option, role_table
    from queryrl.apps.query_rewrite.data.splits import prepare_conversation_data
    from queryrl.apps.query_rewrite.prompts import check_answer_fields, check_answer_format
    from queryrl.data import DataError

    try:
        fields = check_answer_fields(answer_fields, "--answer-fields")
        fmt = check_answer_format(answer_format, fields, "--answer-format")
        mapping = check_columns(parse_json_option("--columns", columns), "--columns")
        role_values = parse_json_option("--roles", roles)
        role_table(role_values, "--roles")
        check_empty_messages(empty_messages, "--empty-messages")
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
            empty_messages=empty_messages,
            rewrite_column=rewrite_column,
            domain=domain,
            answer_fields=fields,
            answer_format=fmt,
        )
    except (DataError, ValueError) as exc:
        _fail(str(exc))
        return
    typer.echo(result.summary())
    for warning in result.warnings:
        typer.secho(f"warning: {warning}", err=True, fg=typer.colors.YELLOW)


def prepare_kdconv(
    input: Annotated[Path, typer.Option("--input", help="A KdConv dialogue file (e.g. travel/dev.json).")],
    kb: Annotated[Path, typer.Option("--kb", help="Its knowledge base (e.g. travel/kb_travel.json).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder.")],
    answer_fields: AnswerFields = "rewritten_query",
    answer_format: AnswerFormat = "json",
    domain: Annotated[
        str | None,
        typer.Option(help="The prompt's domain line (default: from the path: travel -> 旅游咨询（北京的景点）)."),
    ] = None,
) -> None:
    """KdConv -> query-rewrite rows (gold = the (entity, attribute) pairs the reply used) and the corpus."""
    import json

    from queryrl.apps.query_rewrite.data.conversations import write_parquet
    from queryrl.apps.query_rewrite.data.kdconv import kdconv_corpus, kdconv_domain, kdconv_missing, kdconv_rows
    from queryrl.apps.query_rewrite.data.sft_targets import add_sft_targets
    from queryrl.apps.query_rewrite.prompts import check_answer_fields, check_answer_format
    from queryrl.atomic import atomic_write_text
    from queryrl.data import DataError

    for path, option in ((input, "--input"), (kb, "--kb")):
        if not path.is_file():
            _fail(kdconv_missing(path, option))
    try:
        fields = check_answer_fields(answer_fields, "--answer-fields")
        fmt = check_answer_format(answer_format, fields, "--answer-format")
        line = domain or kdconv_domain(input, kb)
        options: dict[str, Any] = {"domain": line, "answer_fields": fields, "answer_format": fmt}
        rows = add_sft_targets(kdconv_rows(input, both_speakers=True, require_gold=True, **options))
        documents = kdconv_corpus(kb)  # read before anything is written: a bad KB leaves no half output
    except (DataError, ValueError) as exc:
        _fail(str(exc))
        return
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(rows, out / f"{input.stem}.parquet")
    corpus = out / "corpus.jsonl"
    atomic_write_text(corpus, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in documents))
    typer.echo(f"wrote {out / f'{input.stem}.parquet'} ({len(rows)} rows) and {corpus}")


def eval_(
    ctx: typer.Context,
    data: Annotated[
        str,
        typer.Option("--data", help="builtin://sales_demo/test, a .parquet or .jsonl file, or a KdConv .json file."),
    ],
    systems: Annotated[
        str,
        typer.Option(
            help="Comma-separated: raw_turn, concat_last3, reference, NAME=MODEL_FOLDER, MODEL_FOLDER, or "
            "NAME=MODEL_FOLDER+ADAPTER[+ADAPTER2] (LoRA adapter folders merged in order)."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="The JSON summary (eval.png, eval_samples.jsonl beside it).")],
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="A YAML preset: app.query_rewrite.rag/judge and data (default: none)."),
    ] = None,
    rag_url: Annotated[str | None, typer.Option(help="app.query_rewrite.rag.url: an external RAG service.")] = None,
    corpus: Annotated[
        str | None, typer.Option(help="app.query_rewrite.rag.corpus: the embedded service's (rag.url=null).")
    ] = None,
    top_k: Annotated[int | None, typer.Option(help="app.query_rewrite.rag.top_k: documents per result (>= 5).")] = None,
    judge: Annotated[
        str | None, typer.Option(help="none, or app.query_rewrite.judge.backend: offline or openai (default: none).")
    ] = None,
    judge_base_url: Annotated[str | None, typer.Option(help="app.query_rewrite.judge.base_url: the API root.")] = None,
    judge_model: Annotated[str | None, typer.Option(help="app.query_rewrite.judge.model.")] = None,
    judge_api_key_env: Annotated[
        str | None, typer.Option(help="app.query_rewrite.judge.api_key_env: the key's env var ('' = no key).")
    ] = None,
    position_swap: Annotated[
        bool | None,
        typer.Option("--position-swap/--no-position-swap", help="app.query_rewrite.judge.position_swap."),
    ] = None,
    judge_temperature: Annotated[
        float | None, typer.Option(help="app.query_rewrite.judge.temperature (GPT-5 / o-series: leave it out).")
    ] = None,
    judge_max_tokens: Annotated[int | None, typer.Option(help="app.query_rewrite.judge.max_tokens.")] = None,
    judge_token_limit_param: Annotated[
        str | None,
        typer.Option(help="app.query_rewrite.judge.token_limit_param: max_completion_tokens or max_tokens."),
    ] = None,
    judge_reasoning_effort: Annotated[
        str | None, typer.Option(help="app.query_rewrite.judge.reasoning_effort: minimal, low, medium or high.")
    ] = None,
    judge_extra_body: Annotated[
        str | None,
        typer.Option(help='app.query_rewrite.judge.extra_body as a JSON object, e.g. \'{"verbosity": "low"}\'.'),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Generation micro-batch of a model system.")] = 16,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(help="A model's reply budget (default: data.max_response_length with a config, else 64)."),
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
    processes: Annotated[
        int,
        typer.Option(help="Model systems generated at once, each in its own process with a share of the threads."),
    ] = 1,
    vocab_ids: Annotated[
        str | None,
        typer.Option(
            "--vocab-ids",
            help="Decode with a vocabulary-restricted head (model.vocab.restrict's kept ids): FILE for every model "
            "system, or NAME=FILE[,NAME=FILE] for those; FILE a vocab_ids.json or a folder holding one.",
        ),
    ] = None,
    kb: Annotated[
        Path | None,
        typer.Option(
            help="A KdConv --data file's knowledge base (default: --corpus kdconv:KB, else kb_*.json beside)."
        ),
    ] = None,
    history_chars: Annotated[
        int | None, typer.Option(help="A KdConv --data file's history characters in the prompt (default 320).")
    ] = None,
    answer_format: Annotated[
        str | None, typer.Option(help="A KdConv --data file's prompt asks for: text (default) or json.")
    ] = None,
    mentions: Annotated[
        int | None,
        typer.Option(
            help="A KdConv --data file's prompts carry a history summary of the knowledge base's names mentioned "
            "before the turn, the latest N (as the bench's --mentions N trained them; default 0: none)."
        ),
    ] = None,
    debug: Debug = False,
) -> None:
    """Evaluate query rewriters and the baselines: retrieval metrics, judge win/tie/loss, table and chart.

    queryrl eval --data D --systems S --out O --config FILE key.sub=value ...: dotted keys accepted, as for train.

    The RAG service and the judge are the app's settings app.query_rewrite.rag.* and app.query_rewrite.judge.*:
    --config, then dotted keys as extra arguments, e.g. app.query_rewrite.rag.top_k=10 (verl keys accepted).

    --rag-url, --corpus, --top-k, --judge and --judge-* are shorthands for those keys. Without --config,
    nothing is judged unless --judge or app.query_rewrite.judge.backend=... asks for it.

    --systems NAME=BASE+ADAPTER[+ADAPTER2]: a model folder with LoRA adapter folders merged into it in order.
    --data FILE.json, a KdConv dialogue file: its turns with gold, prepared on the fly (--kb, --history-chars,
    --answer-format, --mentions), the embedded service searching its knowledge base.
    """
    from queryrl.apps.query_rewrite.eval.kdconv_file import KdConvSettings
    from queryrl.apps.query_rewrite.eval.run import evaluate
    from queryrl.apps.query_rewrite.eval.samples import EvalError
    from queryrl.apps.query_rewrite.eval.settings import load_eval_config

    shorthands = {
        "rag_url": rag_url,
        "corpus": corpus,
        "top_k": top_k,
        "judge": judge,
        "judge_base_url": judge_base_url,
        "judge_model": judge_model,
        "judge_api_key_env": judge_api_key_env,
        "position_swap": position_swap,
        "judge_temperature": judge_temperature,
        "judge_max_tokens": judge_max_tokens,
        "judge_token_limit_param": judge_token_limit_param,
        "judge_reasoning_effort": judge_reasoning_effort,
        "judge_extra_body": judge_extra_body,
    }
    try:
        settings = load_eval_config(config, list(ctx.args), **shorthands)
        evaluate(
            data,
            systems,
            out,
            settings.cfg,
            judge=settings.judge,
            batch_size=batch_size,
            max_new_tokens=max_new_tokens or settings.max_new_tokens,
            n_boot=bootstrap,
            seed=seed,
            max_samples=max_samples,
            dtype=dtype,
            compare=compare,
            processes=processes,
            kdconv=_kdconv_settings(kb, history_chars, answer_format, mentions, KdConvSettings),
            vocab_ids=vocab_ids,
            echo=typer.echo,
            warn=lambda message: typer.secho(message, err=True, fg=typer.colors.RED),
        )
    except EvalError as exc:
        _fail(str(exc))


def _kdconv_settings(
    kb: Path | None, history_chars: int | None, answer_format: str | None, mentions: int | None, make: Any
) -> Any:
    """``queryrl eval``'s KdConv-file options as `make` (:class:`~.eval.kdconv_file.KdConvSettings`), None if none
    was given (the defaults, and no complaint when the data is not a KdConv file)."""
    if kb is None and history_chars is None and answer_format is None and mentions is None:
        return None
    defaults = make()
    return make(
        kb=kb,
        history_chars=defaults.history_chars if history_chars is None else history_chars,
        answer_format=answer_format or defaults.answer_format,
        mentions=defaults.mentions if mentions is None else mentions,
    )


def warmup(
    model: Annotated[Path, typer.Option("--model", help="The model folder that writes the rewrites.")],
    data: Annotated[str, typer.Option("--data", help="A prepared training split (.parquet / .jsonl, builtin://).")],
    out: Annotated[Path, typer.Option("--out", help="Folder for warmup.parquet (the SFT data) and warmup.json.")],
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="A YAML preset: app.query_rewrite.rag (default: none).")
    ] = None,
    rag_url: Annotated[str | None, typer.Option(help="app.query_rewrite.rag.url: an external RAG service.")] = None,
    corpus: Annotated[
        str | None, typer.Option(help="app.query_rewrite.rag.corpus: the embedded service's (rag.url=null).")
    ] = None,
    top_k: Annotated[int | None, typer.Option(help="app.query_rewrite.rag.top_k: documents per result.")] = None,
    samples: Annotated[
        int, typer.Option(min=0, help="Rewrites sampled per turn from the model (0: the reference's answer only).")
    ] = 4,
    shots: Annotated[int, typer.Option(min=0, help="Worked examples (other training turns) in each prompt.")] = 3,
    temperature: Annotated[float, typer.Option(min=0.01, help="Sampling temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option(min=0.01, max=1.0, help="Nucleus sampling mass.")] = 0.95,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Reply budget of each sample.")] = 48,
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences per generation micro-batch.")] = 8,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 or float16 (default: the folder's).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the examples and the sampling.")] = 0,
    reference: Annotated[
        bool, typer.Option("--reference/--no-reference", help="The reference rewriter's answer is a candidate too.")
    ] = True,
    max_rows: Annotated[int | None, typer.Option(min=1, help="Only the first N rows of --data.")] = None,
    vocab_ids: Annotated[
        Path | None,
        typer.Option(
            help="A vocab_ids.json (or a folder holding one): a model trained with a restricted head samples with it."
        ),
    ] = None,
) -> None:
    """Self-driven warm-up data (ConvSearch-R1): the model's own rewrites that retrieve gold, as SFT targets.

    Samples --samples rewrites per training turn from --model (a few-shot prompt, the row's answer format),
    retrieves with each, keeps the one (or the reference rewriter's answer) whose result ranks a gold
    document highest, and writes the rows with that target: train on it with queryrl sft.
    """
    from queryrl.apps.query_rewrite.eval.generation import check_dtype
    from queryrl.apps.query_rewrite.eval.run import config_rag_client
    from queryrl.apps.query_rewrite.eval.samples import EvalError
    from queryrl.apps.query_rewrite.eval.settings import load_eval_config
    from queryrl.apps.query_rewrite.warmup import WarmupSettings, build_warmup, write_warmup
    from queryrl.data.builtin import resolve_data_path
    from queryrl.data.records import DataError, load_records

    try:
        check_dtype(dtype)
        if not (model / "config.json").is_file():
            raise EvalError(f"--model {model}: not a Hugging Face model folder (no config.json)")
        if vocab_ids is not None:  # read once here, so a bad file fails before the model loads
            from queryrl.apps.query_rewrite.eval.generation import read_vocab
            from queryrl.models.vocab import VOCAB_FILE

            vocab_ids = vocab_ids / VOCAB_FILE if vocab_ids.is_dir() else vocab_ids
            if not vocab_ids.is_file():
                raise EvalError(f"--vocab-ids {vocab_ids}: no such file (a vocab_ids.json, or a folder holding one)")
            read_vocab(vocab_ids)
        settings = WarmupSettings(
            samples,
            shots,
            temperature,
            top_p,
            max_new_tokens,
            batch_size,
            dtype,
            seed=seed,
            reference=reference,
            vocab_ids=str(vocab_ids) if vocab_ids is not None else None,
        )
        cfg = load_eval_config(config, [], rag_url=rag_url, corpus=corpus, top_k=top_k).cfg
        try:
            rows = load_records(resolve_data_path(data))
        except (DataError, ValueError) as exc:
            raise EvalError(f"--data {data!r}: {exc}") from None
        rows = rows[:max_rows] if max_rows else rows
        if not rows:
            raise EvalError(f"--data {data!r}: no rows")
        result = build_warmup(model, rows, config_rag_client(cfg), settings, cfg.app.query_rewrite.rag.url, typer.echo)
    except (EvalError, ValueError) as exc:
        _fail(str(exc))
        return
    parquet, summary = write_warmup(result, out, settings, data)
    report = result.report()
    typer.echo(
        f"kept {report['kept']} of {report['turns']} turns ({report['target_source']}, "
        f"{report['kept_no_retrieval_turns']} no-retrieval), dropped {report['dropped_no_gold_found']} "
        f"where no candidate found gold; model samples format_ok {report['model_format_ok']}"
    )
    typer.echo(f"wrote {parquet} and {summary}")
    if not report["kept_retrieval_turns"]:
        _fail("no retrieval turn kept: no candidate found a gold document; nothing to warm up on")


def add_commands(cli: CommandLine) -> None:
    """``queryrl prepare conversations``, ``queryrl prepare kdconv``, ``queryrl eval`` and ``queryrl warmup``."""
    cli.prepare.command("conversations", cls=_ConversationsCommand)(prepare_conversations)
    cli.prepare.command("kdconv")(prepare_kdconv)
    extra_args = {"allow_extra_args": True, "ignore_unknown_options": True}  # dotted keys, as for `queryrl train`
    cli.app.command("eval", context_settings=extra_args)(cli.guard(eval_))
    cli.app.command("warmup")(cli.guard(warmup))
