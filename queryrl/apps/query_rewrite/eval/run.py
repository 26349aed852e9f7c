"""``queryrl eval``: query rewriters against the baselines, on retrieval metrics and the pairwise judge.

    settings = load_eval_config("configs/query_rewrite_demo.yaml", ["app.query_rewrite.rag.top_k=10"])
    result = evaluate("builtin://sales_demo/test", "raw_turn,concat_last3,reference,grpo=out/model",
                      "runs/eval/eval.json", settings.cfg, judge=settings.judge)

The settings are the application's config nodes ``app.query_rewrite.rag`` and ``app.query_rewrite.judge``
(the reward's own), loaded like ``queryrl train``'s (:mod:`~queryrl.apps.query_rewrite.eval.settings`).
:func:`evaluate` is the orchestration; each job has its module:

1. the systems and the rows (:mod:`~queryrl.apps.query_rewrite.eval.samples`): ``raw_turn``,
   ``concat_last3``, ``reference`` and model folders (``NAME=PATH``);
2. the checks before anything costs time (:mod:`~queryrl.apps.query_rewrite.eval.checks`): the judge's key
   variable, its ``GET /models`` and one tiny request with the judge's settings (a temperature GPT-5
   refuses fails here), the RAG service's ``GET /health``;
3. each model's greedy answers (:mod:`~queryrl.apps.query_rewrite.eval.generation`);
4. retrieval and judging through the reward's RAG client and judge
   (:mod:`~queryrl.apps.query_rewrite.eval.scoring`): every system but ``reference`` retrieves through
   ``/rag/chat_8b`` with its query and is judged against the reference result on each sample. A model
   reply that does not parse is a format failure: no RAG call, an empty result (recall 0, counted in the
   metrics) and, with a judge, a loss against the reference;
5. the metrics with their percentile-bootstrap 95 % intervals
   (:func:`~queryrl.apps.query_rewrite.metrics.system_metrics`,
   :func:`~queryrl.apps.query_rewrite.metrics.judge_metrics`) and the paired differences of
   ``--compare`` (:mod:`~queryrl.apps.query_rewrite.eval.compare`);
6. the outputs (:mod:`~queryrl.apps.query_rewrite.eval.outputs`): ``out``, ``eval.png``,
   ``eval_samples.jsonl`` and the printed tables.

Metrics per system, over the samples with gold (``n`` of them, ``n_skipped`` without): ``format_ok`` (the
parsed fraction, 1 for the baselines; a ``text``-format reply with more after its one-line answer is
retrieved with but not format_ok), ``recall@k`` and ``ndcg@k`` for each k of (1, 3, 5, 10) that is
at most ``top_k`` (the result lists are no longer), and ``mrr``, each with its interval
(``<metric>_low`` / ``<metric>_high``). With a judge, every system but ``reference``: ``win``, ``tie``,
``loss``, ``judge_n`` (valid verdicts), ``judge_failed`` (no verdict: no gold for the offline judge, a
failed call, or with ``position_swap`` two orders that disagree), ``win_rate`` and ``judge_score``
((wins + ties / 2) / n) with intervals, ``judge_calls`` and ``judge_call_failed``. ``by_kind``: recall@5
and MRR per turn kind (``extra_info.kind``, else ``extra_info.turn_type``); ``context_dependent``: the
same over the turns that need the history -- those whose kind is not ``explicit`` when the data has
kinds, else (KdConv and logs, which carry no marker) those with any earlier message in ``contexts``.
Turns that need no retrieval (no gold, kind ``chitchat``): ``n_no_retrieval``, ``abstain_accuracy`` (the
share where the system's query was empty: for ``reference`` the service's own rewrite, the baselines
never abstain) and ``false_abstain`` (the share of turns with gold where it was empty); an empty query
costs no RAG call, and the offline judge prefers no documents to any on those turns. Meaning kept, on
every turn (:mod:`~.eval.intent`): ``intent_kept`` with its interval and ``intent_n`` (the offline check);
with an OpenAI-compatible judge also ``intent_kept_judge`` (the LLM asked the same question).

``compare`` (``--compare grpo:sft,grpo:reference``): for each pair A:B, the paired difference A - B of
recall@5, MRR and NDCG@5 over the same turns with its paired bootstrap interval, the shares of turns where
A > B / A < B / A = B, the judge-score difference where both were judged, and the ``intent_kept``
(``intent_kept_judge``) difference over every turn: ``comparisons`` in the
JSON, a second printed table and a third panel of ``eval.png``. A name that is not one of the systems is
an :class:`~.eval.samples.EvalError` before anything is generated.

Errors: an unknown system, a missing model folder (a training checkpoint gets the ``queryrl export``
command that makes one), a data file that cannot be read, a service check that fails or an unreachable
RAG service raise :class:`~.eval.samples.EvalError` with one message naming what. Judge calls that fail
during the run are counted (``judge_calls`` in the JSON: sent, failed, the first error) and warned about
with the count and the first error; when every one failed, :class:`~.eval.samples.EvalError` is raised
after the outputs are written (the CLI exits 2).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from queryrl.apps.query_rewrite.config import QueryRewriteJudgeConfig, QueryRewriteRAGConfig, settings_of
from queryrl.apps.query_rewrite.eval.checks import ServiceCheckFailed, check_services
from queryrl.apps.query_rewrite.eval.compare import compare_systems, parse_compare, per_sample_values
from queryrl.apps.query_rewrite.eval.generation import (
    answers_in_processes,
    check_dtype,
    model_answers,
    model_dtype,
    read_vocab,
    record_heads,
    vocab_files,
)
from queryrl.apps.query_rewrite.eval.intent import (
    SystemIntents,
    assess_intents,
    compare_intents,
    intent_call_summary,
    intent_metrics,
)
from queryrl.apps.query_rewrite.eval.kdconv_file import KdConvSettings, is_kdconv_file, prepare_kdconv
from queryrl.apps.query_rewrite.eval.outputs import eval_notes, sample_records, write_outputs
from queryrl.apps.query_rewrite.eval.samples import (
    Answer,
    EvalError,
    Sample,
    SystemSpec,
    baseline_answers,
    context_dependent,
    load_samples,
    parse_systems,
)
from queryrl.apps.query_rewrite.eval.scoring import (
    JudgeOutcome,
    complain_about_judge,
    doc_ids,
    judge_all,
    judge_call_summary,
    judge_spend,
    retrieve,
    spend_line,
)
from queryrl.apps.query_rewrite.metrics import DEFAULT_KS, HEADLINE_K, judge_metrics, system_metrics
from queryrl.apps.query_rewrite.reward.judge import judge_client
from queryrl.apps.query_rewrite.reward.rag import rag_client
from queryrl.machine import machine_info
from queryrl.rag import RAGClient
from queryrl.rewards.judge import JudgeClient


def evaluate(
    data: str,
    systems: str | Sequence[str],
    out: str | Path,
    cfg: DictConfig | None = None,
    *,
    judge: bool = False,
    batch_size: int = 16,
    max_new_tokens: int = 64,
    n_boot: int = 1000,
    seed: int = 0,
    max_samples: int | None = None,
    cache_dir: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    compare: str | Sequence[str] | None = None,
    processes: int = 1,
    kdconv: KdConvSettings | None = None,
    vocab_ids: str | None = None,
    echo: Callable[[str], None] | None = print,
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Evaluate `systems` on `data`, write the outputs and return the JSON summary (see the module doc).

    Args:
        data: ``builtin://NAME/SPLIT``, a ``.parquet`` or a ``.jsonl`` file of query-rewrite rows, or a KdConv
            dialogue file (``.json``) prepared on the fly with `kdconv` (:mod:`~.eval.kdconv_file`; None: the
            bench's recipe, the knowledge base beside the file).
        systems: ``--systems``, a comma-separated string or a list (:func:`~.eval.samples.parse_systems`).
        out: the JSON summary's path; ``eval.png`` and ``eval_samples.jsonl`` go next to it.
        cfg: a loaded config (:func:`~.eval.settings.load_eval_config`; None: the defaults): the RAG service
            ``app.query_rewrite.rag`` (``url`` None: the embedded one; ``top_k`` >= 5) and the judge.
        judge: judge every system but ``reference`` against it with ``app.query_rewrite.judge``.
        batch_size, max_new_tokens, device, dtype: a model system's generation (`dtype` None: the folder's).
        n_boot, seed: the bootstrap.
        max_samples, cache_dir: only the first rows (None / 0: all); where ``builtin://`` data is made.
        compare: ``--compare``: ``A:B`` pairs of system names (:func:`~.eval.compare.parse_compare`).
        processes: model systems generated at once, each in its own process with its share of the torch
            threads (1: one after another in this process).
        vocab_ids: ``--vocab-ids``: the model systems that decode with a restricted head, and their kept ids
            (:func:`~.eval.generation.vocab_files`); ``settings.systems`` records each one's head.
        echo, warn: where progress and the tables go (None: silent), and warnings (default: stderr).

    Raises:
        EvalError: see the module doc.
    """
    cfg = cfg if cfg is not None else _defaults()
    rag, judge_node = cfg.app.query_rewrite.rag, cfg.app.query_rewrite.judge if judge else None
    judge_check = _check_arguments(rag, judge_node, batch_size, max_new_tokens, n_boot, dtype, processes)
    say = echo or (lambda _: None)
    specs, pairs = _systems(systems, compare)
    files = vocab_files(vocab_ids, [s.name for s in specs if s.kind == "model"])
    kept = {name: read_vocab(path) for name, path in files.items()}
    samples = load_samples(data, max_samples, cache_dir, _kdconv_rows(data, cfg, kdconv, say))
    say(f"{len(samples)} samples from {data}; systems: {', '.join(s.name for s in specs)}")
    # the judge and the RAG service answer (both endpoints, with the first sample), before any model is loaded
    judge_spend(judge_check)  # the shared client's counters start at 0: this evaluation's spend, the check's too
    _check_services(judge_check, rag, say, samples[0], data)
    client = config_rag_client(cfg)
    if rag.url is None:  # the embedded service: a corpus that fails to load costs no model time (an external
        asyncio.run(retrieve(client, samples[:1], {}, rag.url))  # one was just checked, both endpoints)
    answers = _all_answers(specs, samples, batch_size, max_new_tokens, device, dtype, processes, say, kept)
    references, candidates = asyncio.run(retrieve(client, samples, answers, rag.url))
    results = {s.name: list(references) if s.kind == "reference" else candidates[s.name] for s in specs}
    outcomes = _judge_systems(judge_node, judge_check, specs, samples, results, references, int(rag.top_k), say)
    verdicts = {name: outcome.verdicts for name, outcome in outcomes.items()}
    asked = judge_node is not None and judge_node.backend == "openai" and bool(judge_node.intent_check)
    llm = judge_check if asked else None
    lang = str(judge_node.lang) if judge_node is not None else "zh"
    intents = assess_intents(specs, samples, answers, results, llm, lang, say)  # eval_intent.py
    values = _per_sample_values(specs, samples, results)
    run = {"batch_size": batch_size, "max_new_tokens": max_new_tokens, "decoding": "greedy", "bootstrap": n_boot}
    run |= {"compare": [f"{a}:{b}" for a, b in pairs], "ci": 0.95, "seed": seed, "max_samples": max_samples}
    run["processes"] = processes
    run["machine"] = machine_info().as_dict()  # what the generation ran on (queryrl.machine)
    report = _report(data, specs, samples, answers, results, outcomes, values, pairs, rag, judge_node, run, intents)
    record_heads(report["settings"]["systems"], files, kept)
    report["judge_calls"] |= judge_spend(judge_check)  # tokens (reasoning among them) and, with prices, the cost
    records = sample_records(samples, specs, answers, results, verdicts, values, intents)
    write_outputs(report, records, Path(out), say)
    if (spent := spend_line(report["judge_calls"])) is not None:
        say(spent)
    complain_about_judge(report["judge_calls"], Path(out), warn)
    if not any(s.gold for s in samples):  # the table's n is 0: say why rather than print zeros silently
        (warn or _stderr)(
            f"warning: no row of {data} has gold document ids: Recall@k, MRR and NDCG were skipped (n 0 in the table); "
            "format, abstention and the judge are reported"
        )
    return report


