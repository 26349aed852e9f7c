"""Mixed precision: bf16 compute over fp32 master weights and AdamW state, against pure bf16 and fp32.

The tiny model trained three AdamW steps at lr 1e-6 (the users' full fine-tuning lr): in pure
bf16 almost every weight stays where it was (the update is far below half a bf16 ulp of the
weight); with ``model.compute_dtype=bfloat16`` over float32 parameters every weight moves, as in
float32, and the loss is float32's within bf16 rounding.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from queryrl.config import ConfigError, load_config
from queryrl.engine.batch import Batch
from queryrl.engine.optim import make_optimizer
from queryrl.engine.policy import forward_logprobs
from queryrl.models import load_policy
from queryrl.models.loading import PolicyBundle, compute_dtype

PRECISIONS = {
    "fp32": ["model.dtype=float32"],
    "bf16-pure": ["model.dtype=bfloat16"],
    "bf16-mixed": ["model.dtype=float32", "model.compute_dtype=bfloat16"],
}


def load(model_cache: Path, precision: str, *extra: str) -> PolicyBundle:
    cfg = load_config(None, [f"model.cache_dir={model_cache}", *PRECISIONS[precision], *extra])
    return load_policy(cfg.model, torch.device("cpu"), None, need_ref=True)


def random_batch(vocab: int, n: int = 4, p: int = 6, t: int = 10) -> Batch:
    gen = torch.Generator().manual_seed(0)
    return Batch(
        prompt_ids=torch.randint(3, vocab, (n, p), generator=gen),
        prompt_mask=torch.ones(n, p, dtype=torch.long),
        response_ids=torch.randint(3, vocab, (n, t), generator=gen),
        response_attention_mask=torch.ones(n, t, dtype=torch.long),
        response_mask=torch.ones(n, t),
        group_ids=torch.arange(n),
    )


def nll(model: nn.Module, batch: Batch) -> torch.Tensor:
    logprobs, _ = forward_logprobs(model, batch, temperature=1.0, with_entropy=False)
    return -(logprobs * batch.response_mask).sum() / batch.response_mask.sum()


def train(
    bundle: PolicyBundle, batch: Batch, steps: int = 3, lr: float = 1e-6
) -> tuple[float, list[float], torch.optim.Optimizer]:
    """Fraction of the trainable weights that changed after `steps` AdamW steps, the losses seen, the optimizer."""
    model = bundle.model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer, _ = make_optimizer(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.999), warmup_steps=0, total_steps=1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nll(model, batch)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(params, before, strict=True))
    return changed / sum(p.numel() for p in params), losses, optimizer


@pytest.fixture(scope="module")
def batch(model_cache: Path) -> Batch:
    bundle = load(model_cache, "fp32")
    return random_batch(int(bundle.model.config.vocab_size))  # type: ignore[union-attr,arg-type]


def test_pure_bf16_loses_most_updates_and_warns(model_cache: Path, batch: Batch) -> None:
    bundle = load(model_cache, "bf16-pure")
    assert {p.dtype for p in bundle.model.parameters()} == {torch.bfloat16}
    with pytest.warns(UserWarning, match="model.compute_dtype=bfloat16"):
        changed, _, _ = train(bundle, batch)
    assert changed < 0.10, f"{changed:.1%} of the bf16 weights changed"


def test_mixed_precision_keeps_the_updates(model_cache: Path, batch: Batch) -> None:
    bundle = load(model_cache, "bf16-mixed")
    assert {p.dtype for p in bundle.model.parameters()} == {torch.float32}  # the master weights
    assert compute_dtype(bundle.model) == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no low-precision warning: nothing is trained in bf16
        changed, _, optimizer = train(bundle, batch)
    assert changed > 0.95, f"only {changed:.1%} of the weights changed"
    grads = {p.grad.dtype for p in bundle.model.parameters() if p.grad is not None}
    moments = {v.dtype for state in optimizer.state.values() for k, v in state.items() if k.startswith("exp_avg")}
    assert grads == moments == {torch.float32}


def test_mixed_precision_computes_in_bf16(model_cache: Path, batch: Batch) -> None:
    """The forward really runs in bf16 (not fp32 under another name): the logits come out bf16 and
    differ from fp32's by bf16 rounding, not by nothing."""
    from queryrl.engine.policy import response_logits

    mixed, fp32 = load(model_cache, "bf16-mixed"), load(model_cache, "fp32")
    with torch.no_grad():
        a, b = response_logits(mixed.model, batch, 1.0), response_logits(fp32.model, batch, 1.0)
    assert a.dtype == torch.bfloat16
    assert b.dtype == torch.float32
    diff = float((a.float() - b).abs().max())
    assert 0 < diff < 0.1, diff


