"""``queryrl eval``'s inputs: the systems to compare, the rows to evaluate, and the baselines' queries.

Systems (:func:`parse_systems`):

- ``raw_turn``: the last user turn as typed (:func:`~queryrl.apps.query_rewrite.metrics.raw_last_turn`);
- ``concat_last3``: the last three user turns joined (:func:`~queryrl.apps.query_rewrite.metrics.last_k_turns`);
- ``reference``: the reference pipeline ``/rag/chat`` (the service's own rewriter);
- ``NAME=PATH`` or a bare ``PATH``: a Hugging Face model folder (NAME defaults to the folder's name); its
  answers come from :mod:`~queryrl.apps.query_rewrite.eval.generation`;
- ``NAME=BASE+ADAPTER`` (``+ADAPTER2`` ...): the model folder BASE with LoRA adapter folders merged into it in
  order (:func:`~queryrl.models.adapters.load_with_adapters`): a GRPO adapter trained on a merged warm-up is
  ``BASE+WARMUP_ADAPTER+GRPO_ADAPTER``.

Rows (:func:`load_samples`): ``builtin://NAME/SPLIT``, ``.parquet`` or ``.jsonl`` query-rewrite rows, each
with ``extra_info.contexts`` ending with the current user turn and its gold document ids in
``reward_model.ground_truth``; or a KdConv dialogue file (``.json``), prepared on the fly
(:mod:`~queryrl.apps.query_rewrite.eval.kdconv_file`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.eval.checks import not_a_model_message
from queryrl.apps.query_rewrite.metrics import last_k_turns, raw_last_turn
from queryrl.apps.query_rewrite.reward.score import ID_FIELDS
from queryrl.models.adapters import adapter_problem

BASELINES = ("raw_turn", "concat_last3", "reference")


class EvalError(RuntimeError):
    """The evaluation cannot run as asked (unknown system, missing model, unreadable data, RAG down)."""


@dataclass(frozen=True)
class SystemSpec:
    """One system to evaluate: its name, its kind (a baseline's name, or ``"model"``), a model's folder and the
    LoRA adapter folders merged into it in order."""

    name: str
    kind: str
    path: Path | None = None
    adapters: tuple[Path, ...] = ()

    @property
    def source(self) -> str:
        """The model as ``--systems`` names it: ``PATH`` or ``BASE+ADAPTER+...``."""
        return "+".join(str(p) for p in (self.path, *self.adapters) if p is not None)


def parse_systems(spec: str | Sequence[str]) -> list[SystemSpec]:
    """The systems of ``--systems``: a comma-separated string or a list of entries.

    An entry is a baseline name (:data:`BASELINES`), ``NAME=PATH``, or a bare path (a string with a path
    separator, or an existing folder), whose name is the folder's. A model folder must hold ``config.json``.
    ``PATH`` may be ``BASE+ADAPTER+...`` (:func:`model_source`); a bare one is named after its last adapter.

    Raises:
        EvalError: no systems, an unknown name, a missing model folder, an adapter folder that is not one or
            does not fit its base, or a name used twice. A training checkpoint (``checkpoints/step_N``) is named
            as such, with the ``queryrl export`` command.
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
            name = Path(entry.split("+")[-1]).expanduser().resolve().name
        name, raw_path = name.strip(), raw_path.strip()
        if not name or not raw_path:
            raise EvalError(f"bad system {entry!r}: expected NAME=PATH with a name and a model folder")
        path, adapters = model_source(name, raw_path)
        out.append(SystemSpec(name, "model", path, adapters))
    names = [s.name for s in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise EvalError(f"system name(s) used twice: {', '.join(repeated)} (name model folders with NAME=PATH)")
    return out


def model_source(name: str, raw: str) -> tuple[Path, tuple[Path, ...]]:
    """The model folder and the adapter folders of system `name`'s ``PATH`` or ``BASE+ADAPTER+...`` (a folder
    whose own name holds ``+`` is taken as one path), each checked (:func:`adapter_problem`).

    Raises:
        EvalError: the base is not a model folder (a checkpoint gets the ``queryrl export`` command to run), an
            adapter is not an adapter folder or does not fit the base; one line naming the system.
    """
    whole = Path(raw).expanduser()
    parts = [raw] if "+" not in raw or (whole / "config.json").is_file() else raw.split("+")
    if any(not p.strip() for p in parts):
        raise EvalError(f"system {name!r}: bad model {raw!r}: expected BASE+ADAPTER[+ADAPTER...] with no empty part")
    path, adapters = Path(parts[0].strip()).expanduser(), tuple(Path(p.strip()).expanduser() for p in parts[1:])
    if not (path / "config.json").is_file():
        raise EvalError(not_a_model_message(name, path))
    for adapter in adapters:
        problem = adapter_problem(adapter, path)
        if problem is not None:
            raise EvalError(f"system {name!r}: {problem}")
    return path, adapters


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
    answer_format: str = "json"  # what the prompt asked for (extra_info.answer_format): how replies parse


def load_samples(
    data: str, max_samples: int | None = None, cache_dir: str | None = None, rows: list[dict[str, Any]] | None = None
) -> list[Sample]:
    """The rows of `data` (``builtin://NAME/SPLIT``, ``.parquet``, ``.jsonl``), the first `max_samples` of them;
    `rows`: the rows already made of `data` (a KdConv file's, :mod:`~.kdconv_file`), `data` only naming them.

    Raises:
        EvalError: unreadable data, or a row without ``extra_info.contexts`` ending with a user turn.
    """
    from queryrl.data.builtin import resolve_data_path
    from queryrl.data.records import DataError, load_records

    try:
        rows = rows if rows is not None else load_records(resolve_data_path(data, cache_dir))
    except (DataError, ValueError) as exc:
        raise EvalError(f"data {data!r}: {exc}") from None
    if max_samples is not None and max_samples > 0:
        rows = rows[:max_samples]
    if not rows:
        raise EvalError(f"data {data!r}: no rows")
    samples = []
    for i, row in enumerate(rows):
        try:
            samples.append(sample_of(row, i))
        except ValueError as exc:
            raise EvalError(f"data {data!r}: row {i}: {exc}") from None
    return samples


def sample_of(row: Mapping[str, Any], index: int) -> Sample:
    """One verl row as a :class:`Sample` (its position `index`).

    Raises:
        ValueError: ``extra_info.contexts`` does not end with the current user turn.
    """
    info = dict(row.get("extra_info") or {})
    contexts = [{"role": str(m["role"]), "content": str(m["content"])} for m in info.get("contexts") or []]
    if not contexts or contexts[-1]["role"] != "user":
        raise ValueError("extra_info.contexts must end with the current user turn")
    truth = (row.get("reward_model") or {}).get("ground_truth")
    gold_raw = truth.get("gold_doc_ids") if isinstance(truth, Mapping) else truth
    gold = [gold_raw] if isinstance(gold_raw, str) else [str(g) for g in gold_raw or []]
    return Sample(
        index=index,
        prompt=list(row["prompt"]),
        contexts=contexts,
        gold=gold,
        ids={k: str(info.get(k) or "") for k in ID_FIELDS},
        user_profile=str(info.get("user_profile") or ""),
        history_summary=str(info.get("history_summary") or ""),
        kind=str(info.get("kind") or info.get("turn_type") or ""),
        conversation_id=str(info.get("conversation_id") or ""),
        turn=info.get("turn"),
        answer_format=str(info.get("answer_format") or "json"),
    )


def context_dependent(samples: Sequence[Sample]) -> tuple[list[bool], str]:
    """(flag per sample, the rule used): kind != ``explicit`` when any sample has a kind, else has history."""
    if any(s.kind for s in samples):
        return [s.kind != "explicit" for s in samples], "kind != explicit"
    return [len(s.contexts) > 1 for s in samples], "contexts has an earlier message"


@dataclass
class Answer:
    """A system's query for one sample: the parsed rewrite, or a format failure (``query`` None)."""

    query: str | None
    user_profile: str = ""
    history_summary: str = ""
    raw: str | None = None  # a model's reply text
    trailing: bool = False  # a text-format reply that went on after its line: retrieved with, not format_ok


def baseline_answers(kind: str, samples: Sequence[Sample]) -> list[Answer]:
    """The queries of ``raw_turn`` / ``concat_last3`` (the row's profile and summary sent along)."""
    make: Callable[[list[dict[str, str]]], str] = raw_last_turn if kind == "raw_turn" else last_k_turns
    return [Answer(make(s.contexts), s.user_profile, s.history_summary) for s in samples]
