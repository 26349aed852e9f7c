"""The config schema: presets, overrides, verl aliases, errors that name the key, redaction."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from queryrl.config import ConfigError, load_config, redacted, save_config
from tests.helpers import SEED_LAUNCH

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs").glob("*.yaml"))


def _required(preset: Path) -> list[str]:
    """Overrides for the values a preset marks ``???`` (a model folder, the user's data, their service)."""
    from omegaconf import OmegaConf

    values = {"model.path": "/models/Qwen3-8B", "data.train_files": "[/data/train.parquet]"}
    return [f"{k}={values.get(k, 'http://127.0.0.1:8000')}" for k in OmegaConf.missing_keys(OmegaConf.load(preset))]


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_every_preset_loads(preset: Path) -> None:
    required = _required(preset)
    if required:  # without them the error names every one of them
        with pytest.raises(ConfigError, match="must be given") as caught:
            load_config(preset)
        assert all(r.split("=")[0] in str(caught.value) for r in required)
    cfg = load_config(preset, required)
    assert cfg.data.train_files, f"{preset.name} trains on nothing"


def test_there_are_presets() -> None:
    assert {"toy_grpo.yaml", "toy_ppo.yaml", "gsm8k_grpo.yaml", "qwen3_8b_2gpu.yaml"} <= {p.name for p in PRESETS}


def test_qwen3_8b_2gpu_preset_is_the_seed_run_on_two_gpus() -> None:
    preset = REPO / "configs" / "qwen3_8b_2gpu.yaml"
    with pytest.raises(ConfigError, match=r"model\.path=\.\.\..*|.*model\.path"):
        load_config(preset, ["data.train_files=[/d/train.parquet]", "app.query_rewrite.rag.url=http://127.0.0.1:1"])
    cfg = load_config(preset, _required(preset))
    assert (cfg.trainer.backend, cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes) == ("ray", 2, 1)
    assert cfg.rollout.backend == "vllm"
    assert (cfg.model.dtype, cfg.model.lora.rank > 0) == ("bfloat16", True)  # bf16 base, fp32 adapters (peft)
    assert (cfg.algo.adv_estimator, cfg.rollout.n, cfg.rollout.temperature, cfg.data.train_batch_size) == (
        "grpo",
        5,
        0.7,
        8,
    )
    qr = cfg.app.query_rewrite
    assert (qr.enable, qr.reward_mode, qr.seed_hybrid.group_size) == (True, "seed_hybrid", 5)
    assert (qr.judge.backend, qr.judge.model, qr.judge.base_url) == ("openai", "gpt-5", "https://api.openai.com/v1")
    assert (qr.judge.timeout_s, cfg.reward.max_concurrency) == (10.0, 8)
    # the launch script's two endpoint URLs instead of rag.url
    seed_rag = [
        "model.path=/m",
        "data.train_files=[/d/train.parquet]",
        "+algorithm.hybrid_grpo_gpt5.rag_endpoint=http://10.0.0.5:8000/chat_8b",
        "+algorithm.hybrid_grpo_gpt5.reference_endpoint=http://10.0.0.5:8000/chat",
    ]
    assert load_config(preset, seed_rag).app.query_rewrite.rag.url == "http://10.0.0.5:8000/{endpoint}"


def test_seed_launch_command_parses_with_verl_keys_mapped() -> None:
    args = shlex.split(SEED_LAUNCH.replace("\\\n", " "))
    assert args[:2] == ["queryrl", "train"]
    # as written: two GPUs on the local backend is an error naming the Ray backend
    with pytest.raises(ConfigError, match=r"trainer\.n_gpus_per_node=2.*trainer\.backend=ray"):
        load_config(None, args[2:])
    cfg = load_config(None, [*args[2:], "trainer.backend=ray"])
    assert cfg.algo.adv_estimator == "grpo"
    assert cfg.algo.norm_adv_by_std is True
    assert cfg.algo.use_kl_in_reward is False
    hybrid = cfg.app.query_rewrite.seed_hybrid
    assert (hybrid.enable, hybrid.group_size, hybrid.gpt5_weight, hybrid.grpo_weight) == (True, 5, 0.85, 0.15)
    assert hybrid.selection_method == "max_log_prob"
    assert cfg.data.train_files == ["/home/jovyan2/query_rl/data/sales_rag/train.parquet"]
    assert cfg.data.train_batch_size == 8
    assert cfg.model.path == "/home/jovyan2/query_rl/model/Qwen3-8B"
    assert (cfg.rollout.n, cfg.rollout.temperature) == (5, 0.7)
    assert cfg.trainer.project_name == "sales_rag_grpo_gpt5_v4"
    assert cfg.trainer.experiment_name == "qwen3_8b_grpo_gpt5_hybrid"
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.total_epochs, cfg.trainer.seed) == (2, 20, 42)
    # nothing of the launch script's services was given: no silent localhost default
    qr = cfg.app.query_rewrite
    assert (qr.rag.url, qr.judge.backend) == (None, "offline")


