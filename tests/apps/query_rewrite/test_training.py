"""The query-rewrite application inside the trainer: the real-model path (a model folder, an external
RAG service over HTTP, an OpenAI-compatible judge), failure handling, and the users' hybrid mode."""

from __future__ import annotations

import json
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from queryrl.apps.query_rewrite.config import settings_of
from queryrl.apps.query_rewrite.demo.data import sales_demo_corpus
from queryrl.apps.query_rewrite.training import make_selector
from queryrl.config import ConfigError, load_config
from queryrl.rag import BM25Index, Document, HeuristicRewriter
from queryrl.rag import make_app as make_rag_app
from queryrl.rollout import RolloutOutput
from queryrl.testing.judge_server import make_app as make_judge_app
from queryrl.testing.judge_server import running_server
from queryrl.trainer.loop import Trainer
from queryrl.trainer.skips import NothingTrained
from tests.apps.query_rewrite.helpers import pronoun_rows
from tests.helpers import small_run

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "configs" / "query_rewrite_demo.yaml"
SECRET = "sk-test-0123456789abcdef"


def demo_overrides(tmp_path: Path, model_cache: Path, *extra: str) -> list[str]:
    """The demo preset shrunk to 2 fast steps over `few_rows` (given in `extra` where data is needed)."""
    return [*small_run(tmp_path, model_cache), "trainer.total_steps=2", *extra]


def trained_cfg(tmp_path: Path, model_cache: Path, json_model: Path, few_rows: Path, *extra: str) -> DictConfig:
    """The shrunk demo preset starting from `json_model` and training on `few_rows`."""
    return load_config(
        DEMO,
        demo_overrides(tmp_path, model_cache, f"model.path={json_model}", f"data.train_files=[{few_rows}]", *extra),
    )


