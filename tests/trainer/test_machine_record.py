"""A run says what it ran on: the Trainer itself (not only ``queryrl train``) writes ``machine.json`` in the run
folder, and the run page's headline shows it."""

from __future__ import annotations

import json
from pathlib import Path

from queryrl.machine import MACHINE_FILE
from queryrl.report import write_report
from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg


def test_the_trainer_records_the_machine_and_the_run_page_shows_it(tmp_path: Path, model_cache: Path) -> None:
    with Trainer(make_cfg(tmp_path, model_cache, "trainer.total_steps=1")) as trainer:
        trainer.fit()
    run = tmp_path / "toy_grpo"
    info = json.loads((run / MACHINE_FILE).read_text(encoding="utf-8"))
    assert info["cores"] >= 1
    assert info["matmul_gflops"]["float32"] > 0
    page = write_report(run).read_text(encoding="utf-8")
    line = page.split('<p id="machine">')[1].split("</p>")[0]
    assert line.startswith("machine: ")
    assert f"{info['cores']} cores" in line
    (run / MACHINE_FILE).write_text("{not json", encoding="utf-8")  # a damaged file costs the line, not the page
    assert 'id="machine"' not in write_report(run).read_text(encoding="utf-8")