def _kdconv_rows(
    data: str, cfg: DictConfig, kdconv: KdConvSettings | None, say: Callable[[str], None]
) -> list[dict[str, Any]] | None:
    """A KdConv dialogue file's rows (:func:`~.eval.kdconv_file.prepare_kdconv`), None for other data."""
    if is_kdconv_file(data):
        return prepare_kdconv(data, cfg, kdconv, say)
    if kdconv is not None:
        raise EvalError(
            f"--kb, --history-chars, --answer-format and --mentions are for a KdConv .json file; {data!r} is not one"
        )
    return None


def _stderr(message: str) -> None:
    import sys

    print(message, file=sys.stderr)


def _defaults() -> DictConfig:
    from queryrl.config import load_config

    return load_config(None, [], allow_missing=True)


def _systems(systems: str | Sequence[str], compare: str | Sequence[str] | None) -> tuple[list[SystemSpec], Any]:
    """The systems and the ``--compare`` pairs: a misspelt pair fails here, before anything costs time."""
    specs = parse_systems(systems)
    try:
        return specs, parse_compare(compare, [s.name for s in specs])
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def _check_services(
    judge_check: JudgeClient | None, rag: Any, say: Callable[[str], None], first: Sample, data: str
) -> None:
    settings = OmegaConf.to_object(rag)
    assert isinstance(settings, QueryRewriteRAGConfig)
    info = {**first.ids, "contexts": first.contexts, "user_profile": first.user_profile}
    info["history_summary"] = first.history_summary
    try:
        check_services(judge_check, rag.url, float(rag.timeout_s), say, (settings, info, f"the first row of {data}"))
    except ServiceCheckFailed as exc:
        raise EvalError(str(exc)) from None


