"""queryrl.plugins: "file.py:function" and "pkg.module:function" load one way, and every error names the spec."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from queryrl.plugins import PluginError, file_module_name, import_file, load_callable

FILE = """
import json

def shout(text):
    return text.upper()

LIMIT = 3
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_builtin_name_comes_first() -> None:
    def mine() -> str:
        return "builtin"

    assert load_callable("mine", what="judge", builtins={"mine": mine}) is mine


def test_file_and_module_specs(tmp_path: Path) -> None:
    file = _write(tmp_path / "tools.py", FILE)
    assert load_callable(f"{file}:shout", what="tool")("hi") == "HI"
    assert load_callable("json:dumps", what="tool") is json.dumps


def test_a_relative_file_is_looked_up_beside_base_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "config" / "tools.py", FILE)
    _write(tmp_path / "tools.py", "def shout(text):\n    return 'from the current folder'\n")
    monkeypatch.chdir(tmp_path)
    assert load_callable("tools.py:shout", what="tool", base=tmp_path / "config")("a") == "A"
    assert load_callable("tools.py:shout", what="tool", base=tmp_path / "elsewhere")("a") == "from the current folder"


def test_a_file_gets_a_module_of_its_own(tmp_path: Path) -> None:
    a = _write(tmp_path / "a" / "reward.py", "def f():\n    return 1\n")
    b = _write(tmp_path / "b" / "reward.py", "def f():\n    return 2\n")
    fa, fb = load_callable(f"{a}:f", what="reward"), load_callable(f"{b}:f", what="reward")
    assert (fa(), fb()) == (1, 2)
    assert fa.__module__ == file_module_name(a.resolve()) != fb.__module__
    assert sys.modules[fa.__module__].__file__ == str(a.resolve())


@pytest.mark.parametrize("spec", ["shout", "tools.py:", ":shout", ""])
def test_not_a_spec(spec: str) -> None:
    with pytest.raises(PluginError, match=rf"^unknown judge '{spec}': use a built-in \(constant, length\), 'path"):
        load_callable(spec, what="judge", builtins={"length": len, "constant": len})
    with pytest.raises(PluginError, match=rf"^unknown tool '{spec}': use 'path/to/file\.py:function' or 'package"):
        load_callable(spec, what="tool")


def test_missing_file(tmp_path: Path) -> None:
    for target in (f"{tmp_path}/missing.py", f"{tmp_path}/no_suffix/here"):  # a path, not a dotted module name
        with pytest.raises(PluginError, match=rf"^judge '{target}:f': file '{target}' not found \(looked at /"):
            load_callable(f"{target}:f", what="judge")


def test_a_file_that_fails_to_import_carries_the_original_error(tmp_path: Path) -> None:
    _write(tmp_path / "broken.py", "def f(:\n")
    with pytest.raises(PluginError, match=r"^reward 'broken\.py:f': file '.*broken\.py' failed to import: SyntaxError"):
        load_callable("broken.py:f", what="reward", base=tmp_path)
    assert not any(name.startswith("queryrl_reward_broken_") for name in sys.modules)


def test_missing_module_names_the_missing_part() -> None:
    with pytest.raises(PluginError, match=r"cannot import module 'queryrl\.nope\.deeper': .* module 'queryrl\.nope'"):
        load_callable("queryrl.nope.deeper:f", what="tool")


def test_a_module_that_fails_to_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "needs_more.py", "import not_a_module_anyone_has\n")
    _write(tmp_path / "raises.py", "raise RuntimeError('no config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"module 'needs_more' failed to import: ModuleNotFoundError: .*anyone_has"):
        load_callable("needs_more:f", what="tool")
    with pytest.raises(
        PluginError, match=r"^tool 'raises:f': module 'raises' failed to import: RuntimeError: no config"
    ):
        load_callable("raises:f", what="tool")


def test_missing_function_lists_what_there_is(tmp_path: Path) -> None:
    file = _write(tmp_path / "tools.py", FILE)
    with pytest.raises(
        PluginError, match=r"file '.*tools\.py' has no 'shot'; callables it defines: shout; set x\.name$"
    ):
        load_callable(f"{file}:shot", what="tool", hint="set x.name")
    with pytest.raises(
        PluginError, match=r"^tool 'json:nope': module 'json' has no 'nope'; callables it defines: .*dumps"
    ):
        load_callable("json:nope", what="tool")


def test_an_attribute_that_is_not_callable(tmp_path: Path) -> None:
    file = _write(tmp_path / "tools.py", FILE)
    with pytest.raises(PluginError, match=r"'LIMIT' in file '.*tools\.py' is a int, not a function"):
        load_callable(f"{file}:LIMIT", what="tool")


def test_import_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PluginError, match=r"^agent plugin file '.*nope\.py' not found$"):
        import_file(tmp_path / "nope.py", "agent plugin file")
    text = _write(tmp_path / "plugin.txt", FILE)
    with pytest.raises(PluginError, match=r"plugin\.txt' cannot be imported: it must be a \.py file"):
        import_file(text, "agent plugin file")
    assert issubclass(PluginError, ValueError)  # callers that catch ValueError (serve-judge) keep working
