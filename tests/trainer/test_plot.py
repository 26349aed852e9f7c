"""plot_run: which PNGs a run gets, that they are real PNGs, and clear errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from queryrl.trainer.plot import plot_run, read_metrics, to_series

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write_metrics(run_dir: Path, records: list[dict[str, float | None]]) -> None:
    with (run_dir / "metrics.jsonl").open("w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def _synthetic_run(steps: int = 30) -> list[dict[str, float | None]]:
    records: list[dict[str, float | None]] = []
    for s in range(1, steps + 1):
        record: dict[str, float | None] = {
            "step": s,
            "critic/score/mean": s / steps,
            "actor/pg_loss": -0.1 / s,
            "actor/kl_loss": 0.001 * s,
            "actor/entropy": 2.0 - s / steps,
            "response_length/mean": 100.0 + s,
            "response_length/max": 200.0,
            "response_length/min": 10.0,
            "response_length/clip_ratio": 0.05,
            "timing_s/gen": 1.5,
            "timing_s/update_actor": 0.5,
            "timing_s/step": 2.0,
        }
        if s % 10 == 0:  # sparse validation
            record["val/query_rewrite/score/mean"] = s / steps
            record["val/query_rewrite/recall@10"] = 0.5
        records.append(record)
    records[3]["actor/pg_loss"] = None  # a NaN written as null is simply a gap
    return records


def test_plot_run_writes_the_plots_that_have_data(tmp_path: Path) -> None:
    _write_metrics(tmp_path, _synthetic_run())
    written = plot_run(tmp_path)
    names = [p.name for p in written]
    # No critic/vf_loss, ppo_kl or critic/kl: losses and kl still drawn from the actor keys.
    assert names == [
        "reward.png",
        "losses.png",
        "kl.png",
        "entropy.png",
        "response_length.png",
        "validation.png",
        "timing.png",
    ]
    for path in written:
        assert path.parent == tmp_path / "plots"
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE, path
        assert len(data) > 5_000, path  # a drawn figure, not an empty canvas
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(names)  # no temp files left


def test_plot_run_skips_figures_without_data(tmp_path: Path) -> None:
    _write_metrics(tmp_path, [{"step": s, "critic/score/mean": 0.1 * s, "other/x": 1.0} for s in range(1, 4)])
    assert [p.name for p in plot_run(tmp_path)] == ["reward.png"]
    assert not (tmp_path / "plots" / "validation.png").exists()


def test_missing_and_empty_metrics_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl holds no metrics"):
        plot_run(tmp_path)


def test_a_torn_or_undecodable_line_is_dropped_with_a_warning_naming_it(tmp_path: Path) -> None:
    """Issue 52 item 3: a ``\\xff`` byte in metrics.jsonl was a UnicodeDecodeError naming no file; a torn line
    stopped the plot. Each such line is now dropped with one warning naming file and line; the rest is drawn."""
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(b'{"step": 1, "x": 1.0}\n{"step": 2, "x": \n[1, 2]\n\xff\n{"step": 3, "x": 3.0}\n\xff')
    with pytest.warns(UserWarning, match="dropped") as caught:
        records = read_metrics(metrics)
    assert [r["step"] for r in records] == [1, 3]
    assert [str(w.message) for w in caught] == [
        f"{metrics}: line 2 is not a JSON object with an integer 'step'; dropped",
        f"{metrics}: line 3 is not a JSON object with an integer 'step'; dropped",
        f"{metrics}: line 4 is not UTF-8; dropped",
        f"{metrics}: line 6 is not UTF-8; dropped",
    ]


def test_to_series_sorts_steps_keeps_the_last_duplicate_and_drops_gaps() -> None:
    records = [{"step": 2, "x": 2.0}, {"step": 1, "x": 1.0, "y": None}, {"step": 2, "x": 20.0}]
    assert to_series(records) == {"x": ([1, 2], [1.0, 20.0])}


def test_an_sft_run_gets_its_curves(tmp_path: Path) -> None:
    rows = [{"step": s, "sft/loss": 3.0 / s, "sft/grad_norm": 1.0, "sft/lr": 1e-3} for s in range(1, 30)]
    rows[-1]["sft/val_loss"] = 0.5
    _write_metrics(tmp_path, rows)  # type: ignore[arg-type]
    assert [p.name for p in plot_run(tmp_path)] == ["sft.png"]


def test_metrics_no_plot_draws_are_an_error_not_an_empty_folder(tmp_path: Path) -> None:
    _write_metrics(tmp_path, [{"step": 1, "other/x": 1.0}])
    with pytest.raises(ValueError, match="none of its metrics is one the plots draw"):
        plot_run(tmp_path)


def test_identical_curves_share_one_line_and_validation_keeps_one_quantity_per_axis() -> None:
    from queryrl.trainer.plot import PLOTS, _distinct

    series = {"a": ([1, 2], [0.5, 0.7]), "b": ([1, 2], [0.5, 0.7]), "c": ([1, 2], [0.5, 0.8])}
    assert _distinct(series, ["a", "b", "c"]) == [("a", "a = b"), ("c", "c")]
    validation = next(spec for spec in PLOTS if spec.name == "validation.png")
    keys = ["val/score/mean", "val/response_length/mean", "val/reward/failed", "val/src/recall@5"]
    chosen = [panel.select(keys) for panel in validation.panels]
    assert chosen == [["val/score/mean"], ["val/src/recall@5"], ["val/response_length/mean"], ["val/reward/failed"]]


def test_chinese_metric_names_render_without_missing_glyphs(tmp_path: Path) -> None:
    """A data_source like 销售对话_202506 ends up in the legend; with the set-up's font it has real glyphs.

    ``make`` installs Debian's fonts-noto-cjk where it can and then sets QUERYRL_REQUIRE_CJK_FONT=1: there a
    missing font fails this test instead of skipping it.
    """
    import os
    import warnings

    from queryrl.fonts import cjk_family

    if cjk_family() is None:
        if os.environ.get("QUERYRL_REQUIRE_CJK_FONT") == "1":
            pytest.fail("no Noto Sans CJK font although make installed one (fonts-noto-cjk)")
        pytest.skip("no CJK font here (apt-get install fonts-noto-cjk; make does it where it can)")
    rows = [{"step": s, "val/销售对话_202506/score/mean": 0.1 * s, "critic/score/mean": 0.2} for s in range(1, 5)]
    _write_metrics(tmp_path, rows)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_run(tmp_path)
    assert not [str(w.message) for w in caught if "Glyph" in str(w.message)]