def _per_sample_values(
    specs: Sequence[SystemSpec], samples: Sequence[Sample], results: Mapping[str, Sequence[Mapping[str, Any] | None]]
) -> dict[str, list[dict[str, float] | None]]:
    """Each system's recall@5 / MRR / NDCG@5 per sample (None without gold): ``--compare``'s inputs."""
    golds = [s.gold for s in samples]
    return {s.name: per_sample_values([doc_ids(r) for r in results[s.name]], golds, HEADLINE_K) for s in specs}


def _report(
    data: str,
    specs: Sequence[SystemSpec],
    samples: Sequence[Sample],
    answers: Mapping[str, Sequence[Answer] | None],
    results: Mapping[str, Sequence[Mapping[str, Any] | None]],
    outcomes: Mapping[str, JudgeOutcome],
    values: Mapping[str, Sequence[Mapping[str, float] | None]],
    pairs: Sequence[tuple[str, str]],
    rag: Any,
    judge: Any | None,
    run: Mapping[str, Any],
    intents: Mapping[str, SystemIntents],
) -> dict[str, Any]:
    """The JSON summary: each system's metrics, the comparisons, the judge calls and the settings."""
    n_boot, seed = int(run["bootstrap"]), int(run["seed"])
    dependent, dependent_rule = context_dependent(samples)
    ks = [k for k in DEFAULT_KS if k <= int(rag.top_k)]
    summary = {
        s.name: _metrics(s, samples, answers[s.name], results[s.name], outcomes, dependent, ks, n_boot, seed)
        | intent_metrics(intents[s.name], n_boot, seed)
        for s in specs
    }
    verdicts = {name: outcome.verdicts for name, outcome in outcomes.items()}
    # whole conversations resampled too where the data names them (without ids it would repeat the turns' interval)
    named = any(s.conversation_id for s in samples)
    groups = [s.conversation_id for s in samples] if named else None
    comparisons = compare_systems(pairs, values, verdicts, n_boot, seed, groups=groups)
    for key, entry in compare_intents(pairs, intents, n_boot, seed).items():
        comparisons[key] |= entry
    return {
        "systems": summary,
        "comparisons": comparisons,
        "eval_file": data,
        "n_samples": len(samples),
        "judge_calls": intent_call_summary(judge_call_summary(outcomes), intents),
        "settings": _settings(specs, rag, judge, ks) | dict(run) | {"context_dependent": dependent_rule},
        "notes": eval_notes([s.gold for s in samples], comparisons),
    }


