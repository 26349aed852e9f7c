"""The lab notebook stays apart from the product (#53 item 3).

``experiments/`` holds the lever scripts, their results and logs; its README names every script. ``benchmarks/``
holds what users run: no lever folder, no logs, no tracked results under ``benchmarks/results/levers/`` (a running
grid may write new files there until they are moved), and no product code, ``make`` recipe or test runs a script
of the notebook.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--", *paths], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_notebook_is_one_folder_and_benchmarks_holds_none_of_it() -> None:
    assert _tracked("benchmarks/levers", "benchmarks/logs", "benchmarks/results/levers") == []
    assert (EXPERIMENTS / "README.md").is_file()
    assert _tracked("experiments/results"), "the lever results live in experiments/results/"
    assert _tracked("experiments/logs"), "the lever logs live in experiments/logs/"


def test_the_readme_names_every_script_and_log() -> None:
    readme = (EXPERIMENTS / "README.md").read_text(encoding="utf-8")
    named = [p for p in EXPERIMENTS.iterdir() if p.suffix in {".py", ".sh"}]
    named += list((EXPERIMENTS / "logs").glob("*.md"))
    assert named
    missing = [
        p.relative_to(EXPERIMENTS).as_posix() for p in named if p.relative_to(EXPERIMENTS).as_posix() not in readme
    ]
    assert missing == [], f"experiments/README.md says nothing of {missing}"


def test_nothing_of_the_product_runs_a_script_of_the_notebook() -> None:
    script = re.compile(r"experiments/\w+\.(?:py|sh)")
    recipes = [line for line in (REPO / "Makefile").read_text(encoding="utf-8").splitlines() if line.startswith("\t")]
    assert [line for line in recipes if script.search(line)] == []
    for path in _tracked("queryrl", "benchmarks", "tools", "tests"):
        if not path.endswith(".py"):
            continue
        text = (REPO / path).read_text(encoding="utf-8")
        assert not re.search(r"^\s*(?:from|import)\s+experiments\b", text, re.M), path
        if not path.startswith("tests/"):  # the tests read the notebook (its references, this file); nothing else does
            assert not re.search(r"[\"']experiments[\"']", text), f"{path} reaches into experiments/"
