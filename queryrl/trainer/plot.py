"""Training curves as PNGs: ``plot_run(run_dir)`` reads ``metrics.jsonl`` and writes ``plots/*.png``.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot, no display, no global
state), and each PNG is written under a temporary name and renamed, so a reader never sees a
half-written image. A figure whose metrics never appear in the run is not written.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from queryrl.atomic import atomic_path
from queryrl.fonts import cjk_fonts
from queryrl.tracking import decoded_lines

Series = dict[str, tuple[list[int], list[float]]]  # key -> (steps, values), sorted by step
KeySelector = Callable[[Sequence[str]], list[str]]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` written by the tracker.

    Args:
        path: the file; one JSON object with an integer ``step`` per line.

    Returns:
        The records in file order. A line that is not one (a torn write of a killed run, a byte that is not
        UTF-8) is dropped with a warning naming the file and the line, as the tracker drops it on resume.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: no records at all.
    """
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    records = []
    for lineno, line in decoded_lines(path):
        try:
            record = json.loads(line) if line is not None else None
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        else:
            what = "not UTF-8" if line is None else "not a JSON object with an integer 'step'"
            warnings.warn(f"{path}: line {lineno} is {what}; dropped", stacklevel=2)
    if not records:
        raise ValueError(f"{path} holds no metrics")
    return records


def to_series(records: list[dict[str, Any]]) -> Series:
    """Per-key (steps, values), finite numbers only; a step logged twice keeps its last value."""
    by_key: dict[str, dict[int, float]] = {}
    for record in records:
        step = record["step"]
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                by_key.setdefault(key, {})[int(step)] = float(value)
    return {key: (sorted(points), [points[s] for s in sorted(points)]) for key, points in by_key.items()}


def _fixed(*wanted: str) -> KeySelector:
    return lambda keys: [k for k in wanted if k in keys]


def _matching(pattern: str) -> KeySelector:
    regex = re.compile(pattern)
    return lambda keys: sorted(k for k in keys if regex.search(k))


def _both(first: KeySelector, second: KeySelector) -> KeySelector:
    def select(keys: Sequence[str]) -> list[str]:
        chosen = first(keys)
        return chosen + [k for k in second(keys) if k not in chosen]

    return select


@dataclass(frozen=True)
class Panel:
    """One axes of a figure: the keys it draws and its y label."""

    select: KeySelector
    ylabel: str
    markers: bool = False  # always mark points (sparse series such as validation)


@dataclass(frozen=True)
class PlotSpec:
    """One PNG: its file name, title and panels (stacked vertically, sharing the step axis)."""

    name: str
    title: str
    panels: tuple[Panel, ...]


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec(
        "reward.png",
        "Reward",
        (
            Panel(
                _both(_fixed("critic/score/mean", "critic/rewards/mean"), _matching(r"^val/.*(score|reward)s?/mean")),
                "score",
            ),
        ),
    ),
    PlotSpec(
        "losses.png",
        "Losses",
        (Panel(_fixed("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "critic/vf_loss"), "loss"),),
    ),
    PlotSpec("kl.png", "KL divergence", (Panel(_fixed("actor/kl_loss", "actor/ppo_kl", "critic/kl"), "KL"),)),
    PlotSpec("entropy.png", "Policy entropy", (Panel(_fixed("actor/entropy"), "entropy (nats/token)"),)),
    PlotSpec(
        "response_length.png",
        "Response length",
        (
            Panel(_fixed("response_length/mean", "response_length/max", "response_length/min"), "tokens"),
            Panel(_fixed("response_length/clip_ratio"), "clipped fraction"),
        ),
    ),
    PlotSpec(
        "validation.png",
        "Validation",
        (  # one quantity per axis: a score of 1.5 beside a length of 27 would look flat
            Panel(_matching(r"^val/.*(score|reward)s?/mean$"), "score", markers=True),
            Panel(_matching(r"^val/.*(recall|mrr|ndcg|acc)"), "retrieval / accuracy", markers=True),
            Panel(_matching(r"^val/response_length/"), "tokens", markers=True),
            Panel(_matching(r"^val/reward/failed"), "failed samples", markers=True),
        ),
    ),
    PlotSpec("timing.png", "Time per step", (Panel(_matching(r"^timing_s/"), "seconds"),)),
    PlotSpec(
        "sft.png",
        "Supervised fine-tuning",
        (
            Panel(_fixed("sft/loss", "sft/val_loss", "sft/prompt_loss"), "loss (nats/token)"),
            Panel(_fixed("sft/grad_norm"), "gradient norm"),
            Panel(_fixed("sft/lr"), "learning rate"),
        ),
    ),
)

_FEW_POINTS = 20  # below this many points a line gets markers, so a lone point is visible


def _distinct(series: Series, keys: list[str]) -> list[tuple[str, str]]:
    """(key, label) per distinct curve: a key whose points equal an earlier one's joins its label
    (``critic/score/mean = critic/rewards/mean`` without a KL penalty) instead of a second, hidden line."""
    drawn: list[tuple[str, list[str]]] = []
    for key in keys:
        same = next((names for first, names in drawn if series[first] == series[key]), None)
        if same is not None:
            same.append(key)
        else:
            drawn.append((key, [key]))
    return [(first, " = ".join(names)) for first, names in drawn]


def _draw(spec: PlotSpec, series: Series) -> Figure | None:
    """The figure for ``spec``, or None when none of its keys has data."""
    panels = [(panel, panel.select(list(series))) for panel in spec.panels]
    panels = [(panel, keys) for panel, keys in panels if keys]
    if not panels:
        return None
    fig = Figure(figsize=(8, 3.2 * len(panels) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (panel, keys) in zip(axes, panels, strict=True):
        for key, label in _distinct(series, keys):
            steps, values = series[key]
            sparse = panel.markers or key.startswith("val/") or len(steps) < _FEW_POINTS
            marker = "o" if sparse else None
            ax.plot(steps, values, marker=marker, markersize=3, label=label)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[-1].set_xlabel("step")
    fig.suptitle(spec.title)
    return fig


def plot_run(run_dir: Path) -> list[Path]:
    """Draw a run's curves from ``run_dir/metrics.jsonl`` into ``run_dir/plots/``.

    Figures: reward, losses, kl, entropy, response_length, validation, timing, sft (an SFT run's
    loss, gradient norm and learning rate); each only when at least one of its metrics has data.

    Args:
        run_dir: the run's folder, holding ``metrics.jsonl``.

    Returns:
        The PNG paths written, in the order of :data:`PLOTS`.

    Raises:
        FileNotFoundError: no ``metrics.jsonl``.
        ValueError: an empty file, a malformed line (named by number), or no metric any figure draws.
    """
    series = to_series(read_metrics(Path(run_dir) / "metrics.jsonl"))
    out_dir = Path(run_dir) / "plots"
    written = []
    for spec in PLOTS:
        with cjk_fonts():  # Chinese data_source names in the legends
            fig = _draw(spec, series)
            if fig is None:
                continue
            with atomic_path(out_dir / spec.name) as tmp:  # a reader never sees a half-written image
                fig.savefig(tmp, format="png", dpi=100)
        written.append(out_dir / spec.name)
    if not written:
        raise ValueError(
            f"{Path(run_dir) / 'metrics.jsonl'}: none of its metrics is one the plots draw "
            f"(e.g. critic/score/mean, actor/pg_loss, val/..., sft/loss); keys: {', '.join(sorted(series)[:8])}"
        )
    return written