def _check_arguments(
    rag: Any, judge: Any | None, batch_size: int, max_new_tokens: int, n_boot: int, dtype: str | None, processes: int
) -> JudgeClient | None:
    """The checks that cost nothing; returns the OpenAI-compatible judge's client (None: offline or none)."""
    llm = judge if judge is not None and judge.backend == "openai" else None
    if llm is not None and (OmegaConf.is_missing(llm, "base_url") or not llm.base_url or not llm.model):
        raise EvalError("the openai judge needs app.query_rewrite.judge.base_url and .model (--judge-base-url)")
    try:
        judge_check = _judge_client(llm) if llm is not None else None
    except ValueError as exc:  # a judge setting out of range (temperature, reasoning effort, ...)
        raise EvalError(str(exc)) from None
    if int(rag.top_k) < HEADLINE_K:
        raise EvalError(
            f"app.query_rewrite.rag.top_k (--top-k) must be at least {HEADLINE_K} "
            f"(recall@{HEADLINE_K} is the headline metric)"
        )
    if batch_size < 1 or max_new_tokens < 1 or n_boot < 1 or processes < 1:
        raise EvalError("--batch-size, --max-new-tokens, --bootstrap and --processes must be >= 1")
    check_dtype(dtype)
    return judge_check


def _judge_client(judge: Any) -> JudgeClient:
    """The reward's shared judge client for the ``app.query_rewrite.judge`` node `judge` (backend openai)."""
    settings = OmegaConf.to_object(judge)
    assert isinstance(settings, QueryRewriteJudgeConfig)
    return judge_client(settings)


