"""Supervised fine-tuning on the tiny model: learning, label masking, invariance, errors, output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.config import load_config
from queryrl.data import DataError, encode_prompt
from queryrl.trainer import sft as sft_module
from queryrl.trainer.sft import accumulate_gradients, build_sft_data, run_sft, train_sft
from queryrl.trainer.sft_batch import IGNORE_INDEX, collate
from tests.helpers import PROMPTS, TARGET, make_sft_cfg, write_sft_rows


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


@pytest.mark.slow
def test_the_tiny_model_learns_a_fixed_target(tmp_path: Path, model_cache: Path) -> None:
    data = write_sft_rows(tmp_path / "train.jsonl")
    cfg = make_sft_cfg(tmp_path, model_cache, data, "sft.lr=5e-3", "sft.max_steps=30", f"sft.val_files=[{data}]")
    result = train_sft(cfg)
    assert result.steps == 30
    assert result.losses[-1] < result.losses[0] / 10, result.losses
    assert result.val_loss is not None
    assert result.val_loss < result.losses[0] / 10
    out = tmp_path / "out"
    assert result.output_dir == out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert {"sft/loss", "sft/lr", "sft/grad_norm", "sft/tokens"} <= set(rows[0])
    assert "sft/val_loss" in rows[-1]
    assert rows[0]["sft/tokens"] == 4 * (len(encode_tokens(out, TARGET)) + 1)
    assert (out / "sft_config.yaml").is_file()
    assert (out / "plots" / "sft.png").read_bytes()[:4] == b"\x89PNG"  # the curves, drawn at the end

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    prompt = torch.tensor([encode_prompt(tokenizer, [{"role": "user", "content": PROMPTS[1]}])])
    with torch.no_grad():
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    reply = generated[0, prompt.shape[1] :].tolist()
    assert reply[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(reply, skip_special_tokens=True) == TARGET


def encode_tokens(folder: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(folder)(text, add_special_tokens=False)["input_ids"])


def test_labels_mask_the_prompt_and_the_padding(tmp_path: Path, tiny_bundle: Any) -> None:
    tokenizer = tiny_bundle.tokenizer
    data = write_sft_rows(tmp_path / "train.jsonl", prompts=["Hi", "A much longer prompt than the other one."])
    built = build_sft_data([str(data)], tokenizer, "extra_info.sft_target", 64, 16)
    short, long_ = built.examples
    target_ids = [*tokenizer(TARGET, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    assert short.prompt_ids == encode_prompt(tokenizer, [{"role": "user", "content": "Hi"}])  # the RL prompt
    assert short.target_ids == target_ids
    batch = collate([short, long_], tokenizer.pad_token_id)
    p, t = len(short.prompt_ids), len(short.target_ids)
    width = len(long_.prompt_ids) + len(long_.target_ids)
    assert batch["labels"].shape == (2, width)
    pad = width - p - t  # left padding: every target ends in the last column
    for j in range(width):  # token by token: only the target carries a label
        label, token, attended, position = (
            int(batch[k][0, j]) for k in ("labels", "input_ids", "attention_mask", "position_ids")
        )
        if j < pad:
            assert (label, token, attended, position) == (IGNORE_INDEX, tokenizer.pad_token_id, 0, 0), j
        elif j < pad + p:
            assert (label, token, attended, position) == (IGNORE_INDEX, short.prompt_ids[j - pad], 1, j - pad), j
        else:
            k = j - pad - p
            assert (label, token, attended, position) == (target_ids[k], target_ids[k], 1, p + k), j
    assert batch["position_ids"][1].tolist() == list(range(width))  # the longest row has no padding

    # And the gradient agrees: the logits that predict prompt tokens (and the EOS position's,
    # which predicts nothing) get none; every logit that predicts a target token gets some.
    from queryrl.trainer.sft_batch import sum_target_loss

    policy = tiny_bundle.model
    captured: list[torch.Tensor] = []

    def keep_grad(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
        output.retain_grad()
        captured.append(output)

    handle = policy.get_output_embeddings().register_forward_hook(keep_grad)
    try:
        loss, n = sum_target_loss(policy, collate([short], tokenizer.pad_token_id), torch.device("cpu"))
        loss.backward()
    finally:
        handle.remove()
        policy.zero_grad(set_to_none=True)
    assert n == t
    grad = captured[0].grad
    assert grad is not None
    # only positions p - 1 .. p + t - 1 reach the LM head (the prompt's logits are never computed)
    assert grad.shape[1] == t + 1
    has_grad = [bool(torch.count_nonzero(grad[0, j])) for j in range(t + 1)]
    assert has_grad == [True] * t + [False]


def test_micro_batch_size_does_not_change_the_update(tmp_path: Path, model_cache: Path, tiny_bundle: Any) -> None:
    prompts = ["Hi", "Say hello to the whole world now.", "Greet me.", "What is 3 + 4?"]
    data = write_sft_rows(tmp_path / "train.jsonl", prompts=prompts)
    built = build_sft_data([str(data)], tiny_bundle.tokenizer, "extra_info.sft_target", 64, 16)
    grads = []
    for micro in (1, 4, 3):
        model = tiny_bundle.model
        model.zero_grad(set_to_none=True)
        loss, tokens = accumulate_gradients(
            model, built.examples, micro, tiny_bundle.tokenizer.pad_token_id, torch.device("cpu")
        )
        grads.append(({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, loss, tokens))
        model.zero_grad(set_to_none=True)
    for other, loss, tokens in grads[1:]:
        assert tokens == grads[0][2]
        assert loss == pytest.approx(grads[0][1], abs=1e-6)
        for k, g in grads[0][0].items():
            torch.testing.assert_close(other[k], g, atol=1e-6, rtol=1e-5)

    after = []
    for micro in (1, 4):
        out = tmp_path / f"out{micro}"
        cfg = make_sft_cfg(
            tmp_path, model_cache, data, f"sft.micro_batch_size={micro}", "sft.max_steps=1", "sft.lr=1e-4"
        )
        cfg.sft.output_dir = str(out)
        train_sft(cfg)
        from transformers import AutoModelForCausalLM

        after.append(params(AutoModelForCausalLM.from_pretrained(out)))
    assert any(not torch.equal(after[0][k], v) for k, v in params(tiny_bundle.model).items() if k in after[0])
    for k, v in after[0].items():
        torch.testing.assert_close(after[1][k], v, atol=1e-6, rtol=0)


def test_micro_batches_are_cut_from_length_sorted_examples(tmp_path: Path, tiny_bundle: Any) -> None:
    """Long and short sequences interleaved: each micro-batch of 2 pads to its own pair's length."""
    prompts = ["Say hello to the whole world now, please, all of it.", "Hi", "Greet everyone here today, now.", "Yo"]
    data = write_sft_rows(tmp_path / "train.jsonl", prompts=prompts)
    built = build_sft_data([str(data)], tiny_bundle.tokenizer, "extra_info.sft_target", 64, 16)
    lengths = [len(e.prompt_ids) + len(e.target_ids) for e in built.examples]
    widths: list[int] = []
    handle = tiny_bundle.model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _out: widths.append(args[0].shape[1])
    )
    try:
        accumulate_gradients(
            tiny_bundle.model, built.examples, 2, tiny_bundle.tokenizer.pad_token_id, torch.device("cpu")
        )
    finally:
        handle.remove()
        tiny_bundle.model.zero_grad(set_to_none=True)
    ordered = sorted(lengths)
    assert widths == [ordered[1], ordered[3]]  # in the given order it would be max(l0, l1), max(l2, l3)
    assert widths != [max(lengths[:2]), max(lengths[2:])]


