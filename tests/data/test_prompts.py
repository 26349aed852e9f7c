"""Prompt encoding through the chat template, and prompt datasets with overlong filtering."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from queryrl.data import DataError, PromptDataset, build_prompt_dataset, encode_prompt, prompt_text

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 3 + 4?"},
]
CHATML = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture
def tokenizer(tiny_bundle: Any) -> Any:
    return tiny_bundle.tokenizer


def test_prompt_text_is_chatml_with_the_generation_prompt(tokenizer: Any) -> None:
    assert prompt_text(tokenizer, MESSAGES) == CHATML


def test_encode_prompt_matches_the_chatml_text(tokenizer: Any) -> None:
    ids = encode_prompt(tokenizer, MESSAGES)
    assert isinstance(ids, list)
    assert all(isinstance(i, int) for i in ids)
    assert ids == tokenizer(CHATML, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == CHATML
    # The template's special tokens are single ids, not spelled out in bytes.
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids.count(im_start) == 3
    assert ids.count(im_end) == 2
    assert ids[0] == im_start


def test_without_a_chat_template_contents_are_joined_by_newlines(tokenizer: Any) -> None:
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    assert prompt_text(plain, MESSAGES) == "You are a helpful assistant.\nWhat is 3 + 4?"
    expected = tokenizer("You are a helpful assistant.\nWhat is 3 + 4?", add_special_tokens=False)["input_ids"]
    assert encode_prompt(plain, MESSAGES) == expected


def test_without_a_chat_template_a_tokenizer_that_adds_bos_gets_it_first(tokenizer: Any) -> None:
    """A base model's tokenizer (Gemma, Llama) adds BOS itself; the prompt, encoded without special tokens
    (a template's own BOS must not be doubled), must still start with it."""
    from tokenizers.processors import TemplateProcessing

    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    bos = "<|im_start|>"
    plain.bos_token = bos
    bos_id = plain.convert_tokens_to_ids(bos)
    assert encode_prompt(plain, MESSAGES)[0] != bos_id  # it does not add BOS yet: nothing is prefixed
    plain.backend_tokenizer.post_processor = TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bos_id)])
    assert plain("x")["input_ids"][0] == bos_id  # now it does
    ids = encode_prompt(plain, MESSAGES)
    assert ids[0] == bos_id
    assert ids.count(bos_id) == 1
    assert ids[1:] == tokenizer("You are a helpful assistant.\nWhat is 3 + 4?", add_special_tokens=False)["input_ids"]
    assert prompt_text(plain, MESSAGES) == bos + "You are a helpful assistant.\nWhat is 3 + 4?"


def _write(path: Path, contents: list[str]) -> Path:
    rows = [
        {"data_source": "t", "prompt": [{"role": "user", "content": c}], "extra_info": {"k": i}}
        for i, c in enumerate(contents)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CONTENTS = ["hi", "hello " * 40, "What is 3 + 4?", "hello " * 80, "ok"]


def test_dataset_encodes_every_row_like_encode_prompt(tmp_path: Path, tokenizer: Any) -> None:
    path = _write(tmp_path / "p.jsonl", CONTENTS)
    ds = build_prompt_dataset(path, tokenizer, max_prompt_length=10_000)
    assert isinstance(ds, PromptDataset)
    assert len(ds) == len(CONTENTS)
    assert ds.num_filtered == 0
    assert ds.path == str(path)
    for i, item in enumerate(ds.items):
        assert item.index == i
        assert item.source == str(path)
        assert item.row["extra_info"] == {"k": i}
        assert item.input_ids == encode_prompt(tokenizer, item.row["prompt"])


def test_overlong_prompts_are_filtered_and_counted(tmp_path: Path, tokenizer: Any) -> None:
    lengths = [len(encode_prompt(tokenizer, [{"role": "user", "content": c}])) for c in CONTENTS]
    limit = sorted(lengths)[2]  # keeps the three shortest, drops the two long ones
    assert lengths[1] > limit
    assert lengths[3] > limit
    path = _write(tmp_path / "p.jsonl", CONTENTS)
    ds = build_prompt_dataset(path, tokenizer, max_prompt_length=limit)
    assert ds.num_filtered == 2
    assert [item.index for item in ds.items] == [0, 2, 4]  # the rows' indices in the file
    assert all(len(item.input_ids) <= limit for item in ds.items)
    # Exactly at the limit is kept.
    at_limit = build_prompt_dataset(path, tokenizer, max_prompt_length=lengths[1])
    assert at_limit.num_filtered == 1
    assert [item.index for item in at_limit.items] == [0, 1, 2, 4]


def test_overlong_prompt_raises_when_not_filtered(tmp_path: Path, tokenizer: Any) -> None:
    lengths = [len(encode_prompt(tokenizer, [{"role": "user", "content": c}])) for c in CONTENTS]
    limit = lengths[1] - 1
    path = _write(tmp_path / "p.jsonl", CONTENTS)
    with pytest.raises(DataError) as info:
        build_prompt_dataset(path, tokenizer, max_prompt_length=limit, filter_overlong=False)
    msg = str(info.value)
    assert str(path) in msg
    assert "row 1" in msg
    assert "field 'prompt'" in msg
    assert f"{lengths[1]} tokens" in msg
    assert f"max_prompt_length={limit}" in msg


def test_all_filtered_gives_an_empty_dataset(tmp_path: Path, tokenizer: Any) -> None:
    ds = build_prompt_dataset(_write(tmp_path / "p.jsonl", CONTENTS), tokenizer, max_prompt_length=1)
    assert len(ds) == 0
    assert ds.num_filtered == len(CONTENTS)


def test_a_failing_chat_template_names_the_row(tmp_path: Path, tokenizer: Any) -> None:
    strict = copy.deepcopy(tokenizer)
    strict.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    path = tmp_path / "p.jsonl"
    rows = [{"data_source": "t", "prompt": "fine"}, {"data_source": "t", "prompt": MESSAGES}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"p\.jsonl: row 1: field 'prompt': the chat template failed.*no system"):
        build_prompt_dataset(path, strict, max_prompt_length=100)


def test_bad_max_prompt_length(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="max_prompt_length"):
        build_prompt_dataset(_write(tmp_path / "p.jsonl", CONTENTS), tokenizer, max_prompt_length=0)


def test_a_huge_jsonl_line_is_dropped_while_reading_in_bounded_memory(tokenizer: Any, tmp_path: Path) -> None:
    """A 50 MB line took 6 min and 6.5 GB before its prompt was filtered; now it is skipped as it is read."""
    import tracemalloc

    from queryrl.data.records import MIN_LINE_BYTES, line_byte_limit

    assert line_byte_limit(16) == MIN_LINE_BYTES
    assert line_byte_limit(1 << 16) == 64 << 16
    path = tmp_path / "huge.jsonl"
    ok = {"data_source": "toy", "prompt": "short"}
    huge = {"data_source": "toy", "prompt": "x" * (12 * MIN_LINE_BYTES)}  # 12 MiB on one line
    path.write_text("\n".join(json.dumps(r) for r in (ok, huge, ok)) + "\n")
    tracemalloc.start()
    try:
        ds = build_prompt_dataset(path, tokenizer, max_prompt_length=64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (len(ds), ds.num_filtered) == (2, 1)  # counted as an overlong prompt, the rows around it kept
    assert peak < 4 * MIN_LINE_BYTES  # the 12 MiB line was never held whole
    with pytest.raises(DataError, match=r"huge\.jsonl: line 2: a line of 12582\d\d\d bytes, over 1048576"):
        build_prompt_dataset(path, tokenizer, max_prompt_length=64, filter_overlong=False)