def test_mixed_loss_is_close_to_fp32(model_cache: Path, batch: Batch) -> None:
    """Same losses over three steps (to bf16 rounding of the logits), and both move the weights alike."""
    _, fp32_losses, _ = train(load(model_cache, "fp32"), batch, lr=1e-3)
    _, mixed_losses, _ = train(load(model_cache, "bf16-mixed"), batch, lr=1e-3)
    torch.testing.assert_close(torch.tensor(mixed_losses), torch.tensor(fp32_losses), atol=5e-3, rtol=0)
    assert fp32_losses[-1] < fp32_losses[0]
    assert mixed_losses[-1] < mixed_losses[0]


def test_the_reference_runs_like_the_policy_at_step_0(model_cache: Path, batch: Batch) -> None:
    """The frozen reference is a float32 copy under the same autocast: log-probs equal at step 0 (no fake KL)."""
    bundle = load(model_cache, "bf16-mixed")
    assert bundle.ref_model is not None
    assert compute_dtype(bundle.ref_model) == torch.bfloat16
    with torch.no_grad(), bundle.reference() as ref:
        assert torch.equal(nll(ref, batch), nll(bundle.model, batch))


def test_lora_adapters_are_fp32_over_a_bf16_base(model_cache: Path) -> None:
    """peft's default, relied on: the trained adapters (and so their AdamW state) are fp32, no warning."""
    bundle = load(model_cache, "bf16-pure", "model.lora.rank=4")
    trained = {p.dtype for p in bundle.model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in bundle.model.parameters() if not p.requires_grad}
    assert (trained, frozen) == ({torch.float32}, {torch.bfloat16})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_optimizer(bundle.model.parameters(), 1e-5, 0.0, (0.9, 0.999), 0, 1)


