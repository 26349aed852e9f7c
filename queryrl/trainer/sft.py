"""Supervised fine-tuning: learn a target reply per prompt, as a warm start before RL.

``queryrl sft --config FILE key=value ...`` reads verl-layout rows (parquet, JSON lines or
``builtin://NAME/SPLIT``), exactly as the RL data: each row's prompt becomes the chat template
with the assistant turn opened (the very tokens the RL rollout is prompted with), and the string
at ``sft.target_key`` (a dotted path such as ``extra_info.sft_target``) followed by the
tokenizer's EOS token is the reply to learn. The enabled application may supply targets itself
(:meth:`~queryrl.application.Application.sft_targets`: query_rewrite's ``app.query_rewrite.sft_target=rag_chat``
asks its RAG service); the run prints where its targets came from, counted from each row's label at
``sft.target_source_key``.

The loss is the cross-entropy of the target tokens only (prompt and padding are masked), one
token mean over each optimizer batch (``sft.prompt_loss_weight`` w > 0 adds w times the prompt
tokens' mean loss, as TRL's ``completion_only_loss=False`` trains on the whole sequence): the
micro-batches of an optimizer step share one normaliser, the number of target tokens in the
batch, so ``sft.micro_batch_size`` never changes the update. The result is a plain Hugging Face
folder (LoRA merged) with the tokenizer, the metrics and the redacted config, written to a
temporary sibling and renamed into ``sft.output_dir`` once complete; RL starts from it with
``model.path=<folder>``. With LoRA the folder also holds ``adapter/``: the adapter unmerged, in bf16
(``adapter_config.json`` and ``adapter_model.safetensors``; ``queryrl eval --systems NAME=BASE+ADAPTER``).
With ``model.vocab.restrict`` (LoRA) the loss is the cross-entropy over the kept tokens
(:mod:`queryrl.trainer.vocab`: every prompt and target token is kept); the folder holds the full-vocabulary
model and the kept ids in ``vocab_ids.json``, which a GRPO run from it adds to its own.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from queryrl.allocator import keep_freed_memory
from queryrl.atomic import atomic_dir, readable_as_umask
from queryrl.config import ConfigError, redacted, save_config
from queryrl.data import build_prompt_dataset
from queryrl.data.builtin import resolve_data_path
from queryrl.data.records import DataError
from queryrl.engine.optim import optimizer_from_config
from queryrl.engine.seeding import seed_everything
from queryrl.engine.update import clip_and_step
from queryrl.models import load_policy
from queryrl.models.vocab import VOCAB_FILE, unrestrict_head, write_vocab_ids
from queryrl.trainer.components import resolve_device
from queryrl.trainer.machine_record import record_machine, warn_emulated_bf16
from queryrl.trainer.sft_batch import (
    SFTExample,
    collate,
    micro_batch,
    sum_prompt_and_target_loss,
    sum_target_loss,
)
from queryrl.trainer.vocab import sft_restrict

CONSOLE_KEYS: tuple[str, ...] = ("sft/loss", "sft/val_loss", "sft/lr", "sft/grad_norm", "sft/tokens")
CONFIG_NAME = "sft_config.yaml"  # the redacted config, next to the model files
ADAPTER_DIR = "adapter"  # with LoRA: the unmerged adapter (bf16), next to the merged model files
# (file, [(row index, row)]) -> per row (target, where it came from) or None (the row's own): the application's
TargetOverride = Callable[[str, Sequence[tuple[int, Mapping[str, Any]]]], Sequence[tuple[str, str] | None] | None]


@dataclass
class SFTData:
    """The examples of one or more files and what was left out or cut on the way.

    Attributes:
        examples: the examples kept, file after file, in file order.
        num_filtered: prompts longer than ``data.max_prompt_length``, dropped.
        num_truncated: targets longer than ``data.max_response_length``, cut to it.
        sources: where the targets came from -> examples.
    """

    examples: list[SFTExample]
    num_filtered: int = 0
    num_truncated: int = 0
    sources: Counter[str] = field(default_factory=Counter)

    def sources_line(self, what: str) -> str:
        """``SFT targets (train): A (312 rows), B (13 rows)``, most first."""
        counts = ", ".join(f"{where} ({n} rows)" for where, n in self.sources.most_common())
        return f"SFT targets ({what}): {counts or 'none'}"


@dataclass
class SFTResult:
    """What :func:`train_sft` produced.

    Attributes:
        output_dir: the Hugging Face model folder.
        steps: optimizer steps taken.
        losses: the training loss of every step, in order.
        final_loss: the last step's training loss.
        val_loss: the last validation loss, or None without validation data.
    """

    output_dir: Path
    steps: int
    losses: list[float] = field(default_factory=list)
    final_loss: float = float("nan")
    val_loss: float | None = None


# --- data ---------------------------------------------------------------------------------------


def lookup_target(row: dict[str, Any], key: str, source: str, index: int) -> str:
    """The string at the dotted path `key` of `row`.

    Raises:
        DataError: the path is missing (or null) or does not end at a string; the message names
            the file, the row and the key.
    """
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            raise DataError(f"{source}: row {index}: field {key!r}: missing (the SFT target, sft.target_key)")
        node = node[part]
    if not isinstance(node, str):
        raise DataError(
            f"{source}: row {index}: field {key!r}: the SFT target must be a string, got {type(node).__name__}"
        )
    return node


def lookup_source(row: dict[str, Any], key: str, target_key: str) -> str:
    """The string at the dotted path `key` of `row` (where its target came from), else ``the rows' <target_key>``."""
    node: Any = row
    for part in key.split(".") if key else ():
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, str) and node.strip() and key else f"the rows' {target_key} (no source recorded)"


