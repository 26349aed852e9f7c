"""Self-driven warm-up data for the rewriter (``queryrl warmup``): the model's own rewrites, kept where
retrieval ranks a gold document highest.

The idea is ConvSearch-R1's first stage, "self-driven policy warm-up" (Zhu et al. 2025,
arXiv:2505.15776): a model that does not yet answer in the task's format gets no learning signal from
RL (every group of a GRPO step scores the same), and SFT on another model's rewrites teaches it text it
would not write itself. Instead, the model writes the data: prompted with a few worked examples, it
samples `samples` rewrites per training turn; each is retrieved with, and the one whose result ranks a
gold document highest (:func:`~queryrl.apps.query_rewrite.reward.modes.retrieval_rank_reward`) becomes
that turn's SFT target, in the format the row's prompt asks for (JSON or text). SFT on that data (LoRA
or full) then starts RL from a policy that writes the format and retrieves.

Differences from the paper, on purpose:

- the reference rewriter's answer (the row's ``extra_info.sft_target``) is one more candidate (``reference``
  in the report), so a turn the model gets wrong in every sample still has a target when the reference
  retrieves the gold; ties go to the reference (it keeps the customer's words by construction). Without
  it (``reference=False``) the data is the model's alone, as in the paper;
- ``samples=0`` samples nothing: the data is the reference's answers that retrieve a gold document
  (reference SFT filtered by retrieval), the cheap variant when the model's own samples never win;
- a turn whose best candidate retrieves no gold document within the result list is dropped (the paper
  keeps the rewrites that rank the gold passage; here the list is the RAG service's top_k);
- turns that need no retrieval (no gold, a no-retrieval kind) keep their own target (the abstention);
- a candidate that changes the customer's intent (:func:`~queryrl.apps.query_rewrite.intent.check.check_intent`:
  answers the question, invents facts, swaps the question type, garbled text) is never a target, however
  well it retrieves.

A model trained with a restricted head (``model.vocab.restrict``; its ``vocab_ids.json``) samples with that head
(``vocab_ids``), as its GRPO rollouts and its evals decode: its policy, not the full head's. That is how a second
warm-up round samples the warmed model (expert iteration: ``benchmarks/real_model.py --warmup-rounds 2``).

The worked examples are `shots` other training turns with gold and history (turns whose reference
answer retrieves a gold document at rank 1), in the row's own format: for a chat model as earlier
user/assistant turns, for a base model as text before the row's prompt (:func:`few_shot_messages`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.data.sft_targets import SFT_SOURCE_KEY, SFT_TARGET_KEY, render_answer
from queryrl.apps.query_rewrite.eval.samples import Answer, sample_of
from queryrl.apps.query_rewrite.eval.scoring import doc_ids, retrieve
from queryrl.apps.query_rewrite.intent.check import check_intent
from queryrl.apps.query_rewrite.metrics import no_retrieval_turn
from queryrl.apps.query_rewrite.reward.intent import intent_sources
from queryrl.apps.query_rewrite.reward.modes import parse_answer, retrieval_rank_reward
from queryrl.rag import RAGClient

WARMUP_KEY = "warmup"  # in extra_info: where the kept target came from


@dataclass(frozen=True)
class WarmupSettings:
    """How the warm-up data is sampled (the ``queryrl warmup`` options)."""

    samples: int = 4  # rewrites per turn from the model
    shots: int = 3  # worked examples in each prompt
    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 48
    batch_size: int = 8
    dtype: str | None = None
    device: str | None = None
    seed: int = 0
    reference: bool = True  # the reference rewriter's answer is a candidate too
    vocab_ids: str | None = None  # a vocab_ids.json: the model decodes with its head restricted to those ids

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"warmup: {name} must be >= 1 (got {getattr(self, name)})")
        if self.samples < 0:
            raise ValueError(f"warmup: samples must be >= 0 (got {self.samples})")
        if self.samples == 0 and not self.reference:
            raise ValueError("warmup: samples 0 without the reference leaves no candidate; sample >= 1 or keep it")
        if self.shots < 0:
            raise ValueError(f"warmup: shots must be >= 0 (got {self.shots})")


@dataclass
class Candidate:
    """One candidate target of a turn: where it came from, its query (None: the reply did not parse) and
    the rank reward of its retrieval result (None: not retrieved)."""

    source: str  # "model" or "reference"
    query: str | None
    reward: float | None = None


@dataclass
class WarmupData:
    """The kept rows (their ``extra_info.sft_target`` replaced) and what happened (:meth:`report`)."""

    rows: list[dict[str, Any]]
    considered: int
    no_retrieval: int
    dropped: int
    sources: Counter[str] = field(default_factory=Counter)
    parsed: int = 0  # model samples that parsed
    clean: int = 0  # ... and had nothing after their answer (text format)
    sampled: int = 0
    found_by_model: int = 0  # retrieval turns where some model sample found a gold document
    best_rewards: list[float] = field(default_factory=list)
    intent_changed: Counter[str] = field(default_factory=Counter)  # candidates refused: they change the intent
    seconds: dict[str, float] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        kept_retrieval = len(self.best_rewards)
        return {
            "turns": self.considered,
            "kept": len(self.rows),
            "kept_retrieval_turns": kept_retrieval,
            "kept_no_retrieval_turns": self.no_retrieval,
            "dropped_no_gold_found": self.dropped,
            "target_source": dict(sorted(self.sources.items())),
            "model_samples": self.sampled,
            "model_format_ok": round(self.parsed / self.sampled, 4) if self.sampled else None,
            "model_clean_format": round(self.clean / self.sampled, 4) if self.sampled else None,
            "turns_a_model_sample_found_gold": self.found_by_model,
            "candidates_refused_intent_changed": dict(sorted(self.intent_changed.items())),
            "mean_best_rank_reward": round(sum(self.best_rewards) / kept_retrieval, 4) if kept_retrieval else None,
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
        }


def few_shot_messages(prompt: Sequence[dict[str, Any]], examples: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """`prompt` (system message, then the user message) with `examples` (a user message and its answer
    each) as earlier turns between them: a chat model sees solved turns; a base model without a chat
    template sees them as text before the question (:func:`~queryrl.data.prompts.prompt_text`)."""
    messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    head = messages[:-1]
    shots: list[dict[str, str]] = []
    for user, answer in examples:
        shots += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return [*head, *shots, messages[-1]]


def pick_examples(
    rows: Sequence[dict[str, Any]], good: Sequence[bool], shots: int, seed: int
) -> list[tuple[int, tuple[str, str]]]:
    """`shots` demonstration turns (index, (user message, answer)): turns with gold and history whose
    reference answer was `good` (found a gold document at rank 1), the shorter half of them, drawn with
    `seed`."""
    pool = [
        i
        for i, row in enumerate(rows)
        if good[i]
        and len((row.get("extra_info") or {}).get("contexts") or []) > 1
        and row["extra_info"].get(SFT_TARGET_KEY)
    ]
    pool.sort(key=lambda i: len(str(rows[i]["prompt"][-1]["content"])))
    pool = pool[: max(shots, len(pool) // 2)]
    chosen = sorted(random.Random(seed).sample(pool, min(shots, len(pool))))
    return [(i, (str(rows[i]["prompt"][-1]["content"]), str(rows[i]["extra_info"][SFT_TARGET_KEY]))) for i in chosen]


def build_warmup(
    model: Path,
    rows: Sequence[dict[str, Any]],
    client: RAGClient,
    settings: WarmupSettings,
    rag_url: str | None = None,
    say: Callable[[str], None] = print,
) -> WarmupData:
    """The warm-up data of `rows` (a prepared training split, with ``extra_info.sft_target``) from the model
    folder `model`, retrieving through `client` (see the module doc)."""
    rows = [dict(r) for r in rows]
    for r in rows:
        r["extra_info"] = dict(r.get("extra_info") or {})
    samples = [sample_of(r, i) for i, r in enumerate(rows)]
    retrieval = [i for i, s in enumerate(samples) if s.gold]
    abstain = {i for i, s in enumerate(samples) if not s.gold and no_retrieval_turn(s.gold, s.kind)}
    clock = time.perf_counter()
    # the reference answers first: which turns make good examples, and the reference candidates
    references, ref_reward = _reference_rewards(rows, samples, retrieval, client, rag_url)
    good = [ref_reward.get(i) == 2.0 for i in range(len(rows))]
    examples = pick_examples(rows, good, settings.shots, settings.seed) if settings.samples else []
    shown = [i for i, _ in examples]
    say(f"[warmup] {len(retrieval)} retrieval turns, {len(abstain)} no-retrieval turns; example rows {shown}")
    taken = {i for i, _ in examples}
    todo = [i for i in retrieval if i not in taken]
    data = WarmupData(rows=[], considered=len(rows), no_retrieval=len(abstain), dropped=0)
    candidates = _model_candidates(model, rows, samples, todo, examples, settings, client, rag_url, data, say)
    for i, row in enumerate(rows):
        if i in abstain:
            data.rows.append({**row, "extra_info": {**row["extra_info"], WARMUP_KEY: {"source": "no_retrieval"}}})
        elif i in candidates:  # not an example turn, and labelled
            pool = list(candidates[i])
            data.found_by_model += any((c.reward or 0.0) > 0 for c in pool)
            ref = references[i]
            if settings.reference and ref is not None:
                pool.insert(0, Candidate("reference", ref.rewritten_query, ref_reward.get(i)))
            _keep_best(row, samples[i], pool, data)
    data.seconds["total"] = time.perf_counter() - clock
    return data


def _reference_rewards(
    rows: list[dict[str, Any]], samples: list[Any], retrieval: list[int], client: RAGClient, rag_url: str | None
) -> tuple[list[Any], dict[int, float | None]]:
    """Each row's parsed reference answer (its SFT target), and the rank reward of the retrieval rows' ones."""
    references = [
        parse_answer(r["extra_info"].get(SFT_TARGET_KEY), answer_format=s.answer_format)
        for r, s in zip(rows, samples, strict=True)
    ]
    ref_answers = [
        Answer(p.rewritten_query if p else None, s.user_profile, s.history_summary)
        for p, s in zip(references, samples, strict=True)
    ]
    chosen = [samples[i] for i in retrieval]
    reference_answers: dict[str, list[Answer] | None] = {"reference": [ref_answers[i] for i in retrieval]}
    _, ref_results = (
        asyncio.run(retrieve(client, chosen, reference_answers, rag_url)) if chosen else (None, {"reference": []})
    )
    ref_reward = {
        i: retrieval_rank_reward(doc_ids(res), samples[i].gold)
        for i, res in zip(retrieval, ref_results["reference"], strict=True)
    }
    return references, ref_reward


def _model_candidates(
    model: Path,
    rows: list[dict[str, Any]],
    samples: list[Any],
    todo: list[int],
    examples: list[Any],
    settings: WarmupSettings,
    client: RAGClient,
    rag_url: str | None,
    data: WarmupData,
    say: Callable[[str], None],
) -> dict[int, list[Candidate]]:
    """The model's `settings.samples` rewrites of each row of `todo` (few-shot on `examples`), each retrieved
    with and given its rank reward; counts what parsed in `data`."""
    import torch

    from queryrl.apps.query_rewrite.eval.generation import generate_replies
    from queryrl.rollout.base import SamplingParams

    prompts = [few_shot_messages(rows[i]["prompt"], [e for _, e in examples]) for i in todo]
    torch.manual_seed(settings.seed)
    start = time.perf_counter()
    replies = []
    if todo and settings.samples:  # samples 0: the reference's answers only, the model is never loaded
        params = SamplingParams(
            temperature=settings.temperature,
            top_p=settings.top_p,
            n=settings.samples,
            max_new_tokens=settings.max_new_tokens,
        )
        kept = None
        if settings.vocab_ids is not None:  # a model trained with a restricted head samples with it (its policy)
            from queryrl.apps.query_rewrite.eval.generation import read_vocab

            kept = read_vocab(Path(settings.vocab_ids))
        replies = generate_replies(
            model, prompts, params, settings.batch_size, settings.device, settings.dtype, vocab=kept
        )
    data.seconds["generate"] = time.perf_counter() - start
    say(f"[warmup] sampled {settings.samples} x {len(todo)} rewrites in {data.seconds['generate']:.0f} s")
    candidates: dict[int, list[Candidate]] = {i: [] for i in todo}
    systems: dict[str, list[Answer] | None] = {}
    for k in range(settings.samples):
        answers = []
        for n, i in enumerate(todo):
            parsed = parse_answer(replies[n][k], answer_format=samples[i].answer_format)
            data.sampled += 1
            data.parsed += parsed is not None
            data.clean += parsed is not None and not parsed.trailing
            query = parsed.rewritten_query if parsed is not None and parsed.rewritten_query.strip() else None
            candidates.setdefault(i, []).append(Candidate("model", query))
            answers.append(Answer(query, samples[i].user_profile, samples[i].history_summary))
        systems[f"sample_{k}"] = answers
    start = time.perf_counter()
    _, results = (
        asyncio.run(retrieve(client, [samples[i] for i in todo], systems, rag_url)) if todo and systems else (None, {})
    )
    data.seconds["retrieve"] = time.perf_counter() - start
    for k in range(settings.samples):
        for n, i in enumerate(todo):
            result = results[f"sample_{k}"][n]
            if result is not None:
                candidates[i][k].reward = retrieval_rank_reward(doc_ids(result), samples[i].gold)
    return candidates


def _keep_best(row: dict[str, Any], sample: Any, pool: list[Candidate], data: WarmupData) -> None:
    """Append `row` with the best candidate of `pool` as its SFT target to `data` (the first of ties: the
    reference), or count it dropped when none retrieves gold; a candidate that changes the question is out."""
    for c in pool:  # a rewrite that changes the question (answers it, invents facts) is no target
        if c.query is not None and not check_intent(sample.contexts, c.query, intent_sources(row["extra_info"])).kept:
            c.reward = None
            data.intent_changed[c.source] += 1
    best = max(pool, key=lambda c: c.reward if c.reward is not None else -1.0)  # first of ties: reference
    if best.query is None or not (best.reward or 0.0) > 0:
        data.dropped += 1
        return
    target = render_answer(
        {"rewritten_query": best.query, "user_profile": sample.user_profile, "history_summary": sample.history_summary},
        row["extra_info"],
    )
    own = str(row["extra_info"].get(SFT_SOURCE_KEY) or "the row's reference target")
    info = {
        **row["extra_info"],
        SFT_TARGET_KEY: target,
        SFT_SOURCE_KEY: f"warmup: {own}" if best.source == "reference" else "warmup: the model's own rewrite",
        WARMUP_KEY: {"source": best.source, "rank_reward": best.reward},
    }
    data.rows.append({**row, "extra_info": info})
    data.sources[best.source] += 1
    data.best_rewards.append(float(best.reward or 0.0))


def write_warmup(data: WarmupData, out: Path, settings: WarmupSettings, source: str) -> tuple[Path, Path]:
    """``out/warmup.parquet`` (the kept rows, the SFT data) and ``out/warmup.json`` (the report, the
    settings, the source data), each written atomically."""
    import json
    from dataclasses import asdict

    from queryrl.apps.query_rewrite.data.conversations import write_parquet
    from queryrl.atomic import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    parquet = write_parquet(data.rows, out / "warmup.parquet")
    report = {"data": source, "settings": asdict(settings), **data.report()}
    summary = out / "warmup.json"
    atomic_write_text(summary, json.dumps(report, ensure_ascii=False, indent=1) + "\n")
    return parquet, summary
