"""``queryrl eval --systems NAME=BASE+ADAPTER[+ADAPTER2]`` (published LoRA adapters merged in order) and
``--data FILE.json`` on a KdConv dialogue file, prepared on the fly as the real-model bench prepares ``KDCONV_TEST``.

The models come from the bench's pipeline, shrunk to the tiny model: SFT with LoRA (the merged warm-up and its
``adapter/``), GRPO with a new LoRA from that merged folder, ``queryrl export`` (merged) and
``queryrl export --adapter-only``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from queryrl.apps.query_rewrite.eval.run import evaluate
from queryrl.apps.query_rewrite.eval.samples import EvalError, parse_systems
from queryrl.cli import app
from queryrl.config import load_config
from queryrl.models.adapters import load_with_adapters
from queryrl.models.loading import resolve_model_path
from tests.helpers import make_cfg

DATA = "builtin://sales_demo/test"
runner = CliRunner()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> dict[str, Path]:
    """base, the warm-up (merged) and its adapter, the GRPO export (merged) and the GRPO adapter."""
    from queryrl.trainer.loop import Trainer

    root = tmp_path_factory.mktemp("adapters")
    base = resolve_model_path(load_config(None, [f"model.cache_dir={model_cache}"]).model)
    rows = root / "sft.jsonl"
    prompts = ["Say hello.", "Greet the world.", "What do you say?", "Reply please."]
    target = {"sft_target": "hello world"}
    rows.write_text(
        "".join(
            json.dumps({"data_source": "t/sft", "prompt": [{"role": "user", "content": p}], "extra_info": target})
            + "\n"
            for p in prompts
        )
    )
    warmup = root / "warmup"
    sft = ["sft", f"model.cache_dir={model_cache}", f"sft.train_files=[{rows}]", f"sft.output_dir={warmup}"]
    sft += [f"trainer.output_dir={root}", "trainer.logger=[jsonl]", "sft.max_steps=3", "sft.lr=1e-2"]
    sft += ["sft.batch_size=4", "sft.micro_batch_size=4", "model.lora.rank=4"]
    result = runner.invoke(app, sft)
    assert result.exit_code == 0, result.output
    grpo = ("trainer.total_steps=1", "model.lora.rank=4", f"model.path={warmup}", "actor.lr=1e-2")
    Trainer(make_cfg(root, model_cache, *grpo)).fit()
    for extra, out in (([], root / "grpo"), (["--adapter-only"], root / "grpo_adapter")):
        result = runner.invoke(app, ["export", str(root / "toy_grpo"), str(out), *extra])
        assert result.exit_code == 0, result.output
    return {
        "base": base,
        "warmup": warmup,
        "warmup_adapter": warmup / "adapter",
        "grpo": root / "grpo",
        "grpo_adapter": root / "grpo_adapter",
    }


def _raws(out: Path, name: str) -> list[str]:
    lines = (out.parent / "eval_samples.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["systems"][name]["raw"] for line in lines]


def test_base_plus_two_adapters_answers_as_the_merged_export(
    tmp_path: Path, trained: dict[str, Path], model_cache: Path
) -> None:
    base, a1, a2 = trained["base"], trained["warmup_adapter"], trained["grpo_adapter"]
    # the GRPO adapter is named on the warm-up model it was trained on
    assert json.loads((a2 / "adapter_config.json").read_text())["base_model_name_or_path"] == "warmup"
    chain = f"{base}+{a1}+{a2}"
    out = tmp_path / "eval.json"
    systems = [f"merged={trained['grpo']}", f"chain={chain}", f"warm={base}+{a1}", f"warm_merged={trained['warmup']}"]
    lines: list[str] = []
    report = evaluate(
        DATA, systems, out, max_samples=4, batch_size=4, max_new_tokens=8, n_boot=20, cache_dir=str(model_cache),
        compare="chain:merged", echo=lines.append,
    )  # fmt: skip
    assert _raws(out, "chain") == _raws(out, "merged")
    assert _raws(out, "warm") == _raws(out, "warm_merged")
    assert report["comparisons"]["chain-merged"]["recall@5"]["diff"] == 0.0
    assert report["settings"]["systems"][1] == {
        "name": "chain", "kind": "model", "path": str(base), "adapters": [str(a1), str(a2)], "head": "full",
    }  # fmt: skip
    assert f"chain: generating with {chain} (float32) ..." in lines

    # the logits: the chain is the export up to the adapters' bf16 rounding, and the GRPO adapter counts
    ids = torch.tensor([[5, 9, 17, 33, 2, 41]])
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(trained["grpo"]).eval()(input_ids=ids).logits
        got = load_with_adapters(base, [a1, a2], torch.float32).eval()(input_ids=ids).logits
        warm_only = load_with_adapters(base, [a1], torch.float32).eval()(input_ids=ids).logits
    close = float((got - merged).abs().max())
    assert close < 5e-3
    assert float((warm_only - merged).abs().max()) > 10 * close


def test_relative_paths_and_processes(
    tmp_path: Path, trained: dict[str, Path], model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain of relative paths, generated in a spawned process beside another model: the same replies."""
    monkeypatch.chdir(trained["warmup"].parent)
    out = tmp_path / "eval.json"
    chain = f"{trained['base']}+warmup/adapter+grpo_adapter"
    systems = ["merged=grpo", f"chain={chain}"]
    evaluate(DATA, systems, out, max_samples=2, max_new_tokens=6, n_boot=20, cache_dir=str(model_cache),
             processes=2, echo=None)  # fmt: skip
    assert _raws(out, "chain") == _raws(out, "merged")