def config_rag_client(cfg: DictConfig) -> RAGClient:
    """The reward's shared RAG client for ``app.query_rewrite.rag`` (as the reward reads it:
    :func:`~queryrl.apps.query_rewrite.config.settings_of`)."""

    rag = OmegaConf.to_object(cfg.app.query_rewrite.rag)
    assert isinstance(rag, QueryRewriteRAGConfig)
    if rag.reference_rewriter == "policy":  # the initial policy where no reference model is named
        rag = settings_of(cfg).rag
    try:
        return rag_client(rag)
    except (OSError, ValueError) as exc:
        raise EvalError(f"corpus {rag.corpus!r}: {exc}") from None


def _all_answers(
    specs: Sequence[SystemSpec],
    samples: Sequence[Sample],
    batch_size: int,
    max_new_tokens: int,
    device: str | None,
    dtype: str | None,
    processes: int,
    say: Callable[[str], None],
    kept: Mapping[str, list[int]],
) -> dict[str, list[Answer] | None]:
    """Every system's answers (:func:`_answers`); with `processes` > 1, the model systems' several at once; a
    model named in `kept` decodes with its head restricted to those ids."""
    models = {s.name: s.path for s in specs if s.kind == "model" and s.path is not None}
    if processes < 2 or len(models) < 2:
        return {s.name: _answers(s, samples, batch_size, max_new_tokens, device, dtype, say, kept) for s in specs}
    for spec in specs:
        if spec.name in models:
            say(f"{spec.name}: generating with {spec.source} ({model_dtype(models[spec.name], dtype, device)}) ...")
    say(f"... {min(processes, len(models))} models at once, each in its own process")
    adapters = {s.name: s.adapters for s in specs if s.adapters}
    done = answers_in_processes(models, samples, batch_size, max_new_tokens, processes, device, dtype, adapters, kept)
    return {
        spec.name: done[spec.name]
        if spec.name in done
        else _answers(spec, samples, batch_size, max_new_tokens, device, dtype, say, kept)
        for spec in specs
    }