def test_frozen_lora_base_stored_in_the_compute_dtype_changes_no_number(model_cache: Path, batch: Batch) -> None:
    """Mixed precision with LoRA (the trainer's load): the frozen projections are stored in bf16, so autocast
    uses them without a per-forward cast; the log-probs and the adapters' gradients are the same bit for bit,
    the adapters stay float32, the embeddings and norms keep their dtype, and the LM head tied to the embeddings
    gets a bf16 copy of its own (the embeddings unchanged)."""
    cfg = load_config(None, [f"model.cache_dir={model_cache}", *PRECISIONS["bf16-mixed"], "model.lora.rank=4"])
    results = []
    for frozen in (False, True):
        torch.manual_seed(0)
        bundle = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False, frozen_in_compute_dtype=frozen)
        model = bundle.model.train()
        with torch.no_grad():  # non-zero adapters, so that they matter
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(len(name)))
        loss = nll(model, batch)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        dtypes = {n: p.dtype for n, p in model.named_parameters()}
        results.append((loss.detach(), grads, dtypes))
    (plain_loss, plain_grads, plain_dtypes), (loss, grads, dtypes) = results
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain_grads.keys()
    assert grads
    assert all(torch.equal(grads[n], plain_grads[n]) for n in grads)
    assert set(plain_dtypes.values()) == {torch.float32}
    assert {dtypes[n] for n in grads} == {torch.float32}  # the adapters, and so their AdamW moments
    cast = {n for n, d in dtypes.items() if d == torch.bfloat16}
    assert cast
    assert all(
        "base_layer" in n
        or n.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "lm_head.weight"))
        for n in cast
    )
    assert any(n.endswith("lm_head.weight") for n in cast)
    assert not any("embed" in n or "norm" in n for n in cast)
    assert not any(n.endswith("lm_head.weight") for n in plain_dtypes)  # tied without the copy: one tensor, listed once


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["model.dtype=bfloat16", "model.compute_dtype=float32"], "model.dtype=float32 model.compute_dtype=bfloat16"),
        (["model.dtype=float32", "model.compute_dtype=float16"], "loss scaling"),
        (["model.compute_dtype=int8"], "model.compute_dtype='int8' is not one of"),
    ],
)
def test_unsupported_precisions_are_refused(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


@pytest.mark.parametrize("overrides", [["model.compute_dtype=bfloat16", "model.dtype=bfloat16"], []])
def test_compute_dtype_equal_to_dtype_is_no_autocast(overrides: list[str], model_cache: Path) -> None:
    cfg: Any = load_config(None, [f"model.cache_dir={model_cache}", *overrides])
    bundle = load_policy(cfg.model, torch.device("cpu"), None, need_ref=False)
    assert compute_dtype(bundle.model) is None


def test_memory_estimate_of_mixed_precision_by_hand() -> None:
    """Qwen3-8B (8,190,735,360 parameters) over 2 FSDP ranks, KL reference, vLLM colocated."""
    from queryrl.trainer.plan import estimate_memory

    p = 8_190_735_360
    est = estimate_memory(p, "float32", compute_dtype="bfloat16", shards=2, need_ref=True, vllm=True)
    assert est.parts == {
        "master weights (float32)": 16_381_470_720,  # 4p / 2
        "gradients (float32)": 16_381_470_720,
        "AdamW moments (float32)": 32_762_941_440,  # 8p / 2
        "reference (float32)": 16_381_470_720,
        "bfloat16 compute copy (forward/backward)": 16_381_470_720,  # 2p, gathered: not sharded
        "vLLM weights": 32_762_941_440,  # in the parameters' dtype
    }
    # compute_dtype equal to dtype changes nothing
    assert estimate_memory(p, "float32", compute_dtype="float32") == estimate_memory(p, "float32")


def test_dry_run_plan_names_the_mixed_precision(model_cache: Path) -> None:
    from queryrl.trainer.plan import build_plan

    cfg = load_config(None, [f"model.cache_dir={model_cache}", *PRECISIONS["bf16-mixed"]])
    text = build_plan(cfg).render()
    assert "compute bfloat16 (mixed precision: float32 master weights and AdamW state)" in text
    assert "bfloat16 compute copy" in text


def test_grpo_and_ppo_run_in_mixed_precision(tmp_path: Path, model_cache: Path) -> None:
    """The trainer end to end (rollout, old/ref log-probs, KL loss, GAE critic, update): the actor and the
    critic stay float32 and move, the step-0 KL is exactly 0, every metric is finite."""
    from queryrl.trainer.loop import Trainer
    from tests.helpers import make_cfg, metrics_of, params

    cfg = make_cfg(
        tmp_path,
        model_cache,
        *PRECISIONS["bf16-mixed"],
        "actor.use_kl_loss=true",
        "algo.adv_estimator=gae",
        "critic.warmup_steps=0",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no low-precision warning
        trainer = Trainer(cfg)
    assert trainer.c.critic is not None
    before = params(trainer.c.policy.model)
    trainer.fit()
    after = params(trainer.c.policy.model)
    assert {v.dtype for v in after.values()} == {torch.float32}
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert {p.dtype for p in trainer.c.critic.parameters()} == {torch.float32}
    rows = metrics_of(tmp_path / cfg.trainer.experiment_name)
    assert rows[0]["actor/kl_loss"] == 0.0
    for row in rows:
        assert all(v == v and abs(v) != float("inf") for v in row.values() if isinstance(v, float)), row


def test_a_lora_run_in_mixed_precision_trains_the_fp32_adapters_and_exports_fp32(
    tmp_path: Path, model_cache: Path
) -> None:
    """The trainer's policy stores its frozen LoRA base in bf16 (no per-forward cast), its adapters train in
    float32, and the exported model merges them into the float32 base, as before the lever."""
    from queryrl.trainer.export import export_checkpoint
    from queryrl.trainer.loop import Trainer
    from tests.helpers import make_cfg, params

    cfg = make_cfg(tmp_path, model_cache, *PRECISIONS["bf16-mixed"], "model.lora.rank=4", "actor.lr=1e-3")
    with Trainer(cfg) as trainer:
        model = trainer.c.policy.model
        frozen = {p.dtype for p in model.parameters() if not p.requires_grad and p.dim() == 2}
        assert torch.bfloat16 in frozen
        before = {k: v for k, v in params(model).items() if "lora_" in k}
        trainer.fit()
        after = {k: v for k, v in params(model).items() if "lora_" in k}
    assert {v.dtype for v in after.values()} == {torch.float32}
    assert any(not torch.equal(before[k], after[k]) for k in before)
    out = export_checkpoint(tmp_path / cfg.trainer.experiment_name, tmp_path / "exported")
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert {p.dtype for p in exported.parameters()} == {torch.float32}
    bundle = load_policy(load_config(None, [f"model.cache_dir={model_cache}"]).model, torch.device("cpu"), None, False)
    base = dict(bundle.model.named_parameters())
    q = "model.layers.0.self_attn.q_proj"
    a, b = (after[f"base_model.model.{q}.lora_{x}.default.weight"] for x in "AB")
    expected = base[f"{q}.weight"].detach() + cfg.model.lora.alpha / cfg.model.lora.rank * (b @ a)
    merged = dict(exported.named_parameters())[f"{q}.weight"].detach()
    assert not torch.equal(merged, base[f"{q}.weight"])
    torch.testing.assert_close(merged, expected, rtol=0, atol=1e-6)  # a bf16 base would be off by ~1e-3


@pytest.mark.gpu
def test_one_gpu_fsdp_run_in_mixed_precision(tmp_path: Path, model_cache: Path) -> None:
    """FSDP's MixedPrecision on a GPU worker (bf16 compute, fp32 flat parameters and reduction): the
    update reaches the driver's float32 policy."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'queryrl[ray]')")
    from queryrl.trainer.loop import Trainer
    from tests.helpers import make_cfg

    overrides = ["trainer.backend=ray", "trainer.n_gpus_per_node=1", "ray.use_gpu=true", "ray.fsdp=true"]
    cfg = make_cfg(tmp_path, model_cache, *PRECISIONS["bf16-mixed"], *overrides)
    with Trainer(cfg) as trainer:
        before = {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters()}
        metrics = trainer.fit()
        after = dict(trainer.c.policy.model.named_parameters())
        moved = max((v - before[k]).abs().max().item() for k, v in after.items())
        assert {v.dtype for v in after.values()} == {torch.float32}
    assert moved > 0
    assert metrics["actor/grad_norm"] > 0