def _fake_base(folder: Path, trained: dict[str, Path], shape: tuple[int, int]) -> Path:
    """A model folder whose weights' headers name the adapter's modules with `shape` (another model)."""
    folder.mkdir()
    (folder / "config.json").write_text((trained["base"] / "config.json").read_text())
    modules = {
        k.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        for k in json.loads(_header(trained["warmup_adapter"] / "adapter_model.safetensors"))
        if k.endswith(".lora_A.weight")
    }
    save_file({f"{m}.weight": torch.zeros(shape) for m in modules}, folder / "model.safetensors")
    return folder


def _header(path: Path) -> str:
    raw = path.read_bytes()
    return raw[8 : 8 + int.from_bytes(raw[:8], "little")].decode()


@pytest.mark.parametrize("what", ["model_folder", "sft_folder", "empty", "missing", "other_model", "no_weights"])
def test_a_bad_adapter_is_one_line_and_exit_2_before_any_generation(
    tmp_path: Path, trained: dict[str, Path], model_cache: Path, what: str
) -> None:
    base, adapter = trained["base"], trained["warmup_adapter"]
    expected = {
        "model_folder": (f"{base}+{trained['grpo']}", "is a model folder (config.json), not a LoRA adapter folder"),
        "sft_folder": (f"{base}+{trained['warmup']}", f"is a model folder; its LoRA adapter is '{adapter}'"),
        "empty": (f"{base}+{tmp_path}", "is not a LoRA adapter folder (no adapter_config.json)"),
        "missing": (f"{base}+{tmp_path / 'nope'}", "does not exist"),
        "other_model": (f"{_fake_base(tmp_path / 'big', trained, (7, 3))}+{adapter}", "does not fit base"),
        "no_weights": (f"{base}+{tmp_path / 'half'}", "has adapter_config.json but no adapter_model.safetensors"),
    }[what]
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "adapter_config.json").write_text("{}")
    args = ["eval", "--data", DATA, "--systems", f"raw_turn,grpo={expected[0]}", "--out", str(tmp_path / "e.json")]
    result = runner.invoke(app, args, env={"QUERYRL_CACHE": str(model_cache)})
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: system 'grpo': ")
    assert expected[1] in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "generating" not in result.output
    assert not (tmp_path / "e.json").exists()


def test_a_folder_with_plus_in_its_name_is_one_model(tmp_path: Path, trained: dict[str, Path]) -> None:
    folder = tmp_path / "qwen+sft"
    folder.symlink_to(trained["warmup"])
    [spec] = parse_systems(f"m={folder}")
    assert (spec.path, spec.adapters) == (folder, ())
    with pytest.raises(EvalError, match=r"system 'x': bad model .*no empty part"):
        parse_systems(f"x={trained['base']}+")