@pytest.fixture(scope="module")
def few_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 pronoun turns of the sales demo as a JSONL file: the training data of these tests (and the rows
    ``json_model``, tests/apps/query_rewrite/conftest.py, was fine-tuned on)."""
    path = tmp_path_factory.mktemp("data") / "few.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in pronoun_rows()))
    return path


def _verdict(better: str, s8: float, s32: float) -> str:
    def side(total: float) -> dict[str, float]:
        return {"quality": total * 0.4, "relevance": total * 0.2, "completeness": total * 0.2, "retrieval": total * 0.2}

    return json.dumps({"better": better, "score": {"8b": {**side(s8), "sum": s8}, "32b": {**side(s32), "sum": s32}}})


@pytest.fixture(scope="module")
def rag_service() -> Iterator[tuple[str, Any]]:
    """A real HTTP RAG service (FastAPI on loopback) over the sales demo catalogue."""
    docs = [Document(d["doc_id"], d["title"], d["content"]) for d in sales_demo_corpus()]
    app = make_rag_app(BM25Index(docs), HeuristicRewriter(), top_k=5)
    with running_server(app) as url:
        yield url.removesuffix("/v1"), app.state.requests


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_real_model_path_external_rag_and_openai_judge(
    tmp_path: Path,
    model_cache: Path,
    json_model: Path,
    few_rows: Path,
    rag_service: tuple[str, Any],
    monkeypatch: Any,
) -> None:
    """What a user with a real model does: model.path, rag.url and an OpenAI-compatible judge."""
    rag_url, rag_requests = rag_service
    monkeypatch.setenv("QUERYRL_TEST_JUDGE_KEY", SECRET)
    judged: list[str] = []

    def judge(messages: list[dict[str, Any]]) -> str:
        judged.append(messages[-1]["content"])
        return _verdict("8b", 36.0, 30.0) if len(judged) % 2 else _verdict("32b", 20.0, 30.0)

    before = dict(rag_requests)
    with running_server(make_judge_app(judge)) as judge_url:
        cfg = trained_cfg(
            tmp_path,
            model_cache,
            json_model,
            few_rows,
            f"app.query_rewrite.rag.url={rag_url}",
            "app.query_rewrite.reward_mode=group_judge",
            "app.query_rewrite.judge.backend=openai",
            f"app.query_rewrite.judge.base_url={judge_url}",
            "app.query_rewrite.judge.model=queryrl-judge",
            "app.query_rewrite.judge.api_key_env=QUERYRL_TEST_JUDGE_KEY",
        )
        with Trainer(cfg) as trainer:
            last = trainer.fit()
    rows = _metrics(tmp_path / "demo")
    assert [r["step"] for r in rows] == [1, 2]
    assert judged, "the judge server got no request"
    assert sum(rag_requests.values()) > sum(before.values()), "the RAG service got no request"
    assert last["reward/failed"] == 0.0
    assert sum(r["rag/calls"] for r in rows) > 0
    assert sum(r["judge/requests"] for r in rows) >= len(judged) > 0
    assert "reward/quality/mean" in last
    # the samples show what a person checks: both sides' documents with gold marked, the judge's verdict
    samples = [json.loads(x) for x in (tmp_path / "demo" / "samples" / "step_2.jsonl").read_text().splitlines()]
    judged_samples = [s for s in samples if "judge_verdict" in s.get("reward_info", {})]
    assert judged_samples, "no sample reached the judge"
    for sample in judged_samples:
        info = sample["reward_info"]
        assert info["judge_verdict"]["better"] in ("candidate", "reference")
        assert info["judge_verdict"]["candidate"]["sum"] in (36.0, 20.0)
        gold = set(sample["ground_truth"]["gold_doc_ids"])
        for side in ("candidate_documents", "reference_documents"):
            assert all(d["gold"] == (d["doc_id"] in gold) for d in info[side])
        assert any(d["gold"] for d in info["reference_documents"])  # the heuristic reference finds these
    # the key reached the judge server only: not the logs, the saved config or the samples
    run = tmp_path / "demo"
    for path in run.rglob("*"):
        if path.is_file() and path.suffix in {".yaml", ".jsonl", ".json", ".txt"}:
            assert SECRET not in path.read_text(errors="ignore"), path


@pytest.mark.slow
def test_rag_down_fails_the_samples_and_skips_the_step(
    tmp_path: Path, model_cache: Path, json_model: Path, few_rows: Path
) -> None:
    cfg = trained_cfg(
        tmp_path,
        model_cache,
        json_model,
        few_rows,
        f"app.query_rewrite.rag.url=http://127.0.0.1:{_closed_port()}",
        "app.query_rewrite.rag.timeout_s=2",
        "app.query_rewrite.rag.max_retries=0",
        "reward.max_retries=0",
        "reward.max_failed_frac=0.0",  # any failed sample skips the step
    )
    with Trainer(cfg) as trainer, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = {k: v.detach().clone() for k, v in trainer.c.policy.model.named_parameters()}
        try:
            trainer.fit()
        except NothingTrained:  # every step skipped: the run ends non-zero (test_nothing_trained.py)
            assert trainer.updated_steps == 0
        after = dict(trainer.c.policy.model.named_parameters())
    rows = _metrics(tmp_path / "demo")
    assert [r["step"] for r in rows] == [1, 2]  # training went on
    parsed = [r for r in rows if r["reward/failed"] > 0]
    assert parsed, "no sample reached the RAG service (the model did not answer in JSON)"
    assert all(r["reward/step_skipped"] == 1.0 and r["reward/failed_frac"] > 0 for r in parsed)
    assert all("reward/step_skipped" not in r for r in rows if r["reward/failed"] == 0)
    assert any("max_failed_frac" in str(w.message) for w in caught)
    # a skipped step's samples are kept, the failed ones with the RAG error
    skipped = next(r["step"] for r in parsed)
    samples = [
        json.loads(x) for x in (tmp_path / "demo" / "samples" / f"step_{skipped}.jsonl").read_text().splitlines()
    ]
    assert any(s.get("failed") and "RAG /rag/" in s["error"] for s in samples)
    if len(parsed) == len(rows):  # every step skipped: no update at all
        assert all(torch.equal(before[k], after[k].detach()) for k in before)


def test_seed_launch_keys_select_seed_hybrid() -> None:
    overrides = [
        "+algorithm.hybrid_grpo_gpt5.enable=true",
        "+algorithm.hybrid_grpo_gpt5.group_size=5",
        "+algorithm.hybrid_grpo_gpt5.gpt5_weight=0.85",
        "+algorithm.hybrid_grpo_gpt5.grpo_weight=0.15",
        "+algorithm.hybrid_grpo_gpt5.selection_method=max_log_prob",
        "actor_rollout_ref.rollout.n=5",
    ]
    cfg = load_config(DEMO, overrides)
    qr = cfg.app.query_rewrite
    assert qr.enable
    assert qr.reward_mode == "seed_hybrid"
    settings = settings_of(cfg)
    assert settings.reward_mode == "seed_hybrid"
    assert (settings.seed_hybrid.gpt5_weight, settings.seed_hybrid.grpo_weight) == (0.85, 0.15)
    with pytest.raises(ConfigError, match=r"group_size=5 must equal rollout\.n=4"):
        load_config(DEMO, [*overrides[:-1], "rollout.n=4"])
    with pytest.raises(ConfigError, match=r"sum to 1|must be 1"):
        load_config(DEMO, [*overrides[:3], "+algorithm.hybrid_grpo_gpt5.grpo_weight=0.2", overrides[-1]])


def test_seed_hybrid_selector_picks_by_log_prob_z_score() -> None:
    cfg = load_config(
        DEMO, ["app.query_rewrite.reward_mode=seed_hybrid", "app.query_rewrite.seed_hybrid.group_size=4", "rollout.n=4"]
    )
    select = make_selector(cfg)
    assert select is not None
    n, t = 8, 3
    logprobs = torch.tensor([[-1.0, -1.0, 0.0], [-0.1, -0.1, 0.0], [-3.0, 0.0, 0.0], [-2.0, -2.0, -2.0]] * 2)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]] * 2)
    out = RolloutOutput(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        response_ids=torch.ones(n, t, dtype=torch.long),
        response_mask=mask,
        rollout_logprobs=logprobs * mask,
        prompt_index=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
        truncated=torch.zeros(n, dtype=torch.bool),
    )
    rows, extras = select(out)
    assert rows.tolist() == [1, 5]  # the most likely candidate of each group (-0.2)
    seq = torch.tensor([-2.0, -0.2, -3.0, -6.0], dtype=torch.float64)
    z = (seq - seq.mean()) / seq.std(unbiased=False)
    assert extras[0]["seed_hybrid_z"] == pytest.approx(float(z[1]))
    assert extras[1]["seed_hybrid_z"] == pytest.approx(float(z[1]))


@pytest.mark.slow
def test_seed_hybrid_trains_on_the_selected_candidates_only(
    tmp_path: Path, model_cache: Path, json_model: Path, few_rows: Path
) -> None:
    cfg = trained_cfg(
        tmp_path,
        model_cache,
        json_model,
        few_rows,
        "trainer.total_steps=1",
        "app.query_rewrite.reward_mode=seed_hybrid",
        "app.query_rewrite.seed_hybrid.group_size=4",
        "trainer.save_samples=64",
    )
    with Trainer(cfg) as trainer:
        last = trainer.fit()
    samples = [json.loads(x) for x in (tmp_path / "demo" / "samples" / "step_1.jsonl").read_text().splitlines()]
    assert len(samples) == 4  # one selected candidate per prompt, not 4 x 4
    assert len({s["group"] for s in samples}) == 4
    assert "reward/selected_z/mean" in last
    assert last["reward/selected_z/mean"] >= 0.0  # max_log_prob picks the group's most likely: z >= 0


def test_grpo_reference_trains_with_the_reference_s_score_from_the_reward(
    tmp_path: Path, model_cache: Path, json_model: Path, few_rows: Path
) -> None:
    """``algo.adv_estimator=grpo_reference`` turns the reward's ``reference_score`` on and steps with it: the
    step logs it beside the samples' own score and updates the policy."""
    cfg = trained_cfg(tmp_path, model_cache, json_model, few_rows, "trainer.total_steps=1",
                      "algo.adv_estimator=grpo_reference", "trainer.save_samples=64")  # fmt: skip
    assert settings_of(cfg).reference_score
    with Trainer(cfg) as trainer:
        last = trainer.fit()
    # judge 0.5 x [-1, 1], rank 1.0 x [0, 2], format 0.2 x [0, 1], less the intent penalty (1) where it applies
    assert -1.5 <= last["reward/reference_score/mean"] <= 2.7
    assert last["critic/advantages/max"] > last["critic/advantages/min"]
    samples = [json.loads(x) for x in (tmp_path / "demo" / "samples" / "step_1.jsonl").read_text().splitlines()]
    for group in {s["group"] for s in samples}:  # one reference score a prompt, whatever its samples wrote
        assert len({s["reward_parts"]["reference_score"] for s in samples if s["group"] == group}) == 1