def _answers(
    spec: SystemSpec,
    samples: Sequence[Sample],
    batch_size: int,
    max_new_tokens: int,
    device: str | None,
    dtype: str | None,
    say: Callable[[str], None],
    kept: Mapping[str, list[int]],
) -> list[Answer] | None:
    """A system's answers: a model's replies (its head restricted to `kept`'s ids for it), a baseline's queries,
    or None for ``reference``."""
    if spec.kind == "reference":
        return None
    if spec.kind != "model":
        return baseline_answers(spec.kind, samples)
    assert spec.path is not None
    say(f"{spec.name}: generating with {spec.source} ({model_dtype(spec.path, dtype, device)}) ...")
    vocab = kept.get(spec.name)
    return model_answers(spec.path, samples, batch_size, max_new_tokens, device, dtype, spec.adapters, vocab)


def _judge_systems(
    judge: Any | None,
    client: JudgeClient | None,
    specs: Sequence[SystemSpec],
    samples: Sequence[Sample],
    results: Mapping[str, Sequence[dict[str, Any] | None]],
    references: Sequence[dict[str, Any]],
    top_k: int,
    say: Callable[[str], None],
) -> dict[str, JudgeOutcome]:
    """Each system but ``reference`` judged against the reference ({} without a judge)."""
    outcomes: dict[str, JudgeOutcome] = {}
    if judge is None:
        return outcomes
    for spec in specs:
        if spec.kind != "reference":
            say(f"{spec.name}: judging against the reference ({judge.backend}) ...")
            outcomes[spec.name] = asyncio.run(
                judge_all(
                    samples,
                    results[spec.name],
                    references,
                    top_k=top_k,
                    client=client if judge.backend == "openai" else None,
                    lang=str(judge.lang),
                    position_swap=bool(judge.position_swap),
                )
            )
    return outcomes


def _metrics(
    spec: SystemSpec,
    samples: Sequence[Sample],
    answers: Sequence[Answer] | None,
    results: Sequence[Mapping[str, Any] | None],
    outcomes: Mapping[str, JudgeOutcome],
    dependent: Sequence[bool],
    ks: Sequence[int],
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    """One system's metrics: retrieval and abstention, and its judging where it was judged."""
    ok = [True] * len(samples) if answers is None else [a.query is not None and not a.trailing for a in answers]
    queries = (
        [str((r or {}).get("rewritten_query") or "") for r in results]
        if answers is None
        else [a.query if a.query is not None else "-" for a in answers]  # unparsed: not an abstention
    )
    abstained = [not q.strip() for q in queries]
    metrics = system_metrics([doc_ids(r) for r in results], samples, ok, dependent, ks, n_boot, seed, abstained)
    outcome = outcomes.get(spec.name)
    if outcome is not None:
        metrics |= judge_metrics(outcome.verdicts, n_boot, seed)
        if outcome.position_swap:
            metrics["judge_position_inconsistent"] = outcome.inconsistent
        metrics["judge_calls"] = outcome.calls
        metrics["judge_call_failed"] = outcome.failed
    return metrics


def _settings(specs: Sequence[SystemSpec], rag: Any, judge: Any | None, ks: Sequence[int]) -> dict[str, Any]:
    """The report's ``settings`` of the systems, the RAG service and the judge (``extra_body`` by its keys
    only: its values may be private)."""
    llm = judge if judge is not None and judge.backend == "openai" else None
    settings: dict[str, Any] = {
        "systems": [
            {"name": s.name, "kind": s.kind, "path": str(s.path) if s.path else None}
            | ({"adapters": [str(a) for a in s.adapters]} if s.adapters else {})
            for s in specs
        ],
        "rag_url": rag.url,
        "corpus": str(rag.corpus) if rag.url is None else None,
        "top_k": int(rag.top_k),
        "ks": list(ks),
        "judge": judge.backend if judge is not None else "none",
        "judge_model": llm.model if llm is not None else None,
        "judge_base_url": llm.base_url if llm is not None else None,
        "position_swap": bool(llm.position_swap) if llm is not None else False,
    }
    if llm is not None:
        settings |= {
            "judge_temperature": llm.temperature,
            "judge_max_tokens": llm.max_tokens,
            "judge_token_limit_param": llm.token_limit_param,
            "judge_reasoning_effort": llm.reasoning_effort,
            "judge_extra_body_keys": sorted(llm.extra_body or {}),
        }
    return settings
