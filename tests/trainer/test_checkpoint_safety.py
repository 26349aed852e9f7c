"""Runs and checkpoints are never lost and never silently mixed (issue 14, items 6-10).

Kills are real: a ``queryrl train`` subprocess is killed with SIGKILL at a point the test names
(``QUERYRL_CRASH_AT=<point>@<step>``, see :func:`queryrl.trainer.checkpoint.crash_point`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from queryrl.cli import app
from queryrl.errors import CheckpointError, ResumeConfigMismatch, user_error
from queryrl.trainer import checkpoint as ckpt
from queryrl.trainer.loop import Trainer
from tests.helpers import REPO, make_cfg, metrics_of

RUN = "toy_grpo"  # the toy preset's experiment name


def run_dir(tmp_path: Path) -> Path:
    return tmp_path / RUN


def steps_of(tmp_path: Path) -> list[int]:
    return [r["step"] for r in metrics_of(run_dir(tmp_path))]


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# --- 6. a run folder continues only with a matching config ----------------------------------------


def test_resume_refuses_a_different_config_and_keeps_the_old_one(tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=1")).fit()
    saved = (run_dir(tmp_path) / "config.yaml").read_bytes()
    changed = ("actor.lr=0.003", "rollout.n=2", "algo.adv_estimator=rloo")
    with pytest.raises(ResumeConfigMismatch) as caught:
        Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=1", *changed))
    message = str(caught.value)
    assert "\n" not in message
    assert "3 keys differ" in message
    for part in ("actor.lr", "rollout.n 4 -> 2", "algo.adv_estimator 'grpo' -> 'rloo'", "trainer.experiment_name"):
        assert part in message, message
    assert "trainer.resume=disable" in message
    assert "trainer.resume=PATH" in message
    assert (run_dir(tmp_path) / "config.yaml").read_bytes() == saved  # not overwritten by the refused run
    assert user_error(caught.value) == (message, 2)  # the CLI prints it as one line, exit 2


def test_keys_that_do_not_change_training_may_differ(tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=1")).fit()
    allowed = (
        "trainer.total_steps=3",
        "trainer.logger=[jsonl,console]",
        "trainer.keep_last=5",
        "trainer.save_every=1",
        "trainer.eval_every=2",
        "trainer.num_threads=1",
        "trainer.save_samples=2",
    )
    trainer = Trainer(make_cfg(tmp_path, model_cache, *allowed))
    assert trainer.step == 1
    trainer.fit()
    assert steps_of(tmp_path) == [1, 2, 3]


def test_many_differences_are_listed_up_to_eight_then_counted(tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=1")).fit()
    changed = [f"actor.{k}" for k in ("lr=0.002", "weight_decay=0.1", "grad_clip=0.5", "ppo_epochs=2")]
    changed += ["rollout.n=2", "rollout.temperature=0.5", "rollout.top_p=0.9", "trainer.seed=8", "algo.gamma=0.9"]
    changed += ["actor.clip_ratio_low=0.1"]
    with pytest.raises(ResumeConfigMismatch, match=r"10 keys differ: .* and 2 more\);") as caught:
        Trainer(make_cfg(tmp_path, model_cache, *changed))
    assert str(caught.value).count(" -> ") == 8


def test_the_cli_refuses_with_one_line_and_exit_2(tmp_path: Path, model_cache: Path) -> None:
    runner = CliRunner()
    args = ["train", "--config", str(REPO / "configs" / "toy_grpo.yaml"), f"model.cache_dir={model_cache}"]
    args += [f"trainer.output_dir={tmp_path}", "trainer.logger=[jsonl]", "trainer.plot=false", "data.val_files=[]"]
    args += ["trainer.total_steps=1", "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4"]
    assert runner.invoke(app, args).exit_code == 0
    result = runner.invoke(app, [*args, "actor.lr=0.001"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert "actor.lr" in errors[0]
    assert "Traceback" not in result.output


def test_disable_starts_over_and_sets_the_earlier_run_aside(tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=2", "trainer.save_every=1")).fit()
    trainer = Trainer(make_cfg(tmp_path, model_cache, "trainer.resume=disable", "actor.lr=0.002"))
    assert trainer.step == 0
    (previous,) = (run_dir(tmp_path) / "previous").iterdir()
    assert names(previous / "checkpoints") == ["step_1", "step_2"]  # nothing lost
    assert not (run_dir(tmp_path) / "checkpoints").exists()  # nothing an auto resume could mix in later
    assert yaml.safe_load((run_dir(tmp_path) / "config.yaml").read_text())["actor"]["lr"] == 0.002
    trainer.fit(max_steps=1)
    assert steps_of(tmp_path) == [1]


def test_a_folder_without_a_checkpoint_starts_over(tmp_path: Path, model_cache: Path) -> None:
    """A run that stopped before its first checkpoint trained nothing: a new config starts at step 0."""
    folder = run_dir(tmp_path)
    folder.mkdir()
    (folder / "config.yaml").write_text("actor:\n  lr: 0.5\n")
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/score/mean": 0.1}) + "\n")
    trainer = Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=1"))
    assert trainer.step == 0
    (previous,) = (folder / "previous").iterdir()
    assert names(previous) == ["config.yaml", "metrics.jsonl"]
    trainer.fit()
    assert steps_of(tmp_path) == [1]  # the earlier attempt's rows are not mixed in


def test_an_explicit_checkpoint_continues_with_a_new_config(tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=3", "trainer.save_every=1")).fit()
    step2 = run_dir(tmp_path) / "checkpoints" / "step_2"
    trainer = Trainer(
        make_cfg(tmp_path, model_cache, f"trainer.resume={step2}", "actor.lr=0.002", "trainer.total_steps=4")
    )
    assert trainer.step == 2
    # the abandoned step_3 is set aside: a later auto resume cannot pick it up
    assert not (run_dir(tmp_path) / "checkpoints").exists()
    trainer.fit()
    assert names(run_dir(tmp_path) / "checkpoints") == ["step_4"]
    assert Trainer(make_cfg(tmp_path, model_cache, "actor.lr=0.002", "trainer.total_steps=4")).step == 4


# --- 7. manifests, verification and fallback ----------------------------------------------------------


def two_checkpoints(tmp_path: Path, model_cache: Path) -> Path:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=2", "trainer.save_every=1")).fit()
    return run_dir(tmp_path) / "checkpoints"


def test_the_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path, model_cache: Path) -> None:
    step = two_checkpoints(tmp_path, model_cache) / "step_2"
    listed = json.loads((step / "manifest.json").read_text())["files"]
    on_disk = {p.relative_to(step).as_posix() for p in step.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert set(listed) == on_disk
    assert "actor/model.safetensors" in listed
    weights = step / "actor" / "model.safetensors"
    assert listed["actor/model.safetensors"]["size"] == weights.stat().st_size
    assert listed["actor/model.safetensors"]["sha256"] == ckpt.sha256_of(weights)
    assert ckpt.verify(step) is None
    rng = torch.load(step / "rng.pt", weights_only=True)  # plain data: no numpy unpickler needed
    assert set(rng) >= {"python", "numpy", "torch"}


def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = two_checkpoints(tmp_path, model_cache)
    (root / "step_2" / "actor" / "model.safetensors").write_bytes(b"")  # what a full disk leaves
    capsys.readouterr()
    trainer = Trainer(make_cfg(tmp_path, model_cache))
    assert trainer.step == 1
    warned = [line for line in capsys.readouterr().err.splitlines() if "step_2" in line]
    assert len(warned) == 2
    assert "step_2 is damaged (actor/model.safetensors has 0 bytes" in warned[0]
    assert "trying an older one" in warned[0]
    assert "renamed step_2.damaged-" in warned[1]
    assert [p.name for p in ckpt.checkpoint_dirs(root)] == ["step_1"]  # step_2 renamed aside, kept
    assert any(name.startswith("step_2.damaged-") for name in names(root))


def test_a_flipped_byte_is_caught_by_the_hash(tmp_path: Path, model_cache: Path) -> None:
    step = two_checkpoints(tmp_path, model_cache) / "step_2"
    optim = step / "optim.pt"
    data = bytearray(optim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    optim.write_bytes(bytes(data))
    assert ckpt.verify(step) == "optim.pt does not match its sha256 in the manifest"


def test_no_intact_checkpoint_is_one_error_naming_each(tmp_path: Path, model_cache: Path) -> None:
    root = two_checkpoints(tmp_path, model_cache)
    (root / "step_2" / "rng.pt").unlink()
    (root / "step_1" / "state.json").write_text("{}")
    with pytest.raises(CheckpointError) as caught:
        Trainer(make_cfg(tmp_path, model_cache))
    message = str(caught.value)
    assert "step_2: rng.pt is missing" in message
    assert "step_1: state.json has 2 bytes" in message
    assert user_error(caught.value) == (message, 2)


def test_a_checkpoint_without_a_manifest_is_accepted_only_as_legacy_with_a_warning(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = two_checkpoints(tmp_path, model_cache)
    (root / "step_2" / "manifest.json").unlink()
    (root / "step_1" / "manifest.json").unlink()
    (root / "step_2" / "optim.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"step_2: no manifest\.json.*trainer\.resume_legacy=true"):
        Trainer(make_cfg(tmp_path, model_cache))
    capsys.readouterr()
    trainer = Trainer(make_cfg(tmp_path, model_cache, "trainer.resume_legacy=true"))
    assert trainer.step == 1  # an empty file is caught without a manifest too
    err = capsys.readouterr().err
    assert "step_2 is damaged (optim.pt is empty (0 bytes))" in err
    assert "step_1 has no manifest.json" in err


def test_a_deleted_manifest_does_not_hide_changed_weights(tmp_path: Path, model_cache: Path) -> None:
    """The attack: delete manifest.json, flip a byte of the weights; before, the run resumed from them."""
    step = two_checkpoints(tmp_path, model_cache) / "step_2"
    weights = step / "actor" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    (step / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"checkpoint .*step_2 is damaged \(no manifest\.json"):
        Trainer(make_cfg(tmp_path / "other", model_cache, f"trainer.resume={step}"))
    assert Trainer(make_cfg(tmp_path, model_cache)).step == 1  # auto: the newest intact one


def test_a_resume_whose_training_data_changed_is_refused(tmp_path: Path, model_cache: Path) -> None:
    data = tmp_path / "train.jsonl"
    rows = [
        {"data_source": "toy/target_string", "prompt": f"say hello {i}", "reward_model": {"ground_truth": "hello"}}
        for i in range(8)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = (f"data.train_files=[{data}]", "trainer.total_steps=2", "trainer.save_every=1")
    Trainer(make_cfg(tmp_path, model_cache, *train)).fit()
    state = json.loads((run_dir(tmp_path) / "checkpoints" / "step_2" / "state.json").read_text())
    assert state["data"][str(data)]["sha256"] == ckpt.sha256_of(data)
    assert Trainer(make_cfg(tmp_path, model_cache, *train)).step == 2  # the same file: resumes
    data.write_text("".join(json.dumps({**r, "prompt": r["prompt"] + "!"}) + "\n" for r in rows))  # same path
    with pytest.raises(ResumeConfigMismatch) as caught:
        Trainer(make_cfg(tmp_path, model_cache, *train))
    message = str(caught.value)
    assert "\n" not in message
    assert "trained with other data (1 training file differs" in message
    assert str(data) in message
    assert "trainer.resume=disable" in message
    assert "trainer.experiment_name" in message


# --- 8, 9. real kills: while pruning, and around the rename -----------------------------------------


def kill_run(tmp_path: Path, model_cache: Path, crash_at: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``queryrl train`` in a subprocess, SIGKILLed at `crash_at` (``point@step``)."""
    args = [f"trainer.output_dir={tmp_path}", f"model.cache_dir={model_cache}", "trainer.logger=[jsonl,tensorboard]"]
    args += ["trainer.plot=false", "data.val_files=[]", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4"]
    args += ["rollout.n=4", "trainer.save_every=1", "trainer.preflight=false", *overrides]
    env = {**os.environ, "QUERYRL_CRASH_AT": crash_at, "OMP_NUM_THREADS": "1"}
    code = "from queryrl.cli import main; main()"
    toy = str(REPO / "configs" / "toy_grpo.yaml")
    return subprocess.run(
        [sys.executable, "-c", code, "train", "--config", toy, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def tensorboard_steps(tmp_path: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir(tmp_path) / "tensorboard"))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


@pytest.mark.parametrize("point", ["after_rename", "commit"])
@pytest.mark.slow
def test_a_kill_around_the_rename_loses_no_metrics_row_and_duplicates_none(
    tmp_path: Path, model_cache: Path, point: str
) -> None:
    """after_rename: step_2 exists, its row must too. commit: the row is written, step_2 is not: the
    resumed run redoes step 2 and its row replaces the first one."""
    killed = kill_run(tmp_path, model_cache, f"{point}@2", "trainer.total_steps=3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert steps_of(tmp_path) == [1, 2]
    latest = ckpt.latest_checkpoint(run_dir(tmp_path) / "checkpoints")
    assert latest is not None
    assert latest.name == ("step_2" if point == "after_rename" else "step_1")
    done = kill_run(tmp_path, model_cache, "none@0", "trainer.total_steps=3")
    assert done.returncode == 0, done.stderr[-2000:]
    assert steps_of(tmp_path) == [1, 2, 3]
    assert tensorboard_steps(tmp_path, "critic/score/mean") == [1, 2, 3]


@pytest.mark.slow
def test_a_kill_while_pruning_leaves_trash_that_never_counts(tmp_path: Path, model_cache: Path) -> None:
    killed = kill_run(tmp_path, model_cache, "prune@3", "trainer.total_steps=4", "trainer.keep_last=2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    root = run_dir(tmp_path) / "checkpoints"
    trash = [n for n in names(root) if n.startswith(".trash-step_1-")]
    assert len(trash) == 1  # step_1 was renamed before its deletion began
    assert [p.name for p in ckpt.checkpoint_dirs(root)] == ["step_2", "step_3"]
    done = kill_run(tmp_path, model_cache, "none@0", "trainer.total_steps=4", "trainer.keep_last=2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert names(root) == ["step_3", "step_4"]  # trash cleaned on start, keep_last counted right
    assert steps_of(tmp_path) == [1, 2, 3, 4]


def test_leftovers_are_ignored_and_cleaned_on_start(tmp_path: Path, model_cache: Path) -> None:
    root = two_checkpoints(tmp_path, model_cache)
    (root / ".trash-step_7-123").mkdir()
    (root / ".tmp-step_9").mkdir()
    assert ckpt.latest_checkpoint(root) == root / "step_2"
    trainer = Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=3", "trainer.save_every=1"))
    assert trainer.step == 2
    assert names(root) == ["step_1", "step_2"]
    trainer.fit()
    assert names(root) == ["step_2", "step_3"]


# --- 10. durable writes, and loading that cannot run code --------------------------------------------


def test_files_and_folder_are_fsynced_before_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(self: Path, target: Any) -> Path:
        events.append(("rename", str(self)))
        return real_rename(self, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "rename", rename)
    root = tmp_path / "checkpoints"
    optim = {"actor": torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1).state_dict()}
    final = ckpt.write_checkpoint(root, 3, {}, optim, {"loader": {}}, keep_last=0).commit()
    tmp = str(root / ".tmp-step_3")
    at = events.index(("rename", tmp))
    before = {path for kind, path in events[:at] if kind == "fsync"}
    expected = {tmp} | {f"{tmp}/{name}" for name in ("optim.pt", "rng.pt", "state.json", "manifest.json")}
    assert expected <= before
    assert ("fsync", str(root)) in events[at:]  # the rename itself made durable
    assert ckpt.verify(final) is None


class RunsCode:
    """Unpickling this creates a file: what a malicious checkpoint could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_checkpoint_holding_code_is_refused_without_running_it(tmp_path: Path, model_cache: Path) -> None:
    step = two_checkpoints(tmp_path, model_cache) / "step_2"
    marker = tmp_path / "code_ran"
    optim = torch.load(step / "optim.pt", weights_only=True)
    torch.save({**optim, "extra": RunsCode(marker)}, step / "optim.pt")
    (step / "manifest.json").unlink()
    ckpt.write_manifest(step)  # a checkpoint from elsewhere comes with a manifest that matches
    with pytest.raises(CheckpointError, match=r"optim.pt: refused to load: it holds Python objects") as caught:
        Trainer(make_cfg(tmp_path / "other", model_cache, f"trainer.resume={step}"))
    assert not marker.exists()
    assert "\n" not in str(caught.value)
    assert user_error(caught.value) == (str(caught.value), 2)