def _kdconv_file(folder: Path) -> Path:
    """Two KdConv-shaped travel dialogues and their knowledge base (kb_travel.json) in `folder`."""
    folder.mkdir()
    kb = {
        "故宫": [["故宫", "门票", "60元"], ["故宫", "地址", "北京市东城区景山前街4号"]],
        "天坛": [["天坛", "门票", "15元"], ["天坛", "开放时间", "6:00-22:00"]],
    }
    (folder / "kb_travel.json").write_text(json.dumps(kb, ensure_ascii=False), encoding="utf-8")

    def said(text: str, *attrs: tuple[str, str, str]) -> dict[str, Any]:
        return {"message": text, "attrs": [{"name": n, "attrname": a, "attrvalue": v} for n, a, v in attrs]}

    dialogues = [
        {"messages": [said("你知道故宫吗？"), said("知道，门票60元。", ("故宫", "门票", "60元")), said("在哪里？"),
                      said("在北京市东城区景山前街4号。", ("故宫", "地址", "北京市东城区景山前街4号"))]},
        {"messages": [said("天坛门票多少钱？"), said("15元。", ("天坛", "门票", "15元")), said("几点开门？"),
                      said("6:00-22:00。", ("天坛", "开放时间", "6:00-22:00")), said("谢谢。")]},
    ]  # fmt: skip
    data = folder / "dialogues.json"
    data.write_text(json.dumps(dialogues, ensure_ascii=False), encoding="utf-8")
    return data


def test_a_kdconv_file_is_prepared_on_the_fly_with_its_kb_and_compared(
    tmp_path: Path, trained: dict[str, Path]
) -> None:
    data = _kdconv_file(tmp_path / "travel")
    kb = tmp_path / "travel" / "kb_travel.json"
    out = tmp_path / "eval" / "eval.json"
    warm = f"warmup={trained['base']}+{trained['warmup_adapter']}"
    grpo = f"grpo={trained['base']}+{trained['warmup_adapter']}+{trained['grpo_adapter']}"
    args = ["eval", "--data", str(data), "--systems", f"{warm},{grpo},concat_last3,reference", "--out", str(out)]
    args += ["--compare", "grpo:warmup,grpo:concat_last3", "--max-new-tokens", "6", "--bootstrap", "20"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"corpus: kdconv:{kb} (the knowledge base of the KdConv file {data})" in result.output
    # the turns whose reply uses the KB: the first speaker's two questions in each dialogue (the other's get none)
    assert f"{data}: KdConv dialogues -> 4 turns with gold (history 320 characters, text answers)" in result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["n_samples"] == 4
    assert report["settings"]["corpus"] == f"kdconv:{kb}"
    assert set(report["comparisons"]) == {"grpo-warmup", "grpo-concat_last3"}
    assert report["systems"]["reference"]["recall@5"] > 0  # the embedded service searched the file's KB
    samples = [json.loads(line) for line in (out.parent / "eval_samples.jsonl").read_text().splitlines()]
    assert {s["systems"]["concat_last3"]["query"] for s in samples} >= {"你知道故宫吗？ 在哪里？"}


def test_kdconv_file_options_and_their_errors(tmp_path: Path) -> None:
    data = _kdconv_file(tmp_path / "travel")
    base = ["eval", "--data", str(data), "--systems", "raw_turn", "--out", str(tmp_path / "e.json")]
    for extra, message in [
        (["--kb", str(tmp_path / "none.json")], f"knowledge base '{tmp_path / 'none.json'}' does not exist"),
        (["--answer-format", "yaml"], "--answer-format: unknown 'yaml'"),
        (["--history-chars", "-1"], "--history-chars must be >= 0"),
        (["--mentions", "-1"], "--mentions must be >= 0, got -1"),
    ]:
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert len(result.output.strip().splitlines()) == 1
    (tmp_path / "travel" / "kb_travel.json").rename(tmp_path / "kb.json")
    result = runner.invoke(app, base)
    assert result.exit_code == 2
    assert "no knowledge base (kb_*.json) beside it: name it with --kb KB.json" in result.output
    result = runner.invoke(app, [*base, "--kb", str(tmp_path / "kb.json"), "--history-chars", "0"])
    assert result.exit_code == 0, result.output
    assert "(history 0 characters, text answers)" in result.output
    result = runner.invoke(app, [*base, "--kb", str(tmp_path / "kb.json"), "--mentions", "2"])
    assert result.exit_code == 0, result.output
    said = "(history 320 characters, text answers, the latest 2 names mentioned as the history summary)"
    assert said in result.output
    samples = [json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    assert any(s["systems"]["raw_turn"]["query"] == "在哪里？" for s in samples)  # the turns are read as before
    not_kdconv = ["eval", "--data", DATA, "--systems", "raw_turn", "--out", str(tmp_path / "f.json"), "--kb", "x"]
    result = runner.invoke(app, not_kdconv)
    assert result.exit_code == 2
    assert "are for a KdConv .json file" in result.output