def test_a_missing_target_names_the_row_and_the_key(tmp_path: Path, model_cache: Path) -> None:
    data = write_sft_rows(tmp_path / "train.jsonl", bad_row=2)
    cfg = make_sft_cfg(tmp_path, model_cache, data, "sft.max_steps=1")
    with pytest.raises(DataError, match=r"train\.jsonl: row 2: field 'extra_info\.sft_target': missing"):
        run_sft(cfg)
    write_sft_rows(data, target=7)
    with pytest.raises(DataError, match=r"row 0: field 'extra_info\.sft_target'.*must be a string, got int"):
        run_sft(cfg)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out*"))


def test_overlong_prompts_are_filtered_and_long_targets_truncated(tmp_path: Path, tiny_bundle: Any) -> None:
    data = write_sft_rows(tmp_path / "train.jsonl", prompts=["Hi", "word " * 40], target="hello world " * 10)
    built = build_sft_data([str(data)], tiny_bundle.tokenizer, "extra_info.sft_target", 24, 5)
    assert built.num_filtered == 1
    assert built.num_truncated == 1
    assert [len(e.target_ids) for e in built.examples] == [5]
    assert built.examples[0].index == 0


def test_lora_run_saves_a_merged_folder(tmp_path: Path, model_cache: Path) -> None:
    data = write_sft_rows(tmp_path / "train.jsonl")
    cfg = make_sft_cfg(tmp_path, model_cache, data, "model.lora.rank=4", "sft.max_steps=2", "sft.lr=1e-2")
    out = run_sft(cfg)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in k for k in model.state_dict()), "LoRA must be merged"
    base = load_config(None, [f"model.cache_dir={model_cache}"])
    from queryrl.models import load_policy

    original = load_policy(base.model, torch.device("cpu"), None, need_ref=False).model
    trained = dict(model.named_parameters())
    changed = [k for k, v in original.named_parameters() if not torch.equal(trained[k], v)]
    assert changed
    assert all("proj" in k for k in changed)


