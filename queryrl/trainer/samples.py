"""What ``samples/step_N.jsonl`` holds: a few of each step's rollouts, for a person (and the run page).

One JSON object per line: ``step``, ``group`` (rows of one prompt share it), ``data_source``, ``prompt``
(the decoded prompt, special tokens kept), ``response``, ``ground_truth``, ``score`` (None for a failed
or an unscored sample), and where present ``unscored`` (True where no TRL-style function scored it: it
trained with advantage 0), ``reward_parts`` (the reward's other numbers: judge, format, ...),
``reward_info`` (its other values: the retrieved documents, the judge's verdict, an extracted answer),
``failed`` and ``error`` (a sample whose reward failed: it was dropped from training, and is kept here
so that a person can see why), ``not_trained`` (a scored sample left out with its group, the reason), and
for a multi-turn episode ``rollout`` (its counters) and ``transcript`` (every response token, tool outputs
included). The file is redacted (:func:`queryrl.redaction.redact`) and written atomically.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from queryrl.atomic import atomic_write_text
from queryrl.engine.batch import Batch
from queryrl.redaction import redact

NOT_TRAINED = "not trained: "  # the prefix of a scored sample's reason to be left out (trainer.scoring)


def _column(batch: Batch, key: str, default: Any) -> list[Any]:
    return batch.non_tensor.get(key, [default] * len(batch))


def sample_records(batch: Batch, tokenizer: Any, step: int, limit: int) -> list[dict[str, Any]]:
    """The records of the first `limit` rows of `batch` (see the module doc)."""
    records = []
    scores, errors = _column(batch, "score", None), _column(batch, "reward_error", None)
    parts, info = _column(batch, "reward_parts", {}), _column(batch, "reward_info", {})
    episodes = _column(batch, "rollout_extras", {})
    for i in range(min(limit, len(batch))):
        row = batch.non_tensor["row"][i]
        record: dict[str, Any] = {
            "step": step,
            "group": int(batch.group_ids[i]),
            "data_source": row.get("data_source"),
            "prompt": tokenizer.decode(batch.prompt_ids[i][batch.prompt_mask[i].bool()], skip_special_tokens=False),
            "response": batch.non_tensor["response_text"][i],
            "ground_truth": (row.get("reward_model") or {}).get("ground_truth"),
            "score": None if scores[i] is not None and math.isnan(scores[i]) else scores[i],
        }
        if scores[i] is not None and math.isnan(scores[i]):  # no function scored it (TRL): trained with advantage 0
            record["unscored"] = True
        if parts[i]:
            record["reward_parts"] = parts[i]
        if info[i]:
            record["reward_info"] = info[i]
        if errors[i] is not None and str(errors[i]).startswith(NOT_TRAINED):  # scored, left out with its group
            record["not_trained"] = errors[i]
        elif errors[i] is not None:
            record |= {"failed": True, "error": errors[i]}
        if episodes[i]:  # a multi-turn episode: its counters, and every response token (tool outputs too)
            real = batch.response_ids[i][batch.response_attention_mask[i].bool()]
            record |= {"rollout": episodes[i], "transcript": tokenizer.decode(real, skip_special_tokens=False)}
        records.append(record)
    return records


def write_samples(folder: Path, step: int, records: list[dict[str, Any]]) -> Path:
    """Write `records` to ``folder/step_<step>.jsonl`` (redacted: a secret pasted in a prompt, echoed in
    a reply, does not reach the file)."""
    folder.mkdir(exist_ok=True)
    lines = [json.dumps(r, ensure_ascii=False, default=str) for r in records]
    path = folder / f"step_{step}.jsonl"
    atomic_write_text(path, redact("\n".join(lines) + "\n"))
    return path
