"""``queryrl eval``: query rewriters against the baselines, on retrieval metrics and the pairwise judge.

    result = evaluate("builtin://sales_demo/test", ["raw_turn", "concat_last3", "reference", "grpo=out/model"],
                      "runs/eval/eval.json", judge="offline")

Systems (:func:`parse_systems`):

- ``raw_turn``: the last user turn as typed (:func:`~queryrl.apps.query_rewrite.evaluation.raw_last_turn`);
- ``concat_last3``: the last three user turns joined (:func:`~queryrl.apps.query_rewrite.evaluation.last_k_turns`);
- ``reference``: the reference pipeline ``/rag/chat`` (the service's own rewriter);
- ``NAME=PATH`` or a bare ``PATH``: a Hugging Face model folder (NAME defaults to the folder's name). It
  answers the row's chat-templated prompt greedily; the reply goes through
  :func:`~queryrl.apps.query_rewrite.reward_modes.parse_answer` (an empty query is an abstention: no
  retrieval, no RAG call).

Every system but ``reference`` retrieves through ``/rag/chat_8b`` with its query (and, for a model, the
profile and summary it answered; for a baseline, the row's own). A model reply that does not parse is a
format failure: no RAG call, an empty result (recall 0, counted in the metrics) and, with a judge, a
loss against the reference. ``format_ok`` is the parsed fraction (1 for the baselines).

Metrics per system, over the samples with gold (``n`` of them, ``n_skipped`` without): ``recall@k`` and
``ndcg@k`` for each k of (1, 3, 5, 10) that is at most ``top_k`` (the result lists are no longer), and
``mrr``, each with its percentile-bootstrap 95 % interval (``<metric>_low`` / ``<metric>_high``). With a
judge, every system but ``reference`` is judged against the reference result on each sample
(:func:`~queryrl.apps.query_rewrite.evaluation.win_tie_loss`, prefixed ``judge_`` where ambiguous):
``win``, ``tie``, ``loss``, ``judge_n`` (valid verdicts), ``judge_failed`` (no verdict: no gold for the
offline judge, a failed call, or with ``position_swap`` two orders that disagree), ``win_rate`` and
``judge_score`` ((wins + ties / 2) / n) with intervals. ``by_kind``: recall@5 and MRR per turn kind
(``extra_info.kind``, else ``extra_info.turn_type``); ``context_dependent``: the same over the turns that
need the history -- those whose kind is not ``explicit`` when the data has kinds, else (KdConv and
logs, which carry no marker) those with any earlier message in ``contexts``. Turns that need no
retrieval (no gold, kind ``chitchat``): ``n_no_retrieval``, ``abstain_accuracy`` (the share where the
system's query was empty: for ``reference`` the service's own rewrite, the baselines never abstain) and
``false_abstain`` (the share of turns with gold where it was empty); an empty query costs no RAG call,
and the offline judge prefers no documents to any on those turns.

Outputs, next to ``out`` (written atomically): the JSON summary ``out``, a bar chart ``eval.png`` (recall@5
and MRR per system, 95 % intervals) and ``eval_samples.jsonl`` (per sample: each system's query, its
top-5 doc ids, whether it parsed, the judge's verdict and, on turns with gold, its recall@5 / MRR / NDCG@5).

``compare`` (``--compare grpo:sft,grpo:reference``): for each pair A:B, the paired difference A - B of
recall@5, MRR and NDCG@5 over the same turns with its paired bootstrap interval, the shares of turns where
A > B / A < B / A = B, and the judge-score difference where both were judged
(:mod:`~queryrl.apps.query_rewrite.eval_compare`): ``comparisons`` in the JSON, a second printed table
("paired differences") and a third panel of ``eval.png``. A name that is not one of the systems is an
:class:`EvalError` before anything is generated.

Errors: an unknown system, a missing model folder (a training checkpoint gets the ``queryrl export``
command that makes one), a data file that cannot be read or an unreachable RAG service raise
:class:`EvalError` with one message naming what. Before any model generates, the services are checked
(:func:`~queryrl.apps.query_rewrite.eval_checks.check_services`): the judge's key variable, its ``GET
/models`` and one tiny request with the judge's settings (a temperature GPT-5 refuses fails here), the
RAG service's ``GET /health``. Judge calls that fail during the run are counted (``judge_calls`` in the
JSON: sent, failed, the first error; ``judge_call_failed`` per system) and warned about with the count
and the first error; when every one failed, :class:`EvalError` is raised after the outputs are written
(the CLI exits 2).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from queryrl.apps.query_rewrite.eval_checks import ServiceCheckFailed, check_services, not_a_model_message
from queryrl.apps.query_rewrite.eval_compare import (
    compare_systems,
    draw_differences,
    format_comparisons,
    parse_compare,
    per_sample_values,
)
from queryrl.apps.query_rewrite.evaluation import (
    DEFAULT_KS,
    abstain_metrics,
    abstained_result,
    bootstrap_ci,
    format_table,
    last_k_turns,
    mrr,
    ndcg_at_k,
    no_retrieval_turn,
    raw_last_turn,
    recall_at_k,
    win_tie_loss,
)
from queryrl.apps.query_rewrite.judging import (
    RUBRIC_VERDICT_SCHEMA,
    OfflineJudge,
    build_judge_messages,
    combine_swapped,
)
from queryrl.apps.query_rewrite.reward import ID_FIELDS, judge_client, rag_client
from queryrl.apps.query_rewrite.reward_modes import normalise_rewrite, parse_answer
from queryrl.atomic import atomic_path, atomic_write_text
from queryrl.rag import RAGClient, RAGError
from queryrl.rewards.judge import JudgeClient

BASELINES = ("raw_turn", "concat_last3", "reference")
JUDGES = ("none", "offline", "openai")
HEADLINE_K = 5
SAMPLES_TOP = 5  # doc ids per system in eval_samples.jsonl
RAG_CONCURRENCY = 16
LOSS: dict[str, Any] = {"better": "32b", "reason": "format_failure"}  # an unparsed reply loses to the reference


class EvalError(RuntimeError):
    """The evaluation cannot run as asked (unknown system, missing model, unreadable data, RAG down)."""


@dataclass(frozen=True)
class SystemSpec:
    """One system to evaluate: its name, its kind (a baseline's name, or ``"model"``) and a model's folder."""

    name: str
    kind: str
    path: Path | None = None


def parse_systems(spec: str | Sequence[str]) -> list[SystemSpec]:
    """The systems of ``--systems``: a comma-separated string or a list of entries.

    An entry is a baseline name (:data:`BASELINES`), ``NAME=PATH``, or a bare path (a string with a path
    separator, or an existing folder), whose name is the folder's. A model folder must hold ``config.json``.

    Raises:
        EvalError: no systems, an unknown name, a missing model folder, or a name used twice. A training
            checkpoint (``checkpoints/step_N``) is named as such, with the ``queryrl export`` command.
    """
    entries = [e.strip() for e in (spec.split(",") if isinstance(spec, str) else spec) if e and e.strip()]
    if not entries:
        raise EvalError("no systems to evaluate; e.g. --systems raw_turn,concat_last3,reference,grpo=PATH")
    out: list[SystemSpec] = []
    for entry in entries:
        if entry in BASELINES:
            out.append(SystemSpec(entry, entry))
            continue
        name, sep, raw_path = entry.partition("=")
        if not sep:
            raw_path = entry
            if os.sep not in entry and "/" not in entry and not Path(entry).expanduser().is_dir():
                raise EvalError(
                    f"unknown system {entry!r}: use {', '.join(BASELINES)}, NAME=PATH or the path of a model folder"
                )
            name = Path(entry).expanduser().resolve().name
        name, raw_path = name.strip(), raw_path.strip()
        if not name or not raw_path:
            raise EvalError(f"bad system {entry!r}: expected NAME=PATH with a name and a model folder")
        path = Path(raw_path).expanduser()
        if not (path / "config.json").is_file():  # a checkpoint gets the `queryrl export` command to run
            raise EvalError(not_a_model_message(name, path))
        out.append(SystemSpec(name, "model", path))
    names = [s.name for s in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise EvalError(f"system name(s) used twice: {', '.join(repeated)} (name model folders with NAME=PATH)")
    return out


# --- data ---------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One row to evaluate: what the RAG calls, the judge and the metrics need."""

    index: int
    prompt: list[dict[str, Any]]
    contexts: list[dict[str, str]]
    gold: list[str]
    ids: dict[str, str]
    user_profile: str
    history_summary: str
    kind: str
    conversation_id: str
    turn: Any


def load_samples(data: str, max_samples: int | None = None, cache_dir: str | None = None) -> list[Sample]:
    """The rows of `data` (``builtin://NAME/SPLIT``, ``.parquet``, ``.jsonl``), the first `max_samples` of them.

    Raises:
        EvalError: unreadable data, or a row without ``extra_info.contexts`` ending with a user turn.
    """
    from queryrl.data.builtin import resolve_data_path
    from queryrl.data.records import DataError, load_records

    try:
        rows = load_records(resolve_data_path(data, cache_dir))
    except (DataError, ValueError) as exc:
        raise EvalError(f"data {data!r}: {exc}") from None
    if max_samples is not None and max_samples > 0:
        rows = rows[:max_samples]
    if not rows:
        raise EvalError(f"data {data!r}: no rows")
    samples = []
    for i, row in enumerate(rows):
        info = dict(row.get("extra_info") or {})
        contexts = [{"role": str(m["role"]), "content": str(m["content"])} for m in info.get("contexts") or []]
        if not contexts or contexts[-1]["role"] != "user":
            raise EvalError(f"data {data!r}: row {i}: extra_info.contexts must end with the current user turn")
        truth = (row.get("reward_model") or {}).get("ground_truth")
        gold_raw = truth.get("gold_doc_ids") if isinstance(truth, Mapping) else truth
        gold = [gold_raw] if isinstance(gold_raw, str) else [str(g) for g in gold_raw or []]
        samples.append(
            Sample(
                index=i,
                prompt=list(row["prompt"]),
                contexts=contexts,
                gold=gold,
                ids={k: str(info.get(k) or "") for k in ID_FIELDS},
                user_profile=str(info.get("user_profile") or ""),
                history_summary=str(info.get("history_summary") or ""),
                kind=str(info.get("kind") or info.get("turn_type") or ""),
                conversation_id=str(info.get("conversation_id") or ""),
                turn=info.get("turn"),
            )
        )
    return samples


def context_dependent(samples: Sequence[Sample]) -> tuple[list[bool], str]:
    """(flag per sample, the rule used): kind != ``explicit`` when any sample has a kind, else has history."""
    if any(s.kind for s in samples):
        return [s.kind != "explicit" for s in samples], "kind != explicit"
    return [len(s.contexts) > 1 for s in samples], "contexts has an earlier message"


# --- queries ------------------------------------------------------------------------------------


@dataclass
class Answer:
    """A system's query for one sample: the parsed rewrite, or a format failure (``query`` None)."""

    query: str | None
    user_profile: str = ""
    history_summary: str = ""
    raw: str | None = None  # a model's reply text


def baseline_answers(kind: str, samples: Sequence[Sample]) -> list[Answer]:
    """The queries of ``raw_turn`` / ``concat_last3`` (the row's profile and summary sent along)."""
    make: Callable[[list[dict[str, str]]], str] = raw_last_turn if kind == "raw_turn" else last_k_turns
    return [Answer(make(s.contexts), s.user_profile, s.history_summary) for s in samples]


EVAL_DTYPES = ("float32", "bfloat16", "float16")


def model_dtype(path: Path, dtype: str | None = None) -> str:
    """`dtype` (``--dtype``), else the dtype the folder's config.json names (``torch_dtype``), else float32."""
    if dtype is not None:
        if dtype not in EVAL_DTYPES:
            raise EvalError(f"--dtype {dtype!r} is not one of: {', '.join(EVAL_DTYPES)}")
        return dtype
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "float32"
    saved = config.get("torch_dtype") or config.get("dtype") if isinstance(config, dict) else None
    return saved if saved in EVAL_DTYPES else "float32"


def model_answers(
    path: Path,
    samples: Sequence[Sample],
    batch_size: int,
    max_new_tokens: int,
    device: str | None = None,
    dtype: str | None = None,
) -> list[Answer]:
    """Greedy replies of the model in `path` to each sample's prompt, parsed (:func:`parse_answer`).

    The model is loaded in :func:`model_dtype` (`dtype`, else its folder's own dtype, else float32).
    """
    import torch
    from omegaconf import OmegaConf
    from torch import nn
    from transformers import AutoModelForCausalLM

    from queryrl.config import ModelConfig
    from queryrl.data.prompts import encode_prompt
    from queryrl.models.loading import DTYPES, load_tokenizer
    from queryrl.rollout.base import SamplingParams
    from queryrl.rollout.hf import HFRollout
    from queryrl.trainer.scoring import decode_responses

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = load_tokenizer(OmegaConf.structured(ModelConfig(path=str(path))))
    loaded: nn.Module = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[model_dtype(path, dtype)])
    model = loaded.to(dev)
    rollout = HFRollout(model, tokenizer, micro_batch_size=batch_size, device=dev)
    params = SamplingParams(do_sample=False, max_new_tokens=max_new_tokens)
    prompts = [encode_prompt(tokenizer, s.prompt) for s in samples]
    texts: list[str] = []
    for chunk in rollout.generate_chunks(prompts, params):
        texts += decode_responses(tokenizer, chunk)
    del model, rollout
    answers = []
    for sample, text in zip(samples, texts, strict=True):
        parsed = parse_answer(text)
        if parsed is None:
            answers.append(Answer(None, raw=text))
        else:  # a query-only answer (the default prompt): the row's own profile and summary go to /rag/chat_8b
            profile = parsed.user_profile or sample.user_profile
            summary = parsed.history_summary or sample.history_summary
            answers.append(Answer(parsed.rewritten_query, profile, summary, raw=text))
    return answers


