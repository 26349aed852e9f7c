"""TRL-style reward functions: ``fn(prompts, completions, **kwargs) -> list[float | None]``, taken as they are.

TRL's ``GRPOTrainer`` (``reward_funcs``; https://huggingface.co/docs/trl/main/en/grpo_trainer, "Using a
custom reward function") calls each reward function once per batch with keyword arguments:

- ``prompts``: one per completion; a list of ``{"role", "content"}`` messages when the data is
  conversational, else a string;
- ``completions``: one per completion; conversational: ``[{"role": "assistant", "content": text}]``,
  else the text;
- ``completion_ids``: the completion's token ids;
- every other dataset column, as a list with one value per completion;
- ``trainer_state``: the trainer's state (TRL's ``TrainerState``; here :class:`TrainerState`, or None).

It returns one float per completion; ``None`` means "this function does not score this sample".
queryrl follows TRL 1.16 there: a sample that no function scored (None, or NaN, which TRL makes of None)
is *unscored*, not failed. It stays in the batch with a NaN reward, is left out of its group's mean and
standard deviation (TRL's ``nanmean``/``nanstd``) and gets advantage 0 (``reward/unscored`` counts them);
a step where a function scores only some samples trains on the others. An exception in a function stops
the run with the function's name and the error, as TRL raises it (:class:`~.skips.RewardFunctionRaised`; the CLI
exits 3). A return of the wrong shape does the same: that is a bug in the function, not a flaky sample.

What queryrl passes, per batch (one :meth:`~.manager.RewardManager.submit`; in the trainer, the step's whole
generation batch, as TRL calls once per generation batch: a prompt's group is never split across calls):

- ``prompts`` and ``completions`` in the data's own form, as TRL decides by the dataset's format. Rows
  whose ``prompt`` column is a list of chat messages (verl's layout) are conversational: prompts are
  the message lists and each completion is ``[{"role": "assistant", "content": text}]``. Rows whose
  ``prompt`` is a plain string (TRL's standard format; the loader keeps it as a
  :class:`~queryrl.data.records.TextPrompt`) give the strings back: prompts are those strings and
  completions the texts. A batch mixing the two is conversational. (The policy itself is prompted
  through its chat template either way, the string as one user message.) An input without a row
  (a :class:`RewardInput` made by hand) gives None as its prompt and a plain completion.
- ``completion_ids``: :attr:`RewardInput.completion_ids` (the response's trained tokens).
- the columns: every column of the data row except ``prompt``, the union over the batch (None where
  a row lacks one), with ``data_source`` and ``extra_info`` as the verl contract sees them (the
  rollout's facts such as ``num_tool_calls`` merged in) and ``ground_truth`` added from
  ``reward_model.ground_truth`` (unless the row has a ``ground_truth`` column of its own).
- ``log_metric(name, value)`` and ``log_extra(column, values)``, as TRL 1.16 passes them: a logged metric
  is averaged into the step's metrics under its name; a column's values (one per completion) go into each
  sample's ``reward_info`` in the samples files (TRL's completions table);
- ``trainer_state``: :class:`TrainerState` (``global_step``, ``max_steps``, ``epoch``, ``num_train_epochs``, an
  empty ``log_history``) when the inputs carry the step, else None.
- ``reward.kwargs``; one that has the name of an argument above is an error.

Detection (``reward.function.style=auto``; :func:`is_trl_style`): a function is TRL-style when its
first two positional parameters are named ``prompts`` and ``completions``, or when it has a
parameter named ``completions``, takes ``**kwargs``, and has no parameter named ``solution_str``.
Everything else is verl-style. ``style=trl`` or ``style=verl`` skips the detection.

A list of the wrong length, or a value that is neither a number nor None, is one error naming the
function; like an exception, it stops the run.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from queryrl.data.records import TextPrompt
from queryrl.plugins import file_module_name
from queryrl.rewards.functions import RewardError, RewardFn
from queryrl.rewards.manager import LoopRunner, RewardInput, RewardResult, as_number, failure, unscored_result

STYLES = ("auto", "verl", "trl")
# the arguments queryrl names itself; a dataset column never overrides them, a reward.kwargs key may not either
_RESERVED = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra"})


@dataclass(frozen=True)
class TrainerState:
    """What queryrl tells a TRL-style function about training: the fields of transformers' ``TrainerState``
    (what TRL passes) that say where training stands, with TRL's meaning.

    Attributes:
        global_step: the training step being scored (1-based, as the trainer counts).
        max_steps: the steps the run trains for (``trainer.total_steps``, or epochs x steps per epoch).
        epoch: epochs done so far, a float (TRL: ``global_step / steps_per_epoch`` at the step's start).
        num_train_epochs: the epochs the run covers.
        log_history: TRL's list of logged metrics; empty here (queryrl's metrics are in metrics.jsonl).
    """

    global_step: int
    max_steps: int = 0
    epoch: float = 0.0
    num_train_epochs: int = 0
    log_history: tuple[dict[str, float], ...] = ()


def is_trl_style(fn: RewardFn) -> bool:
    """Whether `fn` looks TRL-style (the rule of the module doc); a signature that cannot be read is verl's."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    names = {p.name for p in params}
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if positional[:2] == ["prompts", "completions"]:
        return True
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    return "completions" in names and var_keyword and "solution_str" not in names


