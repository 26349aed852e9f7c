"""Flat groups in plain sight (issue 50): the run page's first line says which share of the run's groups had no
reward spread (``reward/zero_std_group_frac``, the mean over the steps) against the goal of at most 30 %."""

from __future__ import annotations

import json
from pathlib import Path

from queryrl.report import write_report


def _run(folder: Path, flat: list[float | None]) -> Path:
    folder.mkdir()
    rows = [
        {"step": k + 1, "critic/score/mean": 0.5, **({} if f is None else {"reward/zero_std_group_frac": f})}
        for k, f in enumerate(flat)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return folder


def _line(page: str) -> str:
    return page.split('<p id="flatgroups">')[1].split("</p>")[0]


def test_the_run_page_shows_the_runs_share_of_flat_groups_against_the_goal(tmp_path: Path) -> None:
    page = write_report(_run(tmp_path / "flat", [0.75, 0.5, 0.67, None])).read_text(encoding="utf-8")
    assert _line(page) == (
        "Flat groups: 64 % of the groups over the run (3 steps) had one reward for every sample, so GRPO learnt "
        "nothing from them (goal: at most 30 %, not met)."
    )
    assert page.index('id="flatgroups"') < page.index('id="charts"')  # above the curves
    page = write_report(_run(tmp_path / "signal", [0.25])).read_text(encoding="utf-8")
    assert _line(page).startswith("Flat groups: 25 % of the groups over the run (1 step)")
    assert _line(page).endswith("(goal: at most 30 %, met).")


def test_no_line_without_the_metric(tmp_path: Path) -> None:
    page = write_report(_run(tmp_path / "none", [None, None])).read_text(encoding="utf-8")
    assert "flatgroups" not in page
    assert "@JUDGE@" not in page


def test_the_line_says_how_many_groups_were_one_response_drawn_again(tmp_path: Path) -> None:
    folder = _run(tmp_path / "same", [1.0, 0.5])
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    for row, same in zip(rows, [0.75, 0.25], strict=True):
        row["rollout/identical_group_frac"] = same
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    line = _line(write_report(folder).read_text(encoding="utf-8"))
    assert line.endswith(
        "In 50 % the sampler drew one response for the whole group: no reward can split those, only more varied "
        "samples can."
    )