# --- retrieval ----------------------------------------------------------------------------------


def _where(rag_url: str | None) -> str:
    return f"RAG service at {rag_url}" if rag_url else "embedded RAG service"


async def _retrieve(
    client: RAGClient,
    samples: Sequence[Sample],
    answers: Mapping[str, list[Answer] | None],
    rag_url: str | None,
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any] | None]]]:
    """(reference results, candidate results per system; None for a format failure)."""
    semaphore = asyncio.Semaphore(RAG_CONCURRENCY)

    async def call(endpoint: str, fields: dict[str, Any]) -> dict[str, Any]:
        async with semaphore:
            try:
                return await (client.chat(**fields) if endpoint == "chat" else client.chat_8b(**fields))
            except RAGError as exc:
                raise EvalError(f"{_where(rag_url)}: /rag/{endpoint} failed: {exc.error}") from None

    def common(s: Sample) -> dict[str, Any]:
        return {**s.ids, "contexts": [dict(c) for c in s.contexts]}

    async def candidate(s: Sample, a: Answer) -> dict[str, Any] | None:
        if a.query is None:
            return None
        if not a.query.strip():  # the system says the turn needs no retrieval
            return abstained_result()
        query = normalise_rewrite(a.query)
        fields = {
            **common(s),
            "user_profile": a.user_profile,
            "history_summary": a.history_summary,
            "rewritten_query": query,
        }
        return await call("chat_8b", fields)

    try:
        # one call first: a service that is down fails fast with one message
        first = await call("chat", common(samples[0]))
        rest = await asyncio.gather(*(call("chat", common(s)) for s in samples[1:]))
        references = [first, *rest]
        candidates: dict[str, list[dict[str, Any] | None]] = {}
        for name, system_answers in answers.items():
            if system_answers is None:
                continue
            candidates[name] = list(
                await asyncio.gather(*(candidate(s, a) for s, a in zip(samples, system_answers, strict=True)))
            )
    finally:
        await client.aclose()
    return references, candidates


