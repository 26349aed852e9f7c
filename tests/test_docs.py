"""The documentation: README stays a front door, the site builds, and what the pages name still exists.

- README.md is at most 250 lines and links only to pages and files that exist;
- ``mkdocs build --strict`` builds the site from ``docs/`` (a broken link between pages fails it);
- ``docs/configuration.md`` is what ``tools/config_reference.py`` writes from the schema today;
- every ``queryrl <command>``, ``make <target>`` and config key (``key.sub=value`` or a whole key in an
  inline code span) written in README or a page names a command, target or key that exists.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROOTS = ("model", "data", "rollout", "algo", "actor", "critic", "reward", "sft", "app", "trainer", "ray")
VERL_ROOTS = ("actor_rollout_ref", "algorithm", "custom_reward_function")
TYPO_EXAMPLES = {"actor_rollout_ref.rollout.nn"}  # docs/your-data.md shows what a mistyped key gets
KEY = re.compile(rf"(?<![\w./$-])((?:{'|'.join(ROOTS + VERL_ROOTS)})(?:\.[a-z_][a-z0-9_]*)+)(=|$)")


def code_of(text: str) -> Iterator[str]:
    """The fenced blocks and inline code spans of Markdown `text`."""
    fenced = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    yield from (m.group(1) for m in fenced.finditer(text))
    for m in re.finditer(r"`([^`\n]+)`", fenced.sub("", text)):
        yield m.group(1)


def schema_keys() -> tuple[set[str], set[str]]:
    """(every key of the schema with the installed applications' nodes, the keys whose values are free dicts)."""
    from omegaconf import DictConfig, OmegaConf

    from queryrl.config.schema import build_schema

    keys: set[str] = set()
    free: set[str] = set()

    def walk(node: Any, prefix: str) -> None:
        for k in node:
            key = f"{prefix}{k}"
            keys.add(key)
            value = node._get_node(k)
            if isinstance(value, DictConfig):
                if OmegaConf.get_type(value) is dict:
                    free.add(key)
                walk(value, key + ".")

    walk(build_schema(), "")
    return keys, free


def test_readme_is_a_front_door() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250, "README.md grew past 250 lines: move the detail to a page of docs/"
    for target in re.findall(r"\]\((?!https?://)([^)#]+)", text):
        assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra (make installs it)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "What has run where" in home  # the home page is README's text (tools/mkdocs_hooks.py)
    assert (tmp_path / "site" / "configuration.html").is_file()


def test_the_configuration_page_follows_the_schema() -> None:
    proc = subprocess.run(
        [sys.executable, "tools/config_reference.py", "--check"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_commands_targets_and_keys_the_pages_name_exist() -> None:
    import typer

    from queryrl.cli import app
    from queryrl.config import ConfigError
    from queryrl.config.aliases import translate_key

    group: Any = typer.main.get_command(app)
    commands = set(group.commands)
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    keys, free = schema_keys()
    problems: list[str] = []
    for page in PAGES:
        name = page.relative_to(REPO)
        for code in code_of(page.read_text(encoding="utf-8")):
            for command in re.findall(r"(?<![\w/.-])queryrl ([a-z][a-z0-9-]*)", code):
                if command not in commands:
                    problems.append(f"{name}: `queryrl {command}` is not a command")
            for target in re.findall(r"(?<![\w/.-])make ([a-z][\w-]*\w)(?![\w*-])", code):
                if target not in targets:
                    problems.append(f"{name}: `make {target}` is not a Makefile target")
            for token in code.split():
                m = KEY.match(token.strip("`,;:()[]'\"+"))
                if m is None or (m.group(2) != "=" and token.strip("`") != code.strip()):
                    continue  # an override, or a span that is one key; not a word of a sentence
                key = m.group(1)
                if key in TYPO_EXAMPLES:
                    continue
                if (REPO / "queryrl" / key.replace(".", "/")).is_dir() or (
                    REPO / "queryrl" / (key.replace(".", "/") + ".py")
                ).is_file():
                    continue  # a module (`trainer.plan`), not a key
                try:
                    ours = translate_key(key)
                except ConfigError as e:  # a verl key the docs say has no meaning here
                    ours = str(e)
                if ours not in keys and not any(ours.startswith(f + ".") for f in free):
                    problems.append(f"{name}: `{key}` is not a config key")
    assert not problems, "\n".join(sorted(set(problems)))