SEED_YAML_KEYS = [  # the service keys of the users' YAML, as launch-script overrides
    "+algorithm.hybrid_grpo_gpt5.gpt5_model=GPT-5",
    "+algorithm.hybrid_grpo_gpt5.gpt5_batch_size=8",
    "+algorithm.hybrid_grpo_gpt5.gpt5_timeout=10.0",
    "+algorithm.hybrid_grpo_gpt5.rag_endpoint=http://localhost:8000/chat_8b",
    "+algorithm.hybrid_grpo_gpt5.reference_endpoint=http://localhost:8000/chat",
]


def test_seed_service_keys_do_what_their_names_say() -> None:
    cfg = load_config(
        None, ["+algorithm.hybrid_grpo_gpt5.enable=true", "actor_rollout_ref.rollout.n=5", *SEED_YAML_KEYS]
    )
    qr = cfg.app.query_rewrite
    assert qr.rag.url == "http://localhost:8000/{endpoint}"  # the users' paths have no /rag prefix
    assert (qr.judge.backend, qr.judge.model, qr.judge.base_url) == ("openai", "GPT-5", "https://api.openai.com/v1")
    assert qr.judge.api_key_env == "OPENAI_API_KEY"
    assert (qr.judge.timeout_s, cfg.reward.max_concurrency) == (10.0, 8)
    # a judge base URL given by the user is kept
    cfg = load_config(None, [*SEED_YAML_KEYS, "app.query_rewrite.judge.base_url=http://127.0.0.1:9/v1"])
    assert cfg.app.query_rewrite.judge.base_url == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    ("chat_8b", "chat", "url"),
    [
        ("http://localhost:8000/chat_8b", "http://localhost:8000/chat", "http://localhost:8000/{endpoint}"),
        ("http://h:8000/rag/chat_8b", "http://h:8000/rag/chat/", "http://h:8000"),
        ("https://h/api/v2/chat_8b", "https://h/api/v2/chat", "https://h/api/v2/{endpoint}"),
    ],
)
def test_seed_rag_endpoints_become_the_client_url(chat_8b: str, chat: str, url: str) -> None:
    from queryrl.rag.client import endpoint_url

    cfg = load_config(
        None,
        [
            f"+algorithm.hybrid_grpo_gpt5.rag_endpoint={chat_8b}",
            f"+algorithm.hybrid_grpo_gpt5.reference_endpoint={chat}",
        ],
    )
    assert cfg.app.query_rewrite.rag.url == url
    assert endpoint_url(url, "chat_8b") == chat_8b.rstrip("/")
    assert endpoint_url(url, "chat") == chat.rstrip("/")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rag_endpoint=http://a:8000/chat_8b", "reference_endpoint=http://b:8001/chat"], "one service"),
        (["rag_endpoint=http://a:8000/retrieve", "reference_endpoint=http://a:8000/chat"], "<prefix>/chat_8b"),
        (["rag_endpoint=localhost:8000/chat_8b", "reference_endpoint=localhost:8000/chat"], "http"),
        (["rag_endpoint=http://a:8000/chat_8b"], "give both"),
        (["gpt5_batch_size=0"], "gpt5_batch_size"),
    ],
)
def test_seed_service_keys_that_cannot_be_honoured_are_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [f"+algorithm.hybrid_grpo_gpt5.{o}" for o in overrides])


def test_seed_rag_endpoints_and_a_different_rag_url_are_an_error() -> None:
    with pytest.raises(ConfigError, match="contradicts"):
        load_config(None, [*SEED_YAML_KEYS, "app.query_rewrite.rag.url=http://other:1"])


