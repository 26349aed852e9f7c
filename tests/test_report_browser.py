"""The run page in a real headless browser: Debian's chromium driven by Playwright (no browser download).

``make`` installs chromium where it can (root with apt-get) and then sets QUERYRL_REQUIRE_BROWSER=1: there a
missing browser fails these tests instead of skipping them. The screenshot is kept in ``tmp_path`` and
copied to ``runs/test-artifacts/report.png`` (``runs/`` is git-ignored).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queryrl.report import write_report
from queryrl.trainer.loop import Trainer
from tests.helpers import make_cfg
from tests.report_helpers import fake_run

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "runs" / "test-artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium, or a skip (a failure where ``make`` promised one)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or not CHROMIUM.is_file():
        missing = "playwright (pip install -e .[dev])" if sync_playwright is None else f"{CHROMIUM}"
        if os.environ.get("QUERYRL_REQUIRE_BROWSER") == "1":
            pytest.fail(f"no {missing} although make installed the browser (Debian's chromium)")
        pytest.skip(f"no {missing} here (apt-get install chromium; make does it where it can)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


def open_page(browser: Any, path: Path) -> tuple[Any, list[str]]:
    """The page at ``path`` (a file:// URL) and the list its console errors and uncaught exceptions go to."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
    page.goto(path.resolve().as_uri())
    page.wait_for_load_state("load")
    return page, errors


def shown_steps(page: Any) -> set[str]:
    return set(page.eval_on_selector_all("#samplelist .sample", "els => els.map(e => e.dataset.step)"))


def test_trained_run_page(browser: Any, tmp_path: Path, model_cache: Path) -> None:
    Trainer(make_cfg(tmp_path, model_cache, "trainer.plot=true", "trainer.total_steps=3")).fit()
    page, errors = open_page(browser, tmp_path / "toy_grpo" / "report.html")
    # the curves: one SVG per chart, each line a path with points in it
    assert page.locator("svg.plot").count() >= 4
    paths = page.eval_on_selector_all("svg.plot path[data-key]", "ps => ps.map(p => p.getAttribute('d'))")
    assert paths
    assert all(d.startswith("M") for d in paths)
    # a line of positive length in every chart, or a dot where a key was logged once (timing_s/save_checkpoint,
    # a small multiple of its own)
    longest = page.eval_on_selector_all(
        "svg.plot",
        "ss => ss.map(s => Math.max(...[...s.querySelectorAll('path')].map(p => p.getTotalLength()))"
        " + s.querySelectorAll('circle').length)",
    )
    assert all(n > 0 for n in longest)
    # the last step is shown first; picking step 1 shows step 1's samples
    assert shown_steps(page) == {"3"}
    page.select_option("#step", "1")
    assert shown_steps(page) == {"1"}
    assert page.locator("#samplelist .turn").count() > 0
    page.select_option("#step", "2")  # the toy prompts come back: "Please say hello." at steps 1 and 2
    assert page.locator("#samplelist details.earlier summary", has_text="same prompt at step 1").count() > 0
    page.select_option("#step", "1")
    screenshot = tmp_path / "report.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(screenshot, ARTIFACTS / "report.png")
    assert errors == []


def test_html_in_a_response_shows_as_text_and_filters(browser: Any, tmp_path: Path) -> None:
    attack = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    transcript = 'let me add <tool_call>{"name": "calc"}</tool_call><|im_start|>tool\n42<|im_end|> so 42'
    run = fake_run(tmp_path / "run", steps=2, per_step=4, response=attack, transcript=transcript)
    page, errors = open_page(browser, write_report(run))
    assert page.locator("#samplelist img, #samplelist script").count() == 0
    assert attack in page.locator("#samplelist .response pre").first.text_content()
    assert page.locator("#evaltable td", has_text="0.5 [0.4, 0.6]").count() == 1
    # the agent transcript: tool call and tool result set apart from the model's text
    first = page.locator("#samplelist .sample").first
    assert first.locator(".tool_call pre").text_content() == '<tool_call>{"name": "calc"}</tool_call>'
    assert first.locator(".tool_result pre").text_content() == "<|im_start|>tool\n42<|im_end|>"
    # one prompt in every group: step 2 (shown first) shows step 1's candidates under each group
    summaries = page.locator("#samplelist details.earlier summary").all_text_contents()
    # step 1's 4 samples of the prompt score 0, 1, 0, failed; step 2's groups {0, 1} and {0, failed}
    assert summaries == [
        "same prompt at step 1: mean score 0.3333 -> 0.5",
        "same prompt at step 1: mean score 0.3333 -> 0",
    ]
    # scores in a step: 0, 1, 0, failed (groups of 2: {0, 1}, {0, failed})
    assert page.locator("#samplelist .sample").count() == 4
    page.check("#failed")
    assert page.locator("#samplelist .sample").count() == 1
    page.uncheck("#failed")
    page.fill("#minscore", "0.5")
    assert page.locator("#samplelist .sample").count() == 1
    page.fill("#minscore", "")
    page.check("#zerovar")  # group 1's only scored sample: zero variance
    assert page.locator("#samplelist .group").count() == 1
    assert errors == []


def test_documents_verdict_failure_and_zoom(browser: Any, tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", steps=40, per_step=4)
    page, errors = open_page(browser, write_report(run))
    first = page.locator("#samplelist .sample").first
    # both sides' documents side by side, the gold one marked, and the judge's verdict
    tables = first.locator(".sides table.docs")
    assert tables.count() == 2
    assert first.locator(".sides b").all_text_contents() == ["candidate_documents", "reference_documents"]
    assert tables.nth(0).locator("tr.goldrow").count() == 1
    assert "d0" in tables.nth(0).locator("tr.goldrow").text_content()
    assert "d3" in tables.nth(1).locator("tr.goldrow").text_content()
    assert "gold" in tables.nth(0).locator("tr.goldrow").text_content()
    assert first.locator(".info", has_text="judge_verdict").count() == 1
    assert first.locator(".info th", has_text="candidate_query").count() == 1
    # the reward's numbers in the sample's head line
    assert "judge=1" in first.locator("div").first.text_content()
    # a failed sample shows its error
    failed = page.locator("#samplelist .sample.failed")
    assert failed.count() == 1
    assert failed.locator(".error").text_content() == "reward failed: RAG /rag/chat_8b failed: timed out"
    # zoom: drag across the first chart's middle half, its step axis narrows; double-click restores it
    chart = page.locator("svg.plot").first
    assert chart.get_attribute("data-x0") == "1"  # the step range shown (its ticks are at round steps)
    box = chart.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.35, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.7, y, steps=5)
    page.mouse.up()
    chart = page.locator("svg.plot").first
    low, high = float(chart.get_attribute("data-x0")), float(chart.get_attribute("data-x1"))
    assert 5 < low < high < 35, (low, high)
    assert page.locator(".chart .hint").first.text_content().startswith("zoomed")
    chart.dblclick()
    assert page.locator("svg.plot").first.get_attribute("data-x0") == "1"
    page.screenshot(path=str(tmp_path / "inspector.png"), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "inspector.png", ARTIFACTS / "inspector.png")
    assert errors == []


def test_eval_examples_section(browser: Any, tmp_path: Path) -> None:
    """eval --compare grpo:sft's per-turn output: the turns where grpo is better and worse, both sides shown."""
    run = fake_run(tmp_path / "run", steps=2)
    report = json.loads((run / "eval.json").read_text(encoding="utf-8"))
    (run / "eval.json").write_text(json.dumps(report | {"settings": {"compare": ["grpo:sft"]}}), encoding="utf-8")

    def side(query: str, recall: float, kept: bool, reason: str) -> dict[str, Any]:
        ids = ["g", "x"] if recall else ["x"]
        titles = [f"云帆 Pro2 {i}" for i in ids]
        return {"query": query, "recall@5": recall, "top5": ids, "top5_titles": titles, "intent_kept": kept}

    rows = [
        {"last_turn": "这个多少钱?", "gold": ["g"], "kind": "pronoun", "systems": {
            "grpo": side("这个能马上发货吗? pro2", 1.0, False, "") | {"intent_reason": "asks stock instead of price"},
            "sft": side("这个多少钱? pro2", 0.0, True, "") | {"intent_reason": "keeps the question (price)"}}},
        {"last_turn": "它有几个颜色", "gold": ["g"], "kind": "pronoun", "systems": {
            "grpo": side("pro2 <b>价格</b>", 0.0, False, ""), "sft": side("pro2 颜色", 1.0, True, "")}},
    ]  # fmt: skip
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    (run / "eval_samples.jsonl").write_text(lines, encoding="utf-8")
    page, errors = open_page(browser, write_report(run))
    examples = page.locator("#examplelist .example")
    assert examples.count() == 2
    better = examples.nth(0)
    assert "这个多少钱?" in better.locator(".turn").text_content()
    cells = better.locator("td").all_text_contents()
    assert "这个能马上发货吗? pro2" in cells
    assert any(c.startswith("CHANGED: asks stock instead of price") for c in cells)
    assert better.locator("td.changed").count() == 1
    assert better.locator("li.gold").count() == 1  # the gold document marked in grpo's list
    worse = examples.nth(1)
    assert worse.locator("b", has_text="<b>").count() == 0  # markup in a query shows as text
    assert "pro2 <b>价格</b>" in worse.locator("td").all_text_contents()
    assert "grpo better on 1, worse on 1" in page.locator("#examplelist p").first.text_content()
    assert errors == []


def test_an_unscored_sample_is_shown_as_such_not_as_failed(browser: Any, tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", steps=1, per_step=4)
    path = run / "samples" / "step_1.jsonl"
    samples = [json.loads(line) for line in path.read_text().splitlines()]
    samples[1] |= {"score": None, "unscored": True}  # no TRL-style function scored it: advantage 0, kept
    path.write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    page, errors = open_page(browser, write_report(run))
    heads = page.locator("#samplelist .sample > div:first-child b").all_text_contents()
    assert sorted(heads) == ["score 0", "score 0", "score failed", "score unscored"]
    assert page.locator("#samplelist .sample.failed").count() == 1  # only the failed one
    page.check("#failed")
    assert page.locator("#samplelist .sample").count() == 1
    page.uncheck("#failed")
    page.fill("#minscore", "0")  # a score filter shows scored samples only
    assert page.locator("#samplelist .sample").count() == 2
    assert errors == []


def test_charts_read_at_a_glance(browser: Any, tmp_path: Path) -> None:
    """Ticks and grid lines, every label inside its plot (none cut), at most MAX_SERIES curves per chart, the
    reward's parts as small multiples, smoothing with the raw values faint behind, legend entries that toggle."""
    from queryrl.report import MAX_SERIES

    run = tmp_path / "run"
    run.mkdir()
    with (run / "metrics.jsonl").open("w", encoding="utf-8") as f:
        for step in range(1, 481):  # the demo's 480 steps: labels such as "step 480" must not be cut
            row = {"step": step, "critic/score/mean": (step % 7) / 7, "reward/judge/mean": -0.5 + (step % 5) / 5}
            row |= {"reward/format/mean": 1.0 - (step % 3) / 10, "reward/retrieval_rank/mean": (step % 11) / 5}
            row |= {f"timing_s/{k}": 0.1 * (step % (i + 3)) for i, k in enumerate(["gen", "reward", "adv", "ref", "x"])}
            f.write(json.dumps(row | {"timing_s/step": 2.0 + (step % 13 == 0) * 5, "actor/entropy": 1 / step}) + "\n")
    page, errors = open_page(browser, write_report(run))
    curves = page.eval_on_selector_all(".chart", "cs => cs.map(c => c.querySelectorAll('path[data-key]').length)")
    assert curves
    assert max(curves) <= MAX_SERIES
    assert page.locator(".family h3", has_text="Reward parts").count() == 1
    assert page.locator(".family .chart").count() >= 3 + 5  # 3 reward parts, 5 phase times
    # ticks and grid lines on every chart; every text inside its SVG's box (its viewBox)
    assert min(page.eval_on_selector_all("svg.plot", "ss => ss.map(s => s.querySelectorAll('.ytick').length)")) >= 3
    assert min(page.eval_on_selector_all("svg.plot", "ss => ss.map(s => s.querySelectorAll('.xtick').length)")) >= 3
    outside = page.eval_on_selector_all(
        "svg.plot text",
        "ts => ts.filter(t => { const b = t.getBBox(), v = t.ownerSVGElement.viewBox.baseVal; return b.x < 0 "
        "|| b.y < 0 || b.x + b.width > v.width || b.y + b.height > v.height; }).map(t => t.textContent)",
    )
    assert outside == []
    assert "480" in page.eval_on_selector_all("svg.plot .xtick", "ts => ts.map(t => t.textContent)")
    # smoothing: the raw curve faint behind the smoothed one; 0 draws the raw values alone
    assert page.locator("svg.plot path[data-raw]").count() > 0
    smoothed = page.eval_on_selector("svg.plot path[data-key]", "p => p.getAttribute('d')")
    page.fill("#smoothing", "0")
    page.dispatch_event("#smoothing", "input")
    assert page.locator("svg.plot path[data-raw]").count() == 0
    assert page.eval_on_selector("svg.plot path[data-key]", "p => p.getAttribute('d')") != smoothed
    # a legend entry hides its curve and shows it again
    first = page.locator(".chart").first
    before = first.locator("path[data-key]").count()
    first.locator(".legend span").first.click()
    assert page.locator(".chart").first.locator("path[data-key]").count() == before - 1
    page.locator(".chart").first.locator(".legend span").first.click()
    assert page.locator(".chart").first.locator("path[data-key]").count() == before
    page.screenshot(path=str(tmp_path / "charts.png"), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "charts.png", ARTIFACTS / "charts.png")
    assert errors == []


def test_two_runs_compared(browser: Any, tmp_path: Path) -> None:
    """The comparison page: one curve per run on each metric's chart, the eval tables side by side, no inspector."""
    from queryrl.report import write_comparison
    from tests.report_helpers import fake_run

    a, b = fake_run(tmp_path / "sft_then_grpo", steps=5), fake_run(tmp_path / "grpo_only", steps=8)
    page, errors = open_page(browser, write_comparison([a, b], tmp_path / "compare.html"))
    keys = page.eval_on_selector_all(
        ".chart", "cs => cs.map(c => [...c.querySelectorAll('path[data-key]')].map(p => p.dataset.key))"
    )
    assert keys
    assert all(k == ["sft_then_grpo", "grpo_only"] for k in keys)
    assert page.locator("#evaltable .evalrun > h3:first-child").all_text_contents() == ["sft_then_grpo", "grpo_only"]
    assert page.locator("#evaltable .evalrun table").count() >= 2
    assert not page.locator("#inspector").is_visible()
    page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "compare.png", ARTIFACTS / "compare.png")
    assert errors == []