def _targets(
    dataset: Any, source: str, keys: tuple[str, str], override: TargetOverride | None, sources: Counter[str]
) -> list[str]:
    """The target of each item of `dataset`: `override`'s where it gives one, else the row's own at `keys`'
    first (target key); where each came from is counted in `sources` (`keys`' second: the source key)."""
    target_key, source_key = keys
    given = override(source, [(item.index, item.row) for item in dataset.items]) if override else None
    targets = []
    for i, item in enumerate(dataset.items):
        made = given[i] if given is not None else None
        if made is not None:
            targets.append(made[0])
            sources[made[1]] += 1
        else:
            targets.append(lookup_target(item.row, target_key, source, item.index))
            sources[lookup_source(item.row, source_key, target_key)] += 1
    return targets


def build_sft_data(
    files: Sequence[str],
    tokenizer: Any,
    target_key: str,
    max_prompt_length: int,
    max_response_length: int,
    filter_overlong: bool = True,
    prompt_key: str = "prompt",
    cache_dir: str | None = None,
    source_key: str = "",
    override: TargetOverride | None = None,
) -> SFTData:
    """Read the rows of `files` and encode each prompt and target.

    The prompts go through :func:`queryrl.data.build_prompt_dataset`, as the RL prompts do (same
    chat template, same overlong filter); the target is the string at `target_key` (or `override`'s, where
    it gives one) tokenised without special tokens, then the tokenizer's EOS id, cut to
    `max_response_length` tokens. Where each target came from (the row's label at `source_key`) is counted.

    Raises:
        DataError: a bad file or row, or a row without a string target (naming file, row, key).
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; the SFT target needs one to learn where to stop")
    data = SFTData(examples=[])
    for name in files:
        path = resolve_data_path(str(name), cache_dir)
        dataset = build_prompt_dataset(
            path, tokenizer, max_prompt_length, filter_overlong=filter_overlong, prompt_key=prompt_key
        )
        data.num_filtered += dataset.num_filtered
        source = path if path == str(name) else f"{path} ({name})"
        targets = _targets(dataset, source, (target_key, source_key), override, data.sources)
        encoded = tokenizer(targets, add_special_tokens=False)["input_ids"] if targets else []
        for item, ids in zip(dataset.items, encoded, strict=True):
            target = [*ids, eos]
            if len(target) > max_response_length:
                data.num_truncated += 1
                target = target[:max_response_length]
            data.examples.append(SFTExample(list(item.input_ids), target, source, item.index))
    return data


def accumulate_gradients(
    model: nn.Module,
    examples: Sequence[SFTExample],
    micro_batch_size: int,
    pad_id: int,
    device: torch.device,
    prompt_loss_weight: float = 0.0,
    stats: dict[str, float] | None = None,
    share_prefix: bool = True,
) -> tuple[float, int]:
    """Backward the token-mean loss of one optimizer batch, micro-batch by micro-batch.

    Every micro-batch's summed loss is divided by the same normaliser, the number of target
    tokens in the whole of `examples`, so the accumulated gradient does not depend on
    `micro_batch_size`. Returns the batch's mean loss and its number of target tokens.

    With `prompt_loss_weight` w > 0 the objective is the target tokens' mean loss plus w times the
    prompt tokens' mean loss (each mean over the whole batch). The returned loss is still the target
    tokens' alone; the prompt tokens' mean goes into `stats["sft/prompt_loss"]`.

    The micro-batches are cut from `examples` sorted by length, so each is padded to a length close
    to its own sequences' (the gradient is a sum over sequences: the order changes float rounding
    only); ``benchmarks/demo_speed.py`` measures what small sorted micro-batches save. With `share_prefix`
    (``sft.share_prefix_forward``) the prompts' common prefix runs once a micro-batch (:func:`micro_batch`).
    """
    examples = sorted(examples, key=lambda e: len(e.prompt_ids) + len(e.target_ids))
    num_tokens = sum(len(e.target_ids) for e in examples)
    num_prompt = sum(max(len(e.prompt_ids) - 1, 0) for e in examples)
    total, prompt_total = 0.0, 0.0
    for start in range(0, len(examples), micro_batch_size):
        chunk = examples[start : start + micro_batch_size]
        if prompt_loss_weight > 0:
            batch = collate(chunk, pad_id)
            loss_sum, _, prompt_sum, _ = sum_prompt_and_target_loss(model, batch, device)
            objective = loss_sum / max(num_tokens, 1) + prompt_loss_weight * prompt_sum / max(num_prompt, 1)
            prompt_total += prompt_sum.item()
        else:
            loss_sum, _ = sum_target_loss(model, micro_batch(model, chunk, pad_id, share_prefix), device)
            objective = loss_sum / max(num_tokens, 1)
        objective.backward()
        total += loss_sum.item()
    if stats is not None and prompt_loss_weight > 0:
        stats["sft/prompt_loss"] = prompt_total / max(num_prompt, 1)
    return total / max(num_tokens, 1), num_tokens


@torch.no_grad()
def evaluate_loss(
    model: nn.Module,
    examples: Sequence[SFTExample],
    micro_batch_size: int,
    pad_id: int,
    device: torch.device,
    share_prefix: bool = True,
) -> float:
    """The token-mean target loss over `examples` (no gradient, eval mode, then back to train)."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for start in range(0, len(examples), micro_batch_size):
        chunk = micro_batch(model, examples[start : start + micro_batch_size], pad_id, share_prefix)
        loss_sum, n = sum_target_loss(model, chunk, device)
        total, tokens = total + loss_sum.item(), tokens + n
    model.train(was_training)
    return total / max(tokens, 1)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """``range(n)`` in the order of epoch `epoch`: a permutation seeded by ``(seed, epoch)``."""
    if not shuffle:
        return list(range(n))
    return [int(i) for i in np.random.default_rng([seed, epoch]).permutation(n)]