def doc_ids(result: Mapping[str, Any] | None) -> list[str]:
    """The ``doc_id`` of a RAG result's documents in order ([] for None: a format failure)."""
    if result is None:
        return []
    return [str(d.get("doc_id")) for d in result.get("response") or []]


# --- judging ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeSettings:
    """How to judge: ``backend`` none / offline / openai and the openai client's settings (the request
    settings are sent only when set: :class:`~queryrl.rewards.judge.JudgeClient`)."""

    backend: str = "none"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    position_swap: bool = False
    lang: str = "zh"
    timeout_s: float = 30.0
    max_retries: int = 3
    temperature: float | None = None
    max_tokens: int | None = None
    token_limit_param: str = "max_completion_tokens"
    reasoning_effort: str | None = None
    extra_body: Mapping[str, Any] | None = None

    def client(self) -> JudgeClient:
        """The shared OpenAI-compatible client of these settings (backend ``openai`` only)."""
        assert self.base_url is not None
        assert self.model is not None
        request: dict[str, Any] = {"token_limit_param": self.token_limit_param}
        for name in ("temperature", "max_tokens", "reasoning_effort"):
            if getattr(self, name) is not None:
                request[name] = getattr(self, name)
        if self.extra_body:
            request["extra_body"] = dict(self.extra_body)
        return judge_client(self.base_url, self.model, self.api_key_env, self.timeout_s, self.max_retries, **request)


