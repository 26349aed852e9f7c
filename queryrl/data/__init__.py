"""Data: records -> prompts (verl-layout files, chat templates, a resumable mixing loader, GSM8K)."""

from queryrl.data.gsm8k import prepare_gsm8k
from queryrl.data.loader import PromptLoader
from queryrl.data.prompts import PromptDataset, PromptItem, build_prompt_dataset, encode_prompt, prompt_text
from queryrl.data.records import DataError, check_record, line_byte_limit, load_records

__all__ = [
    "DataError",
    "PromptDataset",
    "PromptItem",
    "PromptLoader",
    "build_prompt_dataset",
    "check_record",
    "encode_prompt",
    "line_byte_limit",
    "load_records",
    "prepare_gsm8k",
    "prompt_text",
]