def test_two_gpus_or_nodes_on_the_local_backend_name_the_ray_backend() -> None:
    for override in ("trainer.n_gpus_per_node=2", "trainer.nnodes=2", "actor_rollout_ref.rollout.n=2 trainer.nnodes=3"):
        with pytest.raises(ConfigError, match=r"trainer\.backend=ray"):
            load_config(None, override.split())
    assert load_config(None, ["trainer.n_gpus_per_node=2", "trainer.backend=ray"]).trainer.n_gpus_per_node == 2


def test_a_verl_key_typo_gets_did_you_mean() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["actor_rollout_ref.rollout.nn=5"])
    message = str(caught.value)
    assert "unknown key 'actor_rollout_ref.rollout.nn'" in message
    assert "did you mean actor_rollout_ref.rollout.n" in message
    assert "not in 'QueryRLConfig'" not in message
    with pytest.raises(ConfigError, match=r"did you mean trainer\.total_epochs"):
        load_config(None, ["trainer.total_epoch=3"])


def test_every_bad_key_of_a_command_line_is_in_one_message(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("actor:\n  clip_ratio: 0.2\n")
    bad = [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.nn=5",
        "actor.lr=fast",
        "data.train_batch_size=8",  # a good one among them
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(preset, bad)
    message = str(caught.value)
    assert message.startswith("6 problems in the config:")
    for part in (
        "clip_ratio",
        "tensor_model_parallel_size",
        "use_remove_padding",
        "use_dynamic_bsz",
        "rollout.nn",
        "actor.lr",
    ):
        assert part in message, part
    assert "train_batch_size" not in message


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("actor.lrr=1", "lrr"),
        ("actor.lr=fast", "actor.lr"),
        ("algo.adv_estimator=ppo2", "algo.adv_estimator"),
        ("actor.loss_agg_mode=mean", "actor.loss_agg_mode"),
        ("trainer.logger=[console,neptune]", "trainer.logger"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "tensor_model_parallel_size"),
        ("data.train_weights=[1.0,2.0]", "data.train_weights"),
        ("+algorithm.hybrid_grpo_gpt5.gpt5_weight=0.9", "gpt5_weight"),
        ("rollout.n=0", "rollout.n"),
    ],
)
def test_bad_overrides_name_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_bad_yaml_file_names_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor:\n  lr: 1e-5\n  clip_ratio: 0.2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*clip_ratio"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_yaml_may_use_verl_keys_and_overrides_win(tmp_path: Path) -> None:
    preset = tmp_path / "verl_style.yaml"
    preset.write_text("actor_rollout_ref:\n  actor:\n    optim:\n      lr: 3.0e-6\n  rollout:\n    n: 8\n")
    cfg = load_config(preset, ["rollout.n=2"])
    assert cfg.actor.lr == pytest.approx(3e-6)
    assert cfg.rollout.n == 2


def test_secrets_are_redacted_in_the_saved_config(tmp_path: Path) -> None:
    cfg = load_config(None, ["reward.kwargs.api_key=sk-live-123", "reward.kwargs.api_key_env=OPENAI_API_KEY"])
    assert redacted(cfg)["reward"]["kwargs"] == {"api_key": "***", "api_key_env": "OPENAI_API_KEY"}
    save_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "sk-live-123" not in text
    assert "OPENAI_API_KEY" in text


def test_an_unreadable_override_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"override 'data\.train_files=\[a': bad value"):
        load_config(None, ["data.train_files=[a"])


def test_numeric_settings_out_of_range_are_one_line_naming_every_key() -> None:
    """A negative learning rate reached torch's optimizer before (its ValueError); now the config names it."""
    with pytest.raises(ConfigError, match=r"^actor\.lr must be > 0, got -1\.0$"):
        load_config(None, ["actor.lr=-1"])
    bad = ["actor.lr=0", "algo.gamma=1.5", "actor.clip_ratio_c=1", "rollout.top_p=0", "actor.kl_loss_coef=-0.1"]
    with pytest.raises(ConfigError) as caught:
        load_config(None, [*bad, "model.lora.dropout=nan"])
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("6 settings out of range: ")
    for part in (
        "actor.lr must be > 0, got 0",
        "algo.gamma must be in [0, 1], got 1.5",
        "actor.clip_ratio_c must be > 1, got 1",
        "rollout.top_p must be in (0, 1], got 0",
        "actor.kl_loss_coef must be >= 0, got -0.1",
        "model.lora.dropout must be in [0, 1), got nan",
    ):
        assert part in message
    load_config(None, ["actor.lr=3e-4", "algo.gamma=1", "rollout.top_p=1", "model.lora.dropout=0.05"])  # in range
