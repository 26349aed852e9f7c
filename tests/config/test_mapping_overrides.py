"""A free-form mapping given whole on the command line (``app.query_rewrite.rag.document_fields={...}``), and
"did you mean" that never suggests the key itself or the same key twice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
MAPPING = "app.query_rewrite.rag.document_fields={doc_id: knowledge_id, title: question, content: answer}"
WANTED = {"doc_id": "knowledge_id", "title": "question", "content": "answer"}


def test_a_mapping_override_sets_document_fields() -> None:
    cfg = load_config(None, [MAPPING])
    assert dict(cfg.app.query_rewrite.rag.document_fields) == WANTED


def test_a_whole_mapping_replaces_the_files_and_one_item_adds_to_it(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("app:\n  query_rewrite:\n    rag:\n      document_fields: {doc_id: id, title: name}\n")
    whole = load_config(preset, ["app.query_rewrite.rag.document_fields={doc_id: knowledge_id}"])
    assert dict(whole.app.query_rewrite.rag.document_fields) == {"doc_id": "knowledge_id"}
    item = load_config(preset, ["app.query_rewrite.rag.document_fields.content=answer"])
    assert dict(item.app.query_rewrite.rag.document_fields) == {"doc_id": "id", "title": "name", "content": "answer"}
    assert dict(load_config(None, ["reward.kwargs={alpha: 1}"]).reward.kwargs) == {"alpha": 1}


def test_a_bad_mapping_override_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"document_fields: unknown field 'doc'"):
        load_config(None, ["app.query_rewrite.rag.document_fields={doc: knowledge_id}"])
    with pytest.raises(ConfigError, match=r"bad key or value app\.query_rewrite\.rag\.document_fields=3"):
        load_config(None, ["app.query_rewrite.rag.document_fields=3"])


def _suggestions(message: str) -> list[str]:
    found = re.search(r"did you mean (.*)\?", message)
    return found.group(1).split(" or ") if found else []


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("data.train_batch_sizee", "data.train_batch_size"),
        ("app.query_rewrite.rag.document_fieldz", "app.query_rewrite.rag.document_fields"),
    ],
)
def test_did_you_mean_never_repeats_nor_names_the_key(given: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, [f"{given}=3"])
    suggestions = _suggestions(str(caught.value))
    assert suggestions[0] == expected
    assert len(suggestions) == len(set(suggestions)), str(caught.value)
    assert given not in suggestions


def test_train_dry_run_takes_a_mapping_override(tmp_path: Path, model_cache: Path) -> None:
    config = str(REPO / "configs" / "query_rewrite_demo.yaml")
    out = f"trainer.output_dir={tmp_path / 'runs'}"
    args = ["train", "--dry-run", "--config", config, out, f"model.cache_dir={model_cache}", MAPPING]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "unknown key" not in result.output
    bad = CliRunner().invoke(app, ["train", "--dry-run", "--config", config, out, "data.train_batch_sizee=3"])
    assert bad.exit_code == 2
    assert "did you mean data.train_batch_size or data.val_batch_size?" in bad.output