def function_name(fn: Any) -> str:
    """How messages name `fn`: ``file.py:name`` for one loaded from a file, else ``module.qualname``."""
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None:
        return str(qualname)
    file = getattr(module, "__file__", None)
    if file and module.__name__ == file_module_name(Path(file).resolve()):  # loaded by reward.function.path
        return f"{file}:{qualname}"
    return f"{module.__name__}.{qualname}"


def _is_chat(prompt: Any) -> bool:
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)
    )


class TRLRewardFunction:
    """A TRL-style function, called once per batch; the managers that can take one call :meth:`score_batch`.

    Args:
        fn: the user's function (may be ``async def``).
    """

    def __init__(self, fn: RewardFn) -> None:
        self.fn = fn
        self.name = function_name(fn)
        self._lock = threading.Lock()
        self._logged: dict[str, list[float]] = {}  # log_metric: name -> values since the last pop_metrics
        self._columns: dict[int, dict[str, list[Any]]] = {}  # log_extra, per call (by id of its inputs)

    def __getstate__(self) -> dict[str, Any]:  # picklable as before, without its lock (a copy logs on its own)
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric``: a scalar of this batch, averaged into the step's metrics as `name`."""
        with self._lock:
            self._logged.setdefault(str(name), []).append(float(value))

    def pop_metrics(self) -> dict[str, float]:
        """What the function logged with ``log_metric`` since the last call, each name's mean (the trainer
        adds it to the step's metrics, as TRL reports it beside ``kl`` and ``entropy``)."""
        with self._lock:
            logged, self._logged = self._logged, {}
        return {name: sum(values) / len(values) for name, values in logged.items() if values}

    def _with_columns(self, results: list[RewardResult], inputs: Sequence[RewardInput]) -> list[RewardResult]:
        """Each sample's ``log_extra`` values as its ``reward_info`` (the samples files show them: TRL's
        completions table)."""
        with self._lock:
            columns = self._columns.pop(id(inputs), {})
        for column, values in columns.items():
            for result, value in zip(results, values, strict=False):
                result.info[column] = value
        return results

    def __repr__(self) -> str:
        return f"TRLRewardFunction({self.name})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The user's function itself (TRL's arguments), e.g. to try it by hand."""
        return self.fn(*args, **kwargs)

    def call_kwargs(self, inputs: Sequence[RewardInput], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of one call on `inputs` (see the module doc).

        Raises:
            RewardError: a key of `kwargs` is also the name of an argument queryrl passes.
        """
        prompts = [x.row.get("prompt") for x in inputs]
        texts = [p.text for p in prompts if isinstance(p, TextPrompt)]
        if prompts and len(texts) == len(prompts):  # TRL's standard format: strings
            prompts = list(texts)
        chat = all(_is_chat(p) for p in prompts)
        completions: list[Any] = (
            [[{"role": "assistant", "content": x.solution_str}] for x in inputs]
            if chat
            else [x.solution_str for x in inputs]
        )
        rows = [
            {k: v for k, v in x.row.items() if k != "prompt"}
            | {"data_source": x.data_source, "extra_info": x.extra_info}
            | ({} if "ground_truth" in x.row else {"ground_truth": x.ground_truth})
            for x in inputs
        ]
        names = sorted({k for r in rows for k in r} - _RESERVED)
        steps = {x.step for x in inputs}
        step = steps.pop() if len(steps) == 1 else None
        progress = dict(inputs[0].progress or {}) if step is not None else {}
        clash = sorted(set(kwargs) & (_RESERVED | set(names)))
        if clash:
            raise RewardError(
                f"reward.kwargs {', '.join(clash)} of TRL-style reward function {self.name} have the names of "
                "arguments queryrl passes (prompts, completions, completion_ids, trainer_state, the data columns)"
            )
        key = id(inputs)

        def log_extra(column: str, values: Sequence[Any]) -> None:  # TRL: a column of the completions table
            with self._lock:
                kept = self._columns.setdefault(key, {}).setdefault(str(column), [])
                kept.extend(values)
                del kept[: -len(inputs)]  # a retried call logs again: its last values count

        return {
            "prompts": prompts,
            "completions": completions,
            "completion_ids": [list(x.completion_ids) for x in inputs],
            "log_metric": self._log_metric,
            "log_extra": log_extra,
            **{name: [r.get(name) for r in rows] for name in names},
            "trainer_state": TrainerState(global_step=step, **progress) if step is not None else None,
            **kwargs,
        }

    def numbers(self, values: Any, count: int) -> list[float | None]:
        """What one call returned, checked: `count` floats, None where the function gave None or NaN.

        Raises:
            RewardError: not a list of `count` entries, or an entry that is neither a number nor None
                (the message says which, without the function's name).
        """
        try:
            values = list(values)
        except TypeError:
            raise RewardError(f"returned {type(values).__name__}, not a list of numbers") from None
        if len(values) != count:
            raise RewardError(f"returned {len(values)} values for {count} completions")
        out: list[float | None] = []
        for i, value in enumerate(values):
            number = as_number(value)
            if value is not None and number is None:
                raise RewardError(
                    f"returned {value!r} ({type(value).__name__}) for completion {i}: expected a number or None"
                )
            out.append(None if number is None or math.isnan(number) else number)
        return out

    def results(self, values: Any, inputs: Sequence[RewardInput]) -> list[RewardResult]:
        """Check what one call returned: one number or None per input; None and NaN are unscored samples
        (TRL's), an infinite value a failed one.

        A return that is not a list of len(inputs), or holds something else, stops the run with one error
        naming the function (every sample gets it, marked ``stop``).
        """
        try:
            values = list(values)
        except TypeError:
            return self._fail_all(inputs, f"returned {type(values).__name__}, not a list of numbers")
        try:
            numbers = self.numbers(values, len(inputs))
        except RewardError as e:
            return self._fail_all(inputs, str(e))
        results = []
        for number, x in zip(numbers, inputs, strict=True):
            if number is None:
                results.append(unscored_result())
            elif math.isinf(number):
                results.append(failure(x.data_source, f"TRL-style reward function {self.name} returned {number}"))
            else:
                results.append(RewardResult(score=number))
        return self._with_columns(results, inputs)

    def _fail_all(self, inputs: Sequence[RewardInput], reason: str, name: str | None = None) -> list[RewardResult]:
        """Every sample failed with one error that stops the run (TRL raises)."""
        with self._lock:
            self._columns.pop(id(inputs), None)
        message = f"TRL-style reward function {name or self.name} {reason}"
        return [replace(failure(x.data_source, message), stop=True) for x in inputs]

    def score_batch(
        self, inputs: Sequence[RewardInput], kwargs: Mapping[str, Any], loop: LoopRunner
    ) -> list[RewardResult]:
        """One call on all of `inputs` in this thread (awaited on `loop` if it is a coroutine).

        An exception fails every sample with the error, marked to stop the run (TRL raises it).
        """
        if not inputs:
            return []
        try:
            values = self.fn(**self.call_kwargs(inputs, kwargs))
            if inspect.isawaitable(values):
                values = loop.run(values)
        except MemberRaised as e:
            return self._fail_all(inputs, e.reason, e.member)
        except Exception as e:
            return self._fail_all(inputs, f"raised {type(e).__name__}: {e}")
        return self.results(values, inputs)


def with_style(fn: RewardFn, style: str) -> RewardFn:
    """`fn` as the managers take it: wrapped in :class:`TRLRewardFunction` when it is TRL-style.

    Args:
        fn: the loaded function.
        style: ``trl``, ``verl`` or ``auto`` (:func:`is_trl_style`).

    Raises:
        RewardError: an unknown `style`.
    """
    if style not in STYLES:
        raise RewardError(f"reward.function.style must be one of {', '.join(STYLES)}, got {style!r}")
    if style == "trl" or (style == "auto" and is_trl_style(fn)):
        return TRLRewardFunction(fn)
    return fn


def describe_weighted(entries: Sequence[tuple[float, str]]) -> str:
    """How messages and ``--dry-run`` name a weighted combination: ``0.5 x a.py:f + 2 x a.py:g``."""
    return " + ".join(f"{weight:g} x {name}" for weight, name in entries)


class WeightedTRLRewards(TRLRewardFunction):
    """Several TRL-style functions combined as TRL's ``GRPOTrainer(reward_funcs=[...])`` with
    ``reward_weights`` combines them: each is called once per batch with the same arguments, and a sample's
    score is the weighted sum of the functions that scored it (TRL's ``nansum``: a function returning None
    for a sample leaves it out there). A sample that no function scored is unscored, as in TRL: NaN
    reward, left out of its group's baseline, advantage 0. Each function's own value is kept as an extra
    value under its label, so the step logs ``reward/<label>/mean`` (TRL logs ``rewards/<name>/mean``).

    ``aggregation`` is TRL's ``multi_objective_aggregation``: ``sum_then_normalize`` (the default: the
    weighted sum is the score, and the advantage estimator normalises it per group) or
    ``normalize_then_sum`` (GDPO; TRL 1.16): each function's values are first normalised within each
    group, ``(v - nanmean) / (nanstd + 1e-4)``, and their weighted sum is the score. TRL then normalises
    that sum over the whole batch rather than per group; here the configured estimator (GRPO: per group)
    does, which is the one difference (documented in docs/rewards.md's TRL table).

    An exception in one function, or a return that is not one number or None per completion, stops the
    run with one error naming that function (TRL raises).

    Args:
        members: the functions with their weights and labels (labels unique; default: the function names).
    """

    def __init__(
        self, members: Sequence[tuple[TRLRewardFunction, float, str]], aggregation: str = "sum_then_normalize"
    ) -> None:
        if not members:
            raise RewardError("no reward functions to combine")
        if aggregation not in AGGREGATIONS:
            raise RewardError(
                f"reward.multi_objective_aggregation must be one of {', '.join(AGGREGATIONS)} (TRL 1.16's "
                f"modes), got {aggregation!r}"
            )
        self.aggregation = aggregation
        labels = [label for _, _, label in members]
        if len(set(labels)) != len(labels):
            raise RewardError(f"reward function labels must differ, got {labels}")
        self.members = list(members)
        super().__init__(self._call_all)
        self.name = f"weighted({describe_weighted([(w, m.name) for m, w, _ in self.members])})"

    async def _call_all(self, **kwargs: Any) -> list[Any]:
        """Every member's return on the same arguments (sync ones in a thread, so an event loop never blocks)."""
        out = []
        for member, _, _ in self.members:
            try:
                if inspect.iscoroutinefunction(member.fn):
                    value = await member.fn(**kwargs)
                else:
                    value = await asyncio.to_thread(member.fn, **kwargs)
                    if inspect.isawaitable(value):
                        value = await value
            except Exception as e:
                raise MemberRaised(member.name, f"raised {type(e).__name__}: {e}") from e
            out.append(value)
        return out

    def results(self, values: Any, inputs: Sequence[RewardInput]) -> list[RewardResult]:
        """Combine the members' returns (see the class doc)."""
        per_member: list[list[float | None]] = []
        for (member, _, _), value in zip(self.members, values, strict=True):
            try:
                per_member.append(member.numbers(value, len(inputs)))
            except RewardError as e:
                return self._fail_all(inputs, str(e), member.name)
        terms = per_member
        if self.aggregation == "normalize_then_sum":
            terms = [group_normalized(nums, inputs) for nums in per_member]
        weights = {label: w for _, w, label in self.members}
        results = []
        for j, x in enumerate(inputs):
            given = {label: nums[j] for (_, _, label), nums in zip(self.members, per_member, strict=True)}
            scored = {label: v for label, v in given.items() if v is not None}
            bad = sorted(label for label, v in scored.items() if math.isinf(v))
            if bad:
                reason = f"{bad[0]} returned {scored[bad[0]]}"
                results.append(failure(x.data_source, f"TRL-style reward function {reason}"))
            elif not scored:
                results.append(unscored_result())
            else:
                parts = {label: nums[j] for (_, _, label), nums in zip(self.members, terms, strict=True)}
                total = sum(weights[label] * v for label, v in parts.items() if v is not None)
                results.append(RewardResult(score=total, extra=dict(scored)))
        return self._with_columns(results, inputs)


class MemberRaised(RewardError):
    """One function of a :class:`WeightedTRLRewards` raised: its name and what it raised."""

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(f"{member} {reason}")
        self.member, self.reason = member, reason


AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def group_normalized(values: Sequence[float | None], inputs: Sequence[RewardInput]) -> list[float | None]:
    """TRL's ``normalize_then_sum`` step for one function: each value minus its group's mean, over its
    group's standard deviation plus 1e-4 (both over the values that are numbers, the std with Bessel's
    correction, as TRL's ``nanstd``; a group of one has std 0). None stays None. Groups are the inputs'
    ``group`` (their prompt); inputs without one are each their own group."""
    groups: dict[Any, list[int]] = {}
    for i, x in enumerate(inputs):
        groups.setdefault(x.group if x.group is not None else ("row", i), []).append(i)
    out: list[float | None] = list(values)
    for rows in groups.values():
        present = [v for v in (values[i] for i in rows) if v is not None and math.isfinite(v)]
        if not present:
            continue
        mean = sum(present) / len(present)
        std = math.sqrt(sum((v - mean) ** 2 for v in present) / (len(present) - 1)) if len(present) > 1 else 0.0
        for i in rows:
            v = values[i]
            if v is not None and math.isfinite(v):
                out[i] = (v - mean) / (std + 1e-4)
    return out
