"""YAML 1.1 words (off/on/yes/no/true/false/null) stay the text the user wrote for str fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from queryrl.config import ConfigError, load_config


def test_fast_decode_off_on_the_command_line() -> None:
    cfg = load_config(None, ["rollout.fast_decode=off"])
    assert cfg.rollout.fast_decode == "off"


@pytest.mark.parametrize("word", ["off", "on", "yes", "no", "true", "False", "null", "NULL", "~", "disable"])
def test_str_field_keeps_the_word(word: str) -> None:
    cfg = load_config(None, [f"trainer.resume={word}", f"trainer.experiment_name={word}"])
    assert cfg.trainer.resume == word
    assert cfg.trainer.experiment_name == word


@pytest.mark.parametrize("text", ["123", "1e3", "0.50", "0x1f"])
def test_str_field_keeps_numbers_as_written(text: str) -> None:
    assert load_config(None, [f"trainer.experiment_name={text}"]).trainer.experiment_name == text


def test_quoted_and_verl_alias_values() -> None:
    cfg = load_config(None, ["trainer.experiment_name='off'", "trainer.resume_mode=disable"])
    assert cfg.trainer.experiment_name == "off"
    assert cfg.trainer.resume == "disable"


def test_optional_str_null_is_none() -> None:
    cfg = load_config(None, ["model.path=null", "model.compute_dtype=null", "model.tokenizer_path=off"])
    assert cfg.model.path is None
    assert cfg.model.compute_dtype is None
    assert cfg.model.tokenizer_path == "off"


@pytest.mark.parametrize(("word", "expected"), [("off", False), ("on", True), ("yes", True), ("no", False)])
def test_bool_fields_still_parse(word: str, expected: bool) -> None:
    cfg = load_config(None, [f"trainer.plot={word}", f"trainer.save_last={word}"])
    assert cfg.trainer.plot is expected
    assert cfg.trainer.save_last is expected


def test_numbers_still_parse_for_number_fields() -> None:
    cfg = load_config(None, ["actor.lr=1e-5", "trainer.total_steps=7"])
    assert cfg.actor.lr == pytest.approx(1e-5)
    assert cfg.trainer.total_steps == 7


def test_bad_bool_still_refused() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.plot"):
        load_config(None, ["trainer.plot=maybe"])


def test_yaml_file_keeps_the_words(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "rollout:\n  fast_decode: off\ntrainer:\n  resume: no\n  experiment_name: 007\n  plot: off\n"
        "  save_last: no\nmodel:\n  path: null\n  tokenizer_path: 'yes'\n",
        encoding="utf-8",
    )
    cfg = load_config(path)
    assert cfg.rollout.fast_decode == "off"
    assert cfg.trainer.resume == "no"
    assert cfg.trainer.experiment_name == "007"
    assert cfg.trainer.plot is False
    assert cfg.trainer.save_last is False
    assert cfg.model.path is None
    assert cfg.model.tokenizer_path == "yes"