# --- output -------------------------------------------------------------------------------------


def default_output_dir(cfg: DictConfig) -> Path:
    """``sft.output_dir``, or ``{trainer.output_dir}/{trainer.experiment_name}/sft``."""
    if cfg.sft.output_dir:
        return Path(cfg.sft.output_dir).expanduser()
    return Path(cfg.trainer.output_dir) / cfg.trainer.experiment_name / "sft"


def _save_model(model: nn.Module, tokenizer: Any, lora: bool, folder: Path, base: Path) -> None:
    """The model (LoRA merged into its weights) and the tokenizer as a plain Hugging Face folder; with LoRA
    also the adapter unmerged in ``adapter/`` (bf16, its base named by `base`'s folder name:
    :func:`~queryrl.models.adapters.save_adapter`)."""
    if lora:
        from queryrl.models.adapters import base_name, save_adapter

        save_adapter(model, folder / ADAPTER_DIR, base_name(base))
    merged = model.merge_and_unload() if lora else model  # type: ignore[operator]
    merged.save_pretrained(folder)  # type: ignore[operator]
    tokenizer.save_pretrained(folder)
    readable_as_umask(folder)  # safetensors writes 0600


def _check(cfg: DictConfig) -> None:
    s = cfg.sft
    for key, value in {"sft.batch_size": s.batch_size, "sft.micro_batch_size": s.micro_batch_size}.items():
        if value <= 0:
            raise ConfigError(f"{key} must be > 0, got {value}")
    if s.epochs <= 0 and s.max_steps <= 0:
        raise ConfigError(f"sft.epochs must be > 0 (or sft.max_steps set), got {s.epochs}")
    if s.max_steps < 0:
        raise ConfigError(f"sft.max_steps must be >= 0, got {s.max_steps}")
    if not s.prompt_loss_weight >= 0:
        raise ConfigError(f"sft.prompt_loss_weight must be >= 0, got {s.prompt_loss_weight}")
    if not (list(s.train_files) or list(cfg.data.train_files)):
        raise ConfigError("no SFT data: set sft.train_files (or data.train_files)")


