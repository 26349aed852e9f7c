"""GSM8K JSON lines -> verl's parquet, row for row as verl's ``examples/data_preprocess/gsm8k.py``.

Input lines are ``{"question": str, "answer": str}`` with the final answer after ``#### ``.
Each output row::

    data_source   "openai/gsm8k"
    prompt        [{"role": "user", "content": question + " " + INSTRUCTION}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": final answer, commas removed}
    extra_info    {"split": split, "index": i, "answer": full answer, "question": question}
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from queryrl.atomic import atomic_path
from queryrl.data.records import DataError, iter_json_lines

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")  # verl's extract_solution


def extract_solution(answer: str) -> str | None:
    """The final answer after ``#### `` with commas removed (verl's rule), or None."""
    match = _FINAL_ANSWER.search(answer)
    return match.group(1).replace(",", "") if match else None


def gsm8k_row(question: str, answer: str, split: str, index: int) -> dict[str, Any]:
    """One verl row from a GSM8K question and its worked answer.

    Raises:
        ValueError: the answer has no ``#### <number>`` final answer.
    """
    solution = extract_solution(answer)
    if solution is None:
        raise ValueError("no final answer of the form '#### <number>' in 'answer'")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def _read_gsm8k(path: Path, split: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for line_no, value in iter_json_lines(path):
        where = f"{path}: line {line_no}"
        if not isinstance(value, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(value).__name__}")
        for key in ("question", "answer"):
            if not isinstance(value.get(key), str):
                got = "missing" if key not in value else f"a {type(value[key]).__name__}"
                raise DataError(f"{where}: field {key!r}: a string is required, got {got}")
        try:
            rows.append(gsm8k_row(value["question"], value["answer"], split, len(rows)))
        except ValueError as exc:
            raise DataError(f"{where}: field 'answer': {exc}") from None
    return rows


def prepare_gsm8k(input_path: str | Path, out_dir: str | Path, split: str | None = None) -> Path:
    """Convert a GSM8K JSON-lines file to ``out_dir/{split}.parquet`` in verl's format.

    The parquet is written under a temporary name in ``out_dir`` and renamed, so a crash never
    leaves a partial file behind.

    Args:
        input_path: GSM8K JSON lines (``{"question", "answer"}`` per line).
        out_dir: the output folder (created if needed).
        split: the split name written in ``extra_info`` and the file name; default: the
            input file's stem (``test.jsonl`` -> ``test``).

    Returns:
        The written parquet file.

    Raises:
        DataError: a missing input file or a bad line (invalid JSON, missing field, no
            ``####`` final answer), naming the file and the line.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    input_path = Path(input_path)
    if not input_path.is_file():
        raise DataError(f"{input_path}: file not found")
    split = split or input_path.stem
    if not split or "/" in split or os.sep in split:
        raise ValueError(f"split must be a plain file name, got {split!r}")
    rows = _read_gsm8k(input_path, split)
    if not rows:
        raise DataError(f"{input_path}: no GSM8K rows")
    out = Path(out_dir) / f"{split}.parquet"
    with atomic_path(out) as tmp:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
    return out