def test_cli_sft_end_to_end(tmp_path: Path, model_cache: Path) -> None:
    data = write_sft_rows(tmp_path / "train.jsonl")
    args = [
        "sft",
        f"model.cache_dir={model_cache}",
        f"data.train_files=[{data}]",
        f"trainer.output_dir={tmp_path}",
        "trainer.experiment_name=exp",
        "trainer.logger=[console,jsonl]",
        "sft.max_steps=2",
        "sft.batch_size=2",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = tmp_path / "exp" / "sft"
    assert f"done: {out} (final loss " in result.output
    assert "step 2/2" in result.output
    assert (out / "config.json").is_file()
    machine = json.loads((out / "machine.json").read_text(encoding="utf-8"))  # what the steps ran on, said once
    assert machine["matmul_gflops"]["float32"] > 0
    assert result.output.count(f"machine: {machine['cpu']}, {machine['capability']}, ") == 1
    # the RL trainer's config takes the folder as model.path
    from queryrl.models import load_policy

    cfg = load_config(None, [f"model.path={out}"])
    assert load_policy(cfg.model, torch.device("cpu"), None, need_ref=False).tokenizer.eos_token == "<|im_end|>"

    bad = CliRunner().invoke(app, ["sft", "sft.batch_size=0", f"data.train_files=[{data}]"])
    assert bad.exit_code == 2
    assert "sft.batch_size" in bad.output
    write_sft_rows(data, bad_row=1)
    bad = CliRunner().invoke(app, args)
    assert bad.exit_code == 2
    assert "row 1" in bad.output
    assert "sft_target" in bad.output


def test_output_is_replaced_only_when_complete(
    tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("previous run")
    data = write_sft_rows(tmp_path / "train.jsonl")
    cfg = make_sft_cfg(tmp_path, model_cache, data, "sft.max_steps=1")

    def broken_save(*args: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(sft_module, "_save_model", broken_save)
    with pytest.raises(RuntimeError, match="disk full"):
        run_sft(cfg)
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]  # the old folder is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "train.jsonl"]  # no temporary left

    monkeypatch.undo()
    assert run_sft(cfg) == out
    assert not (out / "old.txt").exists()
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "train.jsonl"]


def test_prompt_loss_weight_adds_the_prompt_tokens_mean_loss(tmp_path: Path, tiny_bundle: Any) -> None:
    prompts = ["Hi", "Say hello to the whole world now.", "Greet me.", "What is 3 + 4?"]
    data = write_sft_rows(tmp_path / "train.jsonl", prompts=prompts)
    built = build_sft_data([str(data)], tiny_bundle.tokenizer, "extra_info.sft_target", 64, 16)
    model, pad, cpu = tiny_bundle.model, tiny_bundle.tokenizer.pad_token_id, torch.device("cpu")

    # by hand: every prompt token after the first, predicted from the ones before it, one mean per batch
    total, count = 0.0, 0
    with torch.no_grad():
        for e in built.examples:
            ids = torch.tensor([e.prompt_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            total -= float(logp.gather(1, ids[0, 1:, None]).sum())
            count += len(e.prompt_ids) - 1

    def grads(weight: float, micro: int) -> tuple[dict[str, torch.Tensor], float, dict[str, float]]:
        model.zero_grad(set_to_none=True)
        stats: dict[str, float] = {}
        loss, _ = accumulate_gradients(model, built.examples, micro, pad, cpu, weight, stats)
        out = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return out, loss, stats

    plain, loss0, stats0 = grads(0.0, 4)
    weighted, loss_w, stats_w = grads(0.5, 4)
    assert stats0 == {}
    assert loss_w == pytest.approx(loss0, abs=1e-6)  # the reported loss stays the target tokens' alone
    assert stats_w["sft/prompt_loss"] == pytest.approx(total / count, rel=1e-5)
    assert any(not torch.allclose(weighted[k], g) for k, g in plain.items())
    for k, g in grads(0.5, 3)[0].items():  # micro-batches share the batch's normalisers
        torch.testing.assert_close(g, weighted[k], atol=1e-6, rtol=1e-5)


def test_negative_prompt_loss_weight_is_refused(tmp_path: Path, model_cache: Path) -> None:
    data = write_sft_rows(tmp_path / "train.jsonl")
    with pytest.raises(sft_module.ConfigError, match=r"sft\.prompt_loss_weight"):
        train_sft(make_sft_cfg(tmp_path, model_cache, data, "sft.prompt_loss_weight=-1"))


def test_batch_schedule_walks_each_epoch_in_slices_and_keeps_the_last_small_batch() -> None:
    from queryrl.trainer.sft import batch_schedule, epoch_order

    plain = list(batch_schedule(5, 2, 6, seed=0, shuffle=False))
    assert plain == [(1, 0, [0, 1]), (2, 0, [2, 3]), (3, 0, [4]), (4, 1, [0, 1]), (5, 1, [2, 3]), (6, 1, [4])]
    shuffled = list(batch_schedule(5, 2, 4, seed=3, shuffle=True))
    assert [i for _, e, b in shuffled if e == 0 for i in b] == epoch_order(5, 3, 0, True)  # epoch 0, in order
    assert shuffled[3][1:] == (1, epoch_order(5, 3, 1, True)[:2])  # then epoch 1's own order