@pytest.mark.slow
def test_frozen_policy_as_the_reference_rewriter(json_model: Path, few_rows: Path) -> None:
    """``/rag/chat`` with the "policy" rewriter: the model folder's own greedy rewrite is the reference query."""
    import asyncio

    from queryrl.apps.query_rewrite.policy_rewriter import PolicyRewriter
    from queryrl.apps.query_rewrite.prompts import build_messages, parse_rewrite
    from queryrl.rag import InProcessRAG, make_rewriter

    rewriter = make_rewriter("policy", model_path=json_model)
    assert isinstance(rewriter, PolicyRewriter)
    tok, model = rewriter.tokenizer, rewriter.model
    # /rag/chat sends no profile or summary, which the rows' prompts carry: the tiny model, trained on 16
    # rows, does not answer every such prompt in JSON; the first one it does answer is compared
    for line in few_rows.read_text().splitlines():
        row = json.loads(line)
        contexts = row["extra_info"]["contexts"]
        text = tok.apply_chat_template(build_messages(contexts), add_generation_prompt=True, tokenize=False)
        ids = tok(text, return_tensors="pt")
        out = model.generate(**ids, do_sample=False, max_new_tokens=64, pad_token_id=tok.pad_token_id)
        expected = parse_rewrite(tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
        if expected is not None:
            break
    assert expected is not None, "the SFT'd model did not answer any training prompt in JSON"
    query = rewriter.rewrite_sync(contexts)
    assert query == expected.rewritten_query
    docs = [Document(d["doc_id"], d["title"], d["content"]) for d in sales_demo_corpus()]
    rag = InProcessRAG(BM25Index(docs), rewriter, top_k=5)
    ids = {k: row["extra_info"][k] for k in ("tenant_id", "contact_id", "account_id", "message_id")}
    answer = asyncio.run(rag.chat(contexts=contexts, **ids))
    assert answer["rewritten_query"] == query
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model folder"):
        PolicyRewriter(few_rows.parent)
