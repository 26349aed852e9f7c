"""The built-in tiny model: a Qwen2-architecture causal LM with a byte-level BPE tokenizer.

Built once, deterministically, from a bundled corpus into a cache folder (a plain Hugging Face
model folder), so that everything downstream loads it exactly like any ``model.path``. Nothing
is downloaded. The folder name hashes the settings, so changing one builds a new model.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from queryrl.atomic import atomic_dir, readable_as_umask
from queryrl.data.builtin import cache_root

# ChatML, as Qwen2 uses; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# A little English, Chinese, arithmetic and chat so the BPE merges are useful for the demos.
BASE_CORPUS = [
    "Let's think step by step and output the final answer after ####.",
    "The answer is 42. #### 42",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * / = ( ) . , ? !",
    "hello world, hello there, say hello, repeat after me: hello",
    "What is 3 + 4? 3 + 4 = 7. What is 12 * 3? 12 * 3 = 36.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "user assistant system: You are a helpful assistant.",
    "请问这款手机多少钱？这款手机的价格是三千元。它有什么颜色？有黑色和白色。",
    "我想买一台笔记本电脑，预算五千元左右，主要用于办公。那它的电池能用多久？",
    "保修多久？送货需要几天？有没有优惠活动？库存还有吗？比较一下这两款。",
    "北京的故宫需要门票吗？开放时间是几点？附近有什么景点？",
    '{"rewritten_query": "", "user_profile": "", "history_summary": ""}',
]


def _settings(tiny: Any) -> dict[str, Any]:
    return {
        "vocab_size": int(tiny.vocab_size),
        "hidden_size": int(tiny.hidden_size),
        "intermediate_size": int(tiny.intermediate_size),
        "num_hidden_layers": int(tiny.num_hidden_layers),
        "num_attention_heads": int(tiny.num_attention_heads),
        "num_key_value_heads": int(tiny.num_key_value_heads),
        "max_position_embeddings": int(tiny.max_position_embeddings),
        "seed": int(tiny.seed),
        "corpus": [str(x) for x in tiny.corpus],
        "corpus_datasets": [_dataset_fingerprint(str(x)) for x in getattr(tiny, "corpus_datasets", [])],
        "split_cjk": bool(getattr(tiny, "split_cjk", False)),
        "format": 1,  # bump when the construction below changes
    }


def tiny_model_dir(tiny: Any, cache_dir: str | None = None) -> Path:
    """The folder the tiny model with these settings lives in (built or not)."""
    digest = hashlib.sha256(json.dumps(_settings(tiny), sort_keys=True).encode()).hexdigest()[:12]
    return cache_root(cache_dir) / f"tiny-qwen2-{digest}"


def _dataset_fingerprint(name: str) -> str:
    """`name` plus what changes when its text changes: a built-in's version, a file's size and mtime."""
    from queryrl.data.builtin import BUILTIN_VERSIONS, PREFIX

    path = Path(name)
    if not name.startswith(PREFIX) and path.is_file():
        stat = path.stat()
        return f"{name}@{stat.st_size}:{stat.st_mtime_ns}"
    dataset = name.removeprefix(PREFIX).partition("/")[0]
    return f"{name}@v{BUILTIN_VERSIONS.get(dataset, 0)}"


def dataset_text(name: str) -> list[str]:
    """The text of a dataset for tokenizer training: every prompt message and, where present,
    ``extra_info.sft_target``. `name` is a parquet/JSONL file in verl's layout, or a built-in dataset
    (``builtin://NAME/SPLIT`` or ``NAME/SPLIT``)."""
    from queryrl.data.builtin import BUILTIN_DATASETS, PREFIX, builtin_datasets

    if not name.startswith(PREFIX) and Path(name).suffix in {".parquet", ".jsonl", ".json"}:
        from queryrl.data.records import load_records

        rows = load_records(name)
    else:
        dataset, _, split = name.removeprefix(PREFIX).partition("/")
        if dataset not in builtin_datasets():
            known = ", ".join(BUILTIN_DATASETS)
            raise ValueError(f"model.tiny.corpus_datasets: unknown built-in dataset {dataset!r}; known: {known}")
        rows = BUILTIN_DATASETS[dataset](split or "train")
    lines: list[str] = []
    for row in rows:
        lines += [str(m.get("content", "")) for m in row.get("prompt") or []]
        target = (row.get("extra_info") or {}).get("sft_target")
        if isinstance(target, str):
            lines.append(target)
    return lines


def _train_tokenizer(vocab_size: int, corpus: list[str], split_cjk: bool = False) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_cjk:  # CJK ideographs and full-width punctuation: one pre-token (at most one token) each
        cjk = pre_tokenizers.Split(Regex("[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]"), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([cjk, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(tiny: Any, cache_dir: str | None = None) -> Path:
    """Build (once) and return the folder of the tiny model and its tokenizer.

    Args:
        tiny: a ``TinyModelConfig`` (or anything with its fields).
        cache_dir: see :func:`cache_root`.
    """
    out = tiny_model_dir(tiny, cache_dir)
    if (out / "config.json").is_file():
        return out
    started = time.monotonic()  # a status line: training the tokenizer takes a while on a large corpus
    print(f"building the tiny model and its tokenizer (once; cached in {out}) ...", file=sys.stderr, flush=True)
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    settings = _settings(tiny)
    extra = [line for name in getattr(tiny, "corpus_datasets", []) for line in dataset_text(str(name))]
    tokenizer = _train_tokenizer(
        settings["vocab_size"], BASE_CORPUS * 4 + settings["corpus"] + extra, split_cjk=settings["split_cjk"]
    )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=settings["hidden_size"],
        intermediate_size=settings["intermediate_size"],
        num_hidden_layers=settings["num_hidden_layers"],
        num_attention_heads=settings["num_attention_heads"],
        num_key_value_heads=settings["num_key_value_heads"],
        max_position_embeddings=settings["max_position_embeddings"],
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings["seed"])
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    try:
        with atomic_dir(out) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / "queryrl_tiny.json").write_text(json.dumps(settings, ensure_ascii=False, indent=1))
            readable_as_umask(tmp)  # safetensors writes 0600
    except OSError:  # the rename fails when another process built it first: use that one
        if not (out / "config.json").is_file():
            raise
    print(f"built the tiny model in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    return out