def _warn_left_out(data: SFTData, cfg: DictConfig, what: str) -> None:
    if data.num_filtered:
        warnings.warn(
            f"sft {what}: {data.num_filtered} prompts longer than data.max_prompt_length="
            f"{cfg.data.max_prompt_length} were left out",
            stacklevel=3,
        )
    if data.num_truncated:
        warnings.warn(
            f"sft {what}: {data.num_truncated} targets longer than data.max_response_length="
            f"{cfg.data.max_response_length} tokens were truncated (their EOS is cut off)",
            stacklevel=3,
        )


# --- the run ------------------------------------------------------------------------------------


def _train_and_val(cfg: DictConfig, tokenizer: Any) -> tuple[SFTData, SFTData]:
    """The SFT train and validation examples (``sft.train_files`` / ``val_files``, else ``data.*``), with the
    enabled application's targets where it makes them (:meth:`~queryrl.application.Application.sft_targets`)."""
    from queryrl.application import enabled_app

    s = cfg.sft
    app = enabled_app(cfg)
    override: TargetOverride | None = (lambda source, rows: app.sft_targets(cfg, source, rows)) if app else None

    def load(files: list[str], what: str) -> SFTData:
        data = build_sft_data(
            files,
            tokenizer,
            s.target_key,
            cfg.data.max_prompt_length,
            cfg.data.max_response_length,
            filter_overlong=cfg.data.filter_overlong_prompts,
            prompt_key=cfg.data.prompt_key,
            cache_dir=cfg.model.cache_dir,
            source_key=s.target_source_key,
            override=override,
        )
        _warn_left_out(data, cfg, what)
        return data

    train = load(list(s.train_files) or list(cfg.data.train_files), "train")
    if not train.examples:
        raise DataError(f"no SFT examples to train on ({train.num_filtered} prompts were filtered as overlong)")
    return train, load(list(s.val_files) or list(cfg.data.val_files), "val")


def batch_schedule(
    n: int, batch_size: int, total_steps: int, seed: int, shuffle: bool
) -> Iterator[tuple[int, int, list[int]]]:
    """(step from 1, epoch from 0, example indices) of each of `total_steps` optimizer steps over `n` examples:
    consecutive slices of each epoch's order (:func:`epoch_order`; the last, smaller batch is kept)."""
    step, epoch, order, pos = 0, 0, epoch_order(n, seed, 0, shuffle), 0
    while step < total_steps:
        if pos >= len(order):
            epoch, pos = epoch + 1, 0
            order = epoch_order(n, seed, epoch, shuffle)
        step += 1
        yield step, epoch, order[pos : pos + batch_size]
        pos += batch_size