def judge_settings(config: Any = None, extra_body_json: str | None = None, **given: Any) -> JudgeSettings:
    """``queryrl eval``'s judge: the options `given` (None = not given) over `config` (the
    ``app.query_rewrite.judge`` node of ``--config``, or None) over the defaults. `extra_body_json` is
    ``--judge-extra-body``: a JSON object (it replaces the config's ``extra_body``).

    Raises:
        EvalError: `extra_body_json` is not a JSON object.
    """
    from omegaconf import OmegaConf

    fields = set(JudgeSettings.__dataclass_fields__)
    base: dict[str, Any] = {}
    if config is not None:
        node = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else dict(config)
        assert isinstance(node, dict)
        base = {k: v for k, v in node.items() if k in fields}
    if extra_body_json is not None:
        try:
            extra = json.loads(extra_body_json)
        except json.JSONDecodeError as exc:
            raise EvalError(f"--judge-extra-body: not valid JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(extra, dict):
            raise EvalError(
                f'--judge-extra-body: expected a JSON object like \'{{"verbosity": "low"}}\', got {extra!r}'
            )
        given["extra_body"] = extra
    unknown = sorted(set(given) - fields)
    if unknown:
        raise TypeError(f"unknown judge setting(s) {unknown}")
    if given.get("api_key_env") == "":  # --judge-api-key-env '': a server that needs no key
        given["api_key_env"] = base["api_key_env"] = None
    merged = base | {k: v for k, v in given.items() if v is not None}
    merged.setdefault("backend", "none")
    return JudgeSettings(**merged)


@dataclass
class JudgeOutcome:
    """One system's judging: verdicts with the candidate as "8b" (a format failure is :data:`LOSS`), the
    position-inconsistent count, and the judge calls that failed (no verdict from the service)."""

    verdicts: list[dict[str, Any] | None]
    inconsistent: int = 0
    calls: int = 0  # judge requests sent (format failures send none; position swap sends two)
    failed: int = 0  # of them, those whose call failed or whose reply was no valid verdict
    first_error: str | None = None


async def _judge_all(
    settings: JudgeSettings,
    samples: Sequence[Sample],
    candidates: Sequence[dict[str, Any] | None],
    references: Sequence[dict[str, Any]],
    top_k: int,
) -> JudgeOutcome:
    """Judge every candidate against its reference (see :class:`JudgeOutcome`)."""
    if settings.backend == "offline":
        offline = OfflineJudge(top_k=top_k)
        verdicts = [
            LOSS if cand is None else offline.judge(s.contexts, cand, ref, s.gold, no_retrieval_turn(s.gold, s.kind))
            for s, cand, ref in zip(samples, candidates, references, strict=True)
        ]
        return JudgeOutcome(verdicts)
    from queryrl.rewards.judge import JudgeConfigError

    client = settings.client()
    outcome = JudgeOutcome([])

    async def ask(messages: list[dict[str, str]]) -> dict[str, Any] | None:
        outcome.calls += 1
        result = await client.judge(messages, schema=RUBRIC_VERDICT_SCHEMA)
        if result.verdict is None:
            outcome.failed += 1
            outcome.first_error = outcome.first_error or result.error
        return result.verdict

    async def one(s: Sample, cand: dict[str, Any] | None, ref: dict[str, Any]) -> dict[str, Any] | None:
        if cand is None:
            return LOSS
        ab = build_judge_messages(s.contexts, cand, ref, lang=settings.lang)
        if not settings.position_swap:
            return await ask(ab)
        ba = build_judge_messages(s.contexts, ref, cand, lang=settings.lang)
        v_ab, v_ba = await asyncio.gather(ask(ab), ask(ba))
        if v_ab is None or v_ba is None:
            return None
        _, consistent = combine_swapped(v_ab, v_ba)
        if not consistent:
            outcome.inconsistent += 1
            return None
        return v_ab

    try:
        jobs = (one(*x) for x in zip(samples, candidates, references, strict=True))
        outcome.verdicts = list(await asyncio.gather(*jobs))
    except JudgeConfigError as exc:
        raise EvalError(f"judge: {exc}") from None
    finally:
        await client.aclose()
    return outcome


# --- metrics ------------------------------------------------------------------------------------


def _metric_values(ranked: Sequence[str], gold: Sequence[str], ks: Sequence[int]) -> dict[str, float]:
    values = {f"recall@{k}": recall_at_k(ranked, gold, k) for k in ks}
    values["mrr"] = mrr(ranked, gold)
    values.update({f"ndcg@{k}": ndcg_at_k(ranked, gold, k) for k in ks})
    return values


def _with_ci(
    per_sample: Sequence[Mapping[str, float]], keys: Sequence[str], n_boot: int, seed: int
) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in keys:
        mean, low, high = bootstrap_ci([v[key] for v in per_sample], n_boot, seed=seed)
        out[key], out[f"{key}_low"], out[f"{key}_high"] = mean, low, high
    return out


def system_metrics(
    ranked: Sequence[Sequence[str]],
    samples: Sequence[Sample],
    format_ok: Sequence[bool],
    dependent: Sequence[bool],
    ks: Sequence[int],
    n_boot: int,
    seed: int,
    abstained: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """One system's retrieval metrics with bootstrap intervals, ``format_ok``, ``by_kind`` and ``context_dependent``.

    Retrieval metrics cover the turns with gold only. `abstained` (per sample: the system gave an empty
    query; default none did) gives ``abstain_accuracy`` on the turns that need no retrieval and
    ``false_abstain`` on the turns with gold (:func:`~queryrl.apps.query_rewrite.evaluation.abstain_metrics`);
    in ``by_kind`` a no-retrieval kind shows its ``n`` and ``abstain_accuracy``.
    """
    scored = [
        (i, _metric_values(r, s.gold, ks)) for i, (r, s) in enumerate(zip(ranked, samples, strict=True)) if s.gold
    ]
    quiet = [no_retrieval_turn(s.gold, s.kind) for s in samples]
    empty = list(abstained) if abstained is not None else [False] * len(samples)
    out: dict[str, Any] = {
        "n": len(scored),
        "n_skipped": len(samples) - len(scored),
        "format_ok": float(np.mean(format_ok)),
        **abstain_metrics(empty, quiet, [bool(s.gold) for s in samples]),
    }
    quiet_kinds = sorted({s.kind for s, q in zip(samples, quiet, strict=True) if q})
    by_kind: dict[str, Any] = {}
    for kind in quiet_kinds:
        flags = [e for s, q, e in zip(samples, quiet, empty, strict=True) if q and s.kind == kind]
        by_kind[kind] = {"n": len(flags), "abstain_accuracy": float(np.mean(flags))}
    if by_kind:
        out["by_kind"] = by_kind
    if not scored:
        return out
    keys = list(scored[0][1])
    out.update(_with_ci([v for _, v in scored], keys, n_boot, seed))
    headline = (f"recall@{HEADLINE_K}", "mrr")

    def subset(members: list[dict[str, float]]) -> dict[str, float]:
        return {"n": len(members), **_with_ci(members, headline, n_boot, seed)} if members else {"n": 0}

    kinds = sorted({samples[i].kind for i, _ in scored if samples[i].kind})
    if kinds:
        by_kind.update({k: subset([v for i, v in scored if samples[i].kind == k]) for k in kinds})
        out["by_kind"] = dict(sorted(by_kind.items()))
    out["context_dependent"] = subset([v for i, v in scored if dependent[i]])
    return out


# --- outputs ------------------------------------------------------------------------------------


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


TABLE_KEYS = (
    "n",
    "format_ok",
    "recall@1",
    "recall@3",
    "recall@5",
    "recall@5_low",
    "recall@5_high",
    "recall@10",
    "mrr",
    "ndcg@5",
    "ndcg@10",
    "ctx_dep recall@5",
    "win",
    "tie",
    "loss",
    "win_rate",
    "judge_score",
    "abstain_accuracy",
    "false_abstain",
)


def table_rows(systems: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """The flat rows of the printed table (a subset of the metrics, see :data:`TABLE_KEYS`)."""
    rows: dict[str, dict[str, float]] = {}
    for name, metrics in systems.items():
        dependent = metrics.get("context_dependent") or {}
        flat = {**metrics, "ctx_dep recall@5": dependent.get(f"recall@{HEADLINE_K}")}
        rows[name] = {k: float(flat[k]) for k in TABLE_KEYS if isinstance(flat.get(k), int | float)}
    return rows


def plot_systems(
    systems: Mapping[str, Mapping[str, Any]], out: Path, comparisons: Mapping[str, Mapping[str, Any]] | None = None
) -> Path:
    """A bar chart of recall@5 and MRR per system with their 95 % intervals, written to `out` (PNG); with
    `comparisons`, a third panel of the paired differences (:func:`~.eval_compare.draw_differences`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(systems)
    width = max(6.0, 1.6 * len(names) + 2.0)
    fig, axes = plt.subplots(1, 3 if comparisons else 2, figsize=(width + 5.0 if comparisons else width, 4.0))
    if comparisons:
        draw_differences(axes[2], comparisons, HEADLINE_K)
    for ax, key, title in zip(axes[:2], (f"recall@{HEADLINE_K}", "mrr"), (f"Recall@{HEADLINE_K}", "MRR"), strict=True):
        means = [float(systems[n].get(key, 0.0)) for n in names]
        lows = [m - float(systems[n].get(f"{key}_low", m)) for n, m in zip(names, means, strict=True)]
        highs = [float(systems[n].get(f"{key}_high", m)) - m for n, m in zip(names, means, strict=True)]
        x = np.arange(len(names))
        ax.bar(x, means, yerr=[lows, highs], capsize=4, color="tab:blue")
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=20, ha="right")
        ax.set_ylim(0.0, 1.05)
        ax.set_title(f"{title} (95% bootstrap CI)")
        for xi, m in zip(x, means, strict=True):
            ax.text(xi, m / 2, f"{m:.3f}", ha="center", va="center", color="white", fontsize=9)
    fig.tight_layout()
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)
    return out


# --- the evaluation -----------------------------------------------------------------------------


def evaluate(
    data: str,
    systems: str | Sequence[str],
    out: str | Path,
    *,
    rag_url: str | None = None,
    corpus: str = "sales_demo",
    top_k: int = 5,
    rag_timeout_s: float = 10.0,
    rag_max_retries: int = 2,
    rag_token_env: str | None = None,
    judge: JudgeSettings | None = None,
    batch_size: int = 16,
    max_new_tokens: int = 64,
    n_boot: int = 1000,
    seed: int = 0,
    max_samples: int | None = None,
    cache_dir: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    echo: Callable[[str], None] | None = print,
    embedded: dict[str, Any] | None = None,
    warn: Callable[[str], None] | None = None,
    compare: str | Sequence[str] | None = None,
) -> dict[str, Any]:
    """Evaluate `systems` on `data` and write the outputs (see the module doc).

    Args:
        data: ``builtin://NAME/SPLIT``, a ``.parquet`` or a ``.jsonl`` file of query-rewrite rows.
        systems: ``--systems`` (a comma-separated string or a list; :func:`parse_systems`).
        out: the JSON summary's path; ``eval.png`` and ``eval_samples.jsonl`` go next to it.
        rag_url: an external RAG service; None: the embedded one over `corpus`.
        corpus: the embedded service's corpus (``"sales_demo"`` or a corpus file).
        top_k: documents per result of the embedded service, and the offline judge's cutoff (>= 5).
        rag_timeout_s, rag_max_retries: the RAG client's.
        rag_token_env: an env var holding the RAG service's bearer token (None: none sent).
        judge: the judge (default: none).
        batch_size: generation micro-batch of a model system.
        max_new_tokens: a model's reply budget.
        n_boot, seed: the bootstrap.
        max_samples: only the first rows (None / 0: all).
        cache_dir: where ``builtin://`` data is generated.
        device: where a model generates (default: cuda when available).
        dtype: float32, bfloat16 or float16: every model system's weights and compute (default: each
            model folder's ``torch_dtype``, float32 when it names none).
        echo: where progress and the table go (None: silent).
        embedded: the embedded service's options (retriever, embedder, reference rewriter: see
            :func:`~queryrl.apps.query_rewrite.reward.embedded_rag`).
        warn: where a warning goes (failed judge calls; default: stderr).
        compare: ``--compare``: ``A:B`` pairs of system names, comma-separated or a list
            (:func:`~queryrl.apps.query_rewrite.eval_compare.parse_compare`).

    Returns:
        The JSON summary written to `out`.

    Raises:
        EvalError: see the module doc.
    """
    judge = judge or JudgeSettings()
    if judge.backend not in JUDGES:
        raise EvalError(f"unknown judge {judge.backend!r}; use one of {', '.join(JUDGES)}")
    if judge.backend == "openai" and (not judge.base_url or not judge.model):
        raise EvalError("--judge openai needs --judge-base-url and --judge-model")
    try:
        judge_check = judge.client() if judge.backend == "openai" else None
    except ValueError as exc:  # a judge setting out of range (temperature, reasoning effort, ...)
        raise EvalError(str(exc)) from None
    if top_k < HEADLINE_K:
        raise EvalError(f"--top-k must be at least {HEADLINE_K} (recall@{HEADLINE_K} is the headline metric)")
    if batch_size < 1 or max_new_tokens < 1 or n_boot < 1:
        raise EvalError("--batch-size, --max-new-tokens and --bootstrap must be >= 1")
    if dtype is not None and dtype not in EVAL_DTYPES:
        raise EvalError(f"--dtype {dtype!r} is not one of: {', '.join(EVAL_DTYPES)}")
    say = echo or (lambda _: None)
    specs = parse_systems(systems)
    try:  # a misspelt pair fails here, before any data, service or model is touched
        pairs = parse_compare(compare, [s.name for s in specs])
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    samples = load_samples(data, max_samples, cache_dir)
    out = Path(out)
    ks = [k for k in DEFAULT_KS if k <= top_k]
    say(f"{len(samples)} samples from {data}; systems: {', '.join(s.name for s in specs)}")
    try:  # the judge and the RAG service answer, before any model is loaded
        check_services(judge_check, rag_url, rag_timeout_s, say)
    except ServiceCheckFailed as exc:
        raise EvalError(str(exc)) from None

    try:
        client = rag_client(rag_url, corpus, top_k, rag_timeout_s, rag_max_retries, rag_token_env, **(embedded or {}))
    except (OSError, ValueError) as exc:
        raise EvalError(f"corpus {corpus!r}: {exc}") from None
    # probe the service before any generation, so that a service that is down costs no model time
    asyncio.run(_retrieve(client, samples[:1], {}, rag_url))

    answers: dict[str, list[Answer] | None] = {}
    for spec in specs:
        if spec.kind == "reference":
            answers[spec.name] = None
        elif spec.kind == "model":
            assert spec.path is not None
            say(f"{spec.name}: generating with {spec.path} ({model_dtype(spec.path, dtype)}) ...")
            answers[spec.name] = model_answers(spec.path, samples, batch_size, max_new_tokens, device, dtype)
        else:
            answers[spec.name] = baseline_answers(spec.kind, samples)

    references, candidates = asyncio.run(_retrieve(client, samples, answers, rag_url))
    results: dict[str, list[dict[str, Any] | None]] = {
        spec.name: list(references) if spec.kind == "reference" else candidates[spec.name] for spec in specs
    }
    verdicts: dict[str, list[dict[str, Any] | None]] = {}
    outcomes: dict[str, JudgeOutcome] = {}
    if judge.backend != "none":
        for spec in specs:
            if spec.kind != "reference":
                say(f"{spec.name}: judging against the reference ({judge.backend}) ...")
                outcomes[spec.name] = asyncio.run(_judge_all(judge, samples, results[spec.name], references, top_k))
                verdicts[spec.name] = outcomes[spec.name].verdicts

    dependent, dependent_rule = context_dependent(samples)
    judge_calls = judge_call_summary(outcomes)
    summary: dict[str, dict[str, Any]] = {}
    for spec in specs:
        system_answers = answers[spec.name]
        ok = [True] * len(samples) if system_answers is None else [a.query is not None for a in system_answers]
        ranked = [doc_ids(r) for r in results[spec.name]]
        queries = (
            [str((r or {}).get("rewritten_query") or "") for r in results[spec.name]]
            if system_answers is None
            else [a.query if a.query is not None else "-" for a in system_answers]  # unparsed: not an abstention
        )
        abstained = [not q.strip() for q in queries]
        metrics = system_metrics(ranked, samples, ok, dependent, ks, n_boot, seed, abstained)
        if spec.name in verdicts:
            wtl = win_tie_loss(verdicts[spec.name], n_boot, seed=seed)
            renamed = {"n": "judge_n", "failed": "judge_failed", "score": "judge_score"}
            for key, value in wtl.items():
                base, _, suffix = key.partition("_")
                if key in renamed:
                    metrics[renamed[key]] = value
                elif base == "score":
                    metrics[f"judge_score_{suffix}"] = value
                else:
                    metrics[key] = value
            if judge.position_swap:
                metrics["judge_position_inconsistent"] = outcomes[spec.name].inconsistent
            metrics["judge_calls"] = outcomes[spec.name].calls
            metrics["judge_call_failed"] = outcomes[spec.name].failed
        summary[spec.name] = metrics
    golds = [s.gold for s in samples]
    values = {s.name: per_sample_values([doc_ids(r) for r in results[s.name]], golds, HEADLINE_K) for s in specs}
    comparisons = compare_systems(pairs, values, verdicts, n_boot, seed)

    report = {
        "systems": summary,
        "comparisons": comparisons,
        "eval_file": data,
        "n_samples": len(samples),
        "judge_calls": judge_calls,
        "settings": {
            "systems": [{"name": s.name, "kind": s.kind, "path": str(s.path) if s.path else None} for s in specs],
            "rag_url": rag_url,
            "corpus": corpus if rag_url is None else None,
            "top_k": top_k,
            "ks": ks,
            "judge": judge.backend,
            "judge_model": judge.model if judge.backend == "openai" else None,
            "judge_base_url": judge.base_url if judge.backend == "openai" else None,
            "position_swap": judge.position_swap if judge.backend == "openai" else False,
            **(_judge_request_settings(judge) if judge.backend == "openai" else {}),
            "batch_size": batch_size,
            "max_new_tokens": max_new_tokens,
            "decoding": "greedy",
            "bootstrap": n_boot,
            "compare": [f"{a}:{b}" for a, b in pairs],
            "ci": 0.95,
            "seed": seed,
            "max_samples": max_samples,
            "context_dependent": dependent_rule,
        },
    }
    atomic_write_text(out, json.dumps(_json_safe(report), ensure_ascii=False, indent=2) + "\n")
    lines = []
    for i, s in enumerate(samples):
        per_system: dict[str, Any] = {}
        for spec in specs:
            result = results[spec.name][i]
            system_answers = answers[spec.name]
            answer = system_answers[i] if system_answers is not None else None
            entry: dict[str, Any] = {
                "query": (result or {}).get("rewritten_query") if answer is None else answer.query,
                "format_ok": answer is None or answer.query is not None,
                "top5": doc_ids(result)[:SAMPLES_TOP],
                **(values[spec.name][i] or {}),  # recall@5, mrr, ndcg@5 on a turn with gold: --compare's inputs
            }
            if answer is not None and answer.raw is not None:
                entry["raw"] = answer.raw
            if spec.name in verdicts:
                verdict = verdicts[spec.name][i]
                entry["verdict"] = verdict.get("better") if verdict else None
            per_system[spec.name] = entry
        record = {
            "index": s.index,
            "conversation_id": s.conversation_id,
            "turn": s.turn,
            "kind": s.kind,
            "last_turn": s.contexts[-1]["content"],
            "gold": s.gold,
            "systems": per_system,
        }
        lines.append(json.dumps(_json_safe(record), ensure_ascii=False, default=str) + "\n")
    atomic_write_text(out.parent / "eval_samples.jsonl", "".join(lines))
    plot_systems(summary, out.parent / "eval.png", comparisons)
    say(format_table(table_rows(summary)))
    if comparisons:
        say(format_comparisons(comparisons, HEADLINE_K))
    say(f"wrote {out}, {out.parent / 'eval.png'} and {out.parent / 'eval_samples.jsonl'}")
    complain_about_judge(judge_calls, out, warn or _stderr)
    return report


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _judge_request_settings(judge: JudgeSettings) -> dict[str, Any]:
    """The judge's request settings for the report (``extra_body`` by its keys only: values may be private)."""
    return {
        "judge_temperature": judge.temperature,
        "judge_max_tokens": judge.max_tokens,
        "judge_token_limit_param": judge.token_limit_param,
        "judge_reasoning_effort": judge.reasoning_effort,
        "judge_extra_body_keys": sorted(judge.extra_body or {}),
    }


def judge_call_summary(outcomes: Mapping[str, JudgeOutcome]) -> dict[str, Any]:
    """``{"sent", "failed", "first_error"}`` over every system's judge calls (the report's ``judge_calls``)."""
    errors = [o.first_error for o in outcomes.values() if o.first_error]
    return {
        "sent": sum(o.calls for o in outcomes.values()),
        "failed": sum(o.failed for o in outcomes.values()),
        "first_error": errors[0] if errors else None,
    }


def complain_about_judge(calls: Mapping[str, Any], out: Path, warn: Callable[[str], None]) -> None:
    """Failed judge calls must not read as a result: some failed -> a warning with the count and the first
    error; every one failed -> :class:`EvalError` (the CLI exits 2; the outputs are written already)."""
    sent, failed = int(calls["sent"]), int(calls["failed"])
    if not failed:
        return
    if failed == sent:
        raise EvalError(
            f"every judge call failed ({failed} of {sent}): the win/tie/loss columns in {out} are empty, not "
            f"a result; first error: {calls['first_error']}"
        )
    warn(
        f"warning: {failed} of {sent} judge calls failed (judge_call_failed per system in {out}); "
        f"first error: {calls['first_error']}"
    )
