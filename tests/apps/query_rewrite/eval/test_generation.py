"""``queryrl eval``'s model replies: prompts run shortest first, replies come back in file order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig

from queryrl.apps.query_rewrite.eval.generation import generate_replies
from queryrl.apps.query_rewrite.eval.samples import load_samples
from queryrl.rollout.base import SamplingParams


@pytest.mark.slow
def test_replies_are_in_file_order_and_batches_by_length(
    tiny_cfg: DictConfig, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 3 of 9 prompts of different lengths run shortest first; each prompt gets the reply made
    for it (the reply text here names the prompt's length) and the one it gets alone."""
    import queryrl.trainer.scoring as scoring
    from queryrl.data.prompts import encode_prompt
    from queryrl.models.loading import load_tokenizer, resolve_model_path

    tiny = resolve_model_path(tiny_cfg.model)
    prompts = [s.prompt for s in load_samples("builtin://sales_demo/test", 9, str(model_cache))]
    lengths = [len(encode_prompt(load_tokenizer(tiny_cfg.model), list(p))) for p in prompts]
    assert len(set(lengths)) > 3
    assert lengths != sorted(lengths)
    params = SamplingParams(do_sample=False, max_new_tokens=6)
    alone = [generate_replies(tiny, [p], params, batch_size=1, device="cpu")[0] for p in prompts]

    batches: list[list[int]] = []
    decode = scoring.decode_responses

    def named(tokenizer: Any, chunk: Any) -> list[str]:
        batches.append(chunk.prompt_mask.sum(-1).tolist())
        return [f"{n}:{text}" for n, text in zip(batches[-1], decode(tokenizer, chunk), strict=True)]

    monkeypatch.setattr(scoring, "decode_responses", named)
    together = generate_replies(tiny, prompts, params, batch_size=3, device="cpu")
    assert together == [[f"{n}:{a}"] for n, (a,) in zip(lengths, alone, strict=True)]
    assert [len(b) for b in batches] == [3, 3, 3]
    assert [n for b in batches for n in b] == sorted(lengths)