def train_sft(cfg: DictConfig, echo: Callable[[str], None] = print) -> SFTResult:
    """Fine-tune the policy of `cfg` on the SFT targets and write the model folder.

    Args:
        cfg: a resolved config from :func:`queryrl.config.load_config`; reads ``sft.*``,
            ``model.*``, ``data.*`` (prompt key, lengths, overlong filter, shuffle) and
            ``trainer.*`` (seed, device, num_threads, logger, log_every); validation every ``sft.eval_every`` steps.
        echo: where the lines saying where the targets came from go.

    Returns:
        The output folder and the loss history.

    Raises:
        ConfigError: an invalid ``sft.*`` setting or no training data.
        DataError: a bad data file or row (e.g. a row without its target).
    """
    _check(cfg)
    s = cfg.sft
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    keep_freed_memory(cfg.trainer.malloc_mmap_threshold_mb)
    seed_everything(cfg.trainer.seed)
    device = resolve_device(cfg.trainer.device)
    warn_emulated_bf16(cfg)  # bf16 forced on a CPU that emulates it: one line, before the model loads
    bundle = load_policy(cfg.model, device, None, need_ref=False)
    model, tokenizer = bundle.model, bundle.tokenizer
    pad_id = int(tokenizer.pad_token_id)

    train, val = _train_and_val(cfg, tokenizer)
    for data, what in ((train, "train"), (val, "val")):
        if data.examples:
            echo(data.sources_line(what))

    steps_per_epoch = math.ceil(len(train.examples) / s.batch_size)  # the last, smaller batch is kept
    total_steps = s.max_steps or s.epochs * steps_per_epoch
    data_stats = {
        "data/filtered_prompts": float(train.num_filtered + val.num_filtered),
        "sft/truncated_targets": float(train.num_truncated + val.num_truncated),
    }
    vocab = sft_restrict(cfg, model, tokenizer, [*train.examples, *val.examples]) if cfg.model.vocab.restrict else None
    if vocab is not None:  # model.vocab.restrict: a metric every step, as in RL
        data_stats["data/vocab_kept"] = float(len(vocab[0]))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = optimizer_from_config(params, cfg, "sft", total_steps)

    out = default_output_dir(cfg)
    result = SFTResult(output_dir=out, steps=0)
    # written in a temporary folder; an existing `out` is replaced only once the new one is complete
    with atomic_dir(out, replace=True) as tmp:
        save_config(cfg, tmp / CONFIG_NAME)
        record_machine(tmp, echo)  # machine.json beside it: what the steps ran on
        optim = (optimizer, scheduler, params)
        step = _run_steps(cfg, tmp, model, (pad_id, device), (train, val), optim, total_steps, data_stats, result)
        result.steps, result.final_loss = step, result.losses[-1]
        if cfg.trainer.plot and "jsonl" in cfg.trainer.logger:  # plots/sft.png from the metrics just written
            from queryrl.trainer.plot import plot_run

            plot_run(tmp)
        model.eval()
        if vocab is not None:  # the full head back (it was frozen: the saved model is the full one), the ids beside
            unrestrict_head(model, vocab[1])
            write_vocab_ids(tmp / VOCAB_FILE, vocab[0])
        _save_model(model, tokenizer, bundle.lora, tmp, bundle.path)
    return result


def _run_steps(
    cfg: DictConfig,
    folder: Path,
    model: torch.nn.Module,
    where: tuple[int, torch.device],
    data: tuple[Any, Any],
    optim: tuple[Any, Any, list[torch.nn.Parameter]],
    total_steps: int,
    data_stats: dict[str, float],
    result: SFTResult,
) -> int:
    """The optimizer steps over `data` (train, val) with `where` (the pad id, the device), logged to `folder`'s
    trackers; the losses go into `result`. Returns the last step."""
    from queryrl.tracking import Tracker

    s, t = cfg.sft, cfg.trainer
    (pad_id, device), (train, val), (optimizer, scheduler, params) = where, data, optim
    tracker_args = (t.project_name, t.experiment_name, redacted(cfg), total_steps)
    with Tracker(folder, list(t.logger), *tracker_args, console_keys=CONSOLE_KEYS) as tracker:
        model.train()
        step = 0
        for step, epoch, indices in batch_schedule(
            len(train.examples), s.batch_size, total_steps, t.seed, cfg.data.shuffle
        ):
            batch, start = [train.examples[i] for i in indices], time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            stats: dict[str, float] = {}
            loss, tokens = accumulate_gradients(
                model, batch, s.micro_batch_size, pad_id, device, s.prompt_loss_weight, stats, s.share_prefix_forward
            )
            metrics = {"sft/loss": loss, "sft/lr": optimizer.param_groups[0]["lr"], "sft/tokens": float(tokens)}
            metrics |= stats | clip_and_step(optimizer, params, s.grad_clip, "sft")  # as the RL update steps
            scheduler.step()
            metrics |= {"sft/epoch": float(epoch), "timing_s/step": time.perf_counter() - start} | data_stats
            result.losses.append(loss)
            last = step == total_steps
            if val.examples and ((s.eval_every and step % s.eval_every == 0) or last):
                result.val_loss = evaluate_loss(
                    model, val.examples, s.micro_batch_size, pad_id, device, s.share_prefix_forward
                )
                metrics["sft/val_loss"] = result.val_loss
            if step % max(t.log_every, 1) == 0 or last:
                tracker.log(metrics, step=step)
    return step


def run_sft(cfg: DictConfig) -> Path:
    """Fine-tune as :func:`train_sft` does and return the Hugging Face model folder."""
    return train_sft(cfg).output_dir
