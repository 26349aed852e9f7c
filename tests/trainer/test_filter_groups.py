"""DAPO's dynamic sampling (``algo.filter_groups``) and :meth:`Batch.concat`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from queryrl.config import ConfigError
from queryrl.engine.batch import Batch
from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg, metrics_of

# odd prompts: a constant reward (a zero-variance group); even prompts: the response's length
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if extra_info["index"] % 2:
        return 0.5
    return float(len(solution_str))
"""


def test_concat_pads_prompts_left_and_responses_right() -> None:
    a = Batch(
        prompt_ids=torch.tensor([[5, 6]]),
        prompt_mask=torch.tensor([[1, 1]]),
        response_ids=torch.tensor([[7]]),
        response_attention_mask=torch.tensor([[1]]),
        response_mask=torch.tensor([[1.0]]),
        group_ids=torch.tensor([0]),
        non_tensor={"k": ["a"]},
    )
    b = Batch(
        prompt_ids=torch.tensor([[4]]),
        prompt_mask=torch.tensor([[1]]),
        response_ids=torch.tensor([[8, 9, 2]]),
        response_attention_mask=torch.tensor([[1, 1, 1]]),
        response_mask=torch.tensor([[1.0, 1.0, 1.0]]),
        group_ids=torch.tensor([3]),
        non_tensor={"k": ["b"]},
    )
    out = Batch.concat([a, b], pad_id=0)
    assert out.prompt_ids.tolist() == [[5, 6], [0, 4]]
    assert out.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert out.response_ids.tolist() == [[7, 0, 0], [8, 9, 2]]
    assert out.response_mask.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert out.group_ids.tolist() == [0, 3]
    assert out.non_tensor["k"] == ["a", "b"]
    with pytest.raises(ValueError, match="some batches only"):
        Batch.concat([a, Batch(**{**b.__dict__, "token_scores": torch.zeros(1, 3)})], pad_id=0)


@pytest.mark.slow
def test_dynamic_sampling_trains_on_informative_groups_only(tmp_path: Path, model_cache: Path) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    cfg = make_cfg(
        tmp_path,
        model_cache,
        f"reward.function.path={reward}",
        "algo.filter_groups.enable=true",
        "algo.filter_groups.max_num_gen_batches=6",
        "trainer.total_steps=1",
        "trainer.save_samples=64",
        "data.shuffle=false",
    )
    with Trainer(cfg) as trainer:
        last = trainer.fit()
    assert last["filter_groups/num_groups"] == 4.0
    assert last["filter_groups/num_gen_batches"] >= 2.0  # half of every round is uninformative
    assert last["reward/zero_std_group_frac"] == pytest.approx(0.5)
    samples = [json.loads(x) for x in (tmp_path / "toy_grpo" / "samples" / "step_1.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 4
    by_group: dict[int, list[float]] = {}
    for s in samples:
        by_group.setdefault(s["group"], []).append(s["score"])
    assert len(by_group) == 4
    assert all(len(set(scores)) > 1 for scores in by_group.values())
    assert metrics_of(tmp_path / "toy_grpo")[-1]["step"] == 1


def test_filter_groups_refuses_seed_hybrid(tmp_path: Path, model_cache: Path) -> None:
    with pytest.raises(ConfigError, match="filter_groups"):
        make_cfg(
            tmp_path,
            model_cache,
            "algo.filter_groups.enable=true",
            "app.query_rewrite.reward_mode=seed_hybrid",
            "app.query_rewrite.enable=true",
            "app.query_rewrite.seed_hybrid.group_size=4",
        )
