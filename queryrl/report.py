"""A run's page: ``write_report(run_dir)`` writes ``run_dir/report.html``, one self-contained file.

The page needs no server and no network (inline CSS and JS, no external URL): the training curves
drawn as inline SVG by a few lines of JS, the eval table when ``run_dir/eval.json`` exists (the file
``queryrl eval --out`` writes beside a run; only the run's own folder is looked at), the eval examples
(:mod:`queryrl.report_examples`: turns where the two systems of ``--compare`` differ) and a rollout
inspector over ``samples/step_N.jsonl``.

Size: the samples of at most ``MAX_STEPS`` steps are embedded: every k-th step with the smallest k that
keeps the count under the bound, the last step always in (the page says which); a text field longer
than ``MAX_TEXT`` characters is cut. Metrics are embedded only for the charted keys. All data sits in
``<script type="application/json">`` tags with ``<`` escaped, and the JS puts text in the page through
``textContent`` only, so no data can inject HTML.
"""

from __future__ import annotations

import html
import json
import math
import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from queryrl.atomic import atomic_write_text
from queryrl.machine import MACHINE_FILE, MachineInfo
from queryrl.report_examples import EXAMPLES_CSS, EXAMPLES_JS, NAV_HTML, SECTION_HTML, eval_examples
from queryrl.report_page import CSS, JS, PAGE
from queryrl.tracking import decoded_lines

MAX_STEPS = 200  # steps whose samples are embedded
MAX_TEXT = 4000  # characters kept of one text field

# chart title -> key pattern: one quantity (or one family on one scale) per chart. A chart that would draw more
# than MAX_SERIES curves becomes small multiples, one chart per key under the title (the reward's parts, the
# timing phases, the validation metrics of several data sources)
CHARTS: tuple[tuple[str, str], ...] = (
    ("Score", r"^(critic/score/mean|critic/rewards/mean)$"),
    ("Reward parts", r"^reward/(?!failed|retries|timeouts|zero_std).*/mean$"),
    ("Policy loss", r"^actor/pg_loss$"),
    ("KL", r"^(actor/(kl_loss|ppo_kl)|critic/kl)$"),
    ("Value loss", r"^critic/vf_loss$"),
    ("Entropy", r"^actor/entropy$"),
    ("Response length", r"^response_length/(mean|max|min)$"),
    ("Validation: score", r"^val/.*(score|reward)s?/mean$"),
    ("Validation: retrieval / accuracy", r"^val/.*(recall|mrr|ndcg|acc)"),
    ("Validation: response length", r"^val/response_length/"),
    ("Step time (s)", r"^timing_s/step$"),
    ("Phase times (s)", r"^timing_s/(?!step$)"),
    ("SFT loss", r"^sft/(loss|val_loss|prompt_loss)$"),
    ("Judge tokens per step", r"^judge/(prompt|completion|reasoning)_tokens$"),
    ("Judge cost per step (estimated)", r"^judge/cost$"),
)
MAX_SERIES = 4  # curves on one chart at most; more become small multiples
OWN_CHARTS = {"Reward parts"}  # families on different scales (judge in [-1, 1], rank in [0, 2], ...): always split

_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.S)
# an agent transcript's tool parts: hermes calls, wrapped results, ChatML tool turns
_TOOL = re.compile(
    r"(?P<call><tool_call>.*?(?:</tool_call>|$))|(?P<result><tool_response>.*?(?:</tool_response>|$)"
    r"|<\|im_start\|>tool\n.*?(?:<\|im_end\|>|$))",
    re.S,
)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of `path`, one a line; a line that is not UTF-8 JSON (a torn line of a run that was
    killed, a stray byte) is dropped with one warning per file: the rest still shows."""
    out, dropped = [], []
    for lineno, line in decoded_lines(path):
        try:
            record = json.loads(line) if line is not None else None
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            out.append(record)
        else:
            dropped.append(lineno)
    if dropped:
        lines = f"line {dropped[0]}" if len(dropped) == 1 else f"{len(dropped)} lines (the first: {dropped[0]})"
        warnings.warn(f"{path}: {lines} not UTF-8 JSON objects; dropped", stacklevel=2)
    return out


def _points(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every finite number of ``metrics.jsonl``: key -> {step: value}."""
    path = run_dir / "metrics.jsonl"
    points: dict[str, dict[int, float]] = {}
    for record in _read_jsonl(path) if path.is_file() else []:
        step = record.get("step")
        if not isinstance(step, int):
            continue
        for key, value in record.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                points.setdefault(key, {})[step] = float(value)
    return points


def _families(keys: Iterable[str]) -> list[tuple[str, list[str]]]:
    """Each :data:`CHARTS` family's title and the sorted `keys` (metric names) it draws, families with none left out."""
    out = []
    for title, pattern in CHARTS:
        regex = re.compile(pattern)
        if chosen := sorted({k for k in keys if k != "step" and regex.search(k)}):
            out.append((title, chosen))
    return out


def _curves(run_dir: Path) -> list[dict[str, Any]]:
    """[{title, series: {key: [[step, value], ...]}, group?}] for each chart with data (``group``: the family
    title of a small multiple)."""
    points = _points(run_dir)
    charts = []
    for title, keys in _families(points):
        series: dict[str, list[tuple[int, float]]] = {}
        for key in keys:  # a curve equal to an earlier one joins its label instead of hiding under it
            curve = sorted(points[key].items())
            same = next((label for label, drawn in series.items() if drawn == curve), None)
            series[f"{same} = {key}" if same else key] = curve
            if same:
                del series[same]
        # small multiples: one chart per curve, under the family's title
        if len(series) > MAX_SERIES or (title in OWN_CHARTS and len(series) > 1):
            charts += [{"title": key, "group": title, "series": {key: curve}} for key, curve in series.items()]
        elif series:
            charts.append({"title": title, "series": series})
    return charts


def judge_spend_line(points: dict[str, dict[int, float]]) -> str | None:
    """The judge's spend over the whole run, summed from ``metrics.jsonl``'s per-step ``judge/*``: tokens
    (reasoning among the completion tokens, billed as output), the estimated cost when the run had prices,
    failed and cut-off calls. None when no step has judge tokens."""
    if "judge/prompt_tokens" not in points:
        return None
    total = {key: sum(points.get(f"judge/{key}", {}).values()) for key in _SPEND}
    line = (
        f"Judge, whole run: {total['prompt_tokens']:,.0f} prompt tokens, {total['completion_tokens']:,.0f} "
        f"completion tokens ({total['reasoning_tokens']:,.0f} of them reasoning, billed as output)"
    )
    if "judge/cost" in points:
        line += f", estimated cost {total['cost']:.4g} at the configured prices"
    return line + f"; {total['failed']:.0f} failed judgments, {total['cut_off']:.0f} cut off at the token limit."


_SPEND = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "cost", "failed", "cut_off")

FLAT_GROUPS_GOAL = 0.30  # issue 50: at most 30 % of a run's groups without a reward spread


def machine_line(run_dir: Path) -> str | None:
    """What the run's steps ran on (its ``machine.json``, :mod:`queryrl.machine`), as the console said it; None
    without the file or when it cannot be read (a page is still written)."""
    try:
        return MachineInfo(**json.loads((run_dir / MACHINE_FILE).read_text(encoding="utf-8"))).line()
    except (OSError, ValueError, TypeError):
        return None


def flat_groups_line(points: dict[str, dict[int, float]]) -> str | None:
    """The run's share of flat groups (every sample of the group scored alike: no GRPO signal), the mean over
    the steps of ``reward/zero_std_group_frac``, against :data:`FLAT_GROUPS_GOAL`. None when no step logged it."""
    per_step = points.get("reward/zero_std_group_frac") or {}
    if not per_step:
        return None
    share = sum(per_step.values()) / len(per_step)
    steps = f"{len(per_step)} step{'s' if len(per_step) != 1 else ''}"
    verdict = "met" if share <= FLAT_GROUPS_GOAL else "not met"
    line = (
        f"Flat groups: {share * 100:.0f} % of the groups over the run ({steps}) had one reward for every sample, "
        f"so GRPO learnt nothing from them (goal: at most {FLAT_GROUPS_GOAL * 100:.0f} %, {verdict})."
    )
    same = points.get("rollout/identical_group_frac") or {}
    if same:  # the sampler's part: one response drawn for the whole group, which no reward can split
        line += (
            f" In {sum(same.values()) / len(same) * 100:.0f} % the sampler drew one response for the whole group: "
            "no reward can split those, only more varied samples can."
        )
    return line


def _sample_steps(run_dir: Path) -> tuple[list[int], list[int], int]:
    """(all steps with samples, the embedded ones, k): every k-th step, the last one always in."""
    folder = run_dir / "samples"
    steps = sorted(
        int(m.group(1)) for p in folder.glob("step_*.jsonl") if (m := re.fullmatch(r"step_(\d+)\.jsonl", p.name))
    )
    k = max(1, math.ceil(len(steps) / MAX_STEPS))
    chosen = steps[::-1][::k][::-1]  # counted from the last step, so the last is in
    return steps, chosen, k


def _cut(value: Any) -> Any:
    """``value`` with every string longer than ``MAX_TEXT`` cut (nested too)."""
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + f" [... {len(value) - MAX_TEXT} characters cut]"
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a NaN score is a failed sample
    return value


def conversation(sample: dict[str, Any]) -> list[dict[str, str]]:
    """The sample's prompt as [{role, content}]: its ``messages`` when present, else the turns of a
    ChatML prompt (``<|im_start|>role ... <|im_end|>``), else the whole prompt as one ``prompt`` turn."""
    messages = sample.get("messages")
    if isinstance(messages, list) and all(isinstance(m, dict) for m in messages):
        return [{"role": str(m.get("role", "?")), "content": str(m.get("content", ""))} for m in messages]
    prompt = str(sample.get("prompt") or "")
    turns = [{"role": role, "content": text.strip()} for role, text in _TURN.findall(prompt)]
    turns = [t for t in turns if t["content"] or t["role"] != "assistant"]  # the generation prompt's empty turn
    return turns or ([{"role": "prompt", "content": prompt}] if prompt else [])


def transcript_parts(text: str) -> list[dict[str, str]]:
    """An agent transcript cut into [{kind, text}], kind ``model``, ``tool_call`` or ``tool_result``, in order."""
    parts, at = [], 0
    for match in _TOOL.finditer(text):
        if match.start() > at:
            parts.append({"kind": "model", "text": text[at : match.start()]})
        parts.append({"kind": "tool_call" if match.group("call") else "tool_result", "text": match.group(0)})
        at = match.end()
    if at < len(text):
        parts.append({"kind": "model", "text": text[at:]})
    return parts


def ordinal(k: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``12th``, ``13th``, ``21st``, ..."""
    suffix = "th" if 11 <= k % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def _samples(run_dir: Path, steps: list[int]) -> dict[str, Any]:
    """``{"conversations": [...], "steps": {step: [sample, ...]}}``: each sample's ``conversation`` is an
    index into ``conversations``, which holds each distinct conversation once (a group's candidates, and
    the same prompt at other steps, share one)."""
    conversations: list[list[dict[str, str]]] = []
    index: dict[str, int] = {}
    out = {}
    for step in steps:
        rows = []
        for sample in _read_jsonl(run_dir / "samples" / f"step_{step}.jsonl"):
            rest = {k: v for k, v in sample.items() if k not in ("prompt", "messages")}
            if isinstance(rest.get("transcript"), str):
                rest["transcript"] = transcript_parts(rest["transcript"])
            turns = _cut(conversation(sample))
            key = json.dumps(turns, ensure_ascii=False)
            if key not in index:
                index[key] = len(conversations)
                conversations.append(turns)
            rows.append({"conversation": index[key], **_cut(rest)})
        out[str(step)] = rows
    return {"conversations": conversations, "steps": out}


def _eval(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "eval.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _json_tag(tag_id: str, data: Any) -> str:
    # "<" as \u003c: no "</script>" or "<!--" in the tag, whatever the data holds
    text = json.dumps(data, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    return f'<script type="application/json" id="data-{tag_id}">{text}</script>'


def write_report(run_dir: Path) -> Path:
    """Write ``run_dir/report.html``: curves, eval table, rollout inspector, in one file.

    Args:
        run_dir: a run folder (``metrics.jsonl``, ``samples/step_N.jsonl``, optionally ``eval.json``).

    Returns:
        The page's path.

    Raises:
        FileNotFoundError: ``run_dir`` is not a folder.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run folder at {run_dir}")
    all_steps, chosen, k = _sample_steps(run_dir)
    info = {
        "run": run_dir.resolve().name,
        "sample_steps": len(all_steps),
        "embedded": chosen,
        "every": k,
        "every_ordinal": ordinal(k),
        "max_text": MAX_TEXT,
    }
    body = "\n".join(
        [
            _json_tag("info", info),
            _json_tag("curves", _curves(run_dir)),
            _json_tag("eval", _eval(run_dir)),
            _json_tag("examples", eval_examples(run_dir)),
            _json_tag("samples", _samples(run_dir, chosen)),
        ]
    )
    out = run_dir / "report.html"
    points = _points(run_dir)
    spend, flat, ran_on = judge_spend_line(points), flat_groups_line(points), machine_line(run_dir)
    judge = f'<p id="machine">{html.escape(ran_on)}</p>' if ran_on else ""
    judge += f'<p id="flatgroups">{html.escape(flat)}</p>' if flat else ""
    judge += f'<p id="judgespend">{html.escape(spend)}</p>' if spend else ""
    atomic_write_text(out, _page(f"queryrl run: {info['run']}", body, examples=True, judge=judge))
    return out


def _page(title: str, body: str, examples: bool, judge: str = "") -> str:
    """The page skeleton filled: `title`, the data tags `body`, the eval-examples section when `examples`, and
    the `judge` spend paragraph (HTML, escaped by the caller)."""
    page = PAGE.replace("@TITLE@", html.escape(title)).replace("@DATA@", body).replace("@JUDGE@", judge)
    page = page.replace("@CSS@", CSS + (EXAMPLES_CSS if examples else "")).replace(
        "@JS@", JS + (EXAMPLES_JS if examples else "")
    )
    return page.replace("@EXAMPLES@", SECTION_HTML if examples else "").replace(
        "@EXAMPLES_NAV@", NAV_HTML if examples else ""
    )


def run_names(run_dirs: list[Path]) -> list[str]:
    """Short distinct names of `run_dirs`: each folder's name, with its parent's where two names are equal."""
    names = [p.resolve().name for p in run_dirs]
    return [f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 else n for p, n in zip(run_dirs, names, strict=True)]


def comparison_curves(run_dirs: list[Path], names: list[str]) -> list[dict[str, Any]]:
    """One chart per metric of each :data:`CHARTS` family that any run logged, a curve per run on it (so at most
    as many curves as runs), grouped under the family's title."""
    points = [_points(d) for d in run_dirs]
    charts = []
    for title, keys in _families({k for run in points for k in run}):
        for key in keys:
            series = {name: sorted(run[key].items()) for name, run in zip(names, points, strict=True) if key in run}
            charts.append({"title": key, "group": title, "series": series})
    return charts


def write_comparison(run_dirs: list[Path], out: Path | None = None) -> Path:
    """Write one page that compares runs, as wandb's run comparison does: each metric's curves of every run on
    one chart (smoothing, ticks and zoom as on a run's page), and the runs' eval tables with their paired
    differences side by side.

    Args:
        run_dirs: two or more run folders.
        out: the page; default ``compare.html`` in the first run's folder.

    Returns:
        The page's path.

    Raises:
        FileNotFoundError: a run folder is missing.
        ValueError: fewer than two runs.
    """
    run_dirs = [Path(d) for d in run_dirs]
    if len(run_dirs) < 2:
        raise ValueError("a comparison needs two or more run folders")
    for d in run_dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"no run folder at {d}")
    names = run_names(run_dirs)
    info = {"run": " vs ".join(names), "compare": names, "sample_steps": 0, "embedded": [], "every": 1,
            "every_ordinal": ordinal(1), "max_text": MAX_TEXT}  # fmt: skip
    body = "\n".join(
        [
            _json_tag("info", info),
            _json_tag("curves", comparison_curves(run_dirs, names)),
            _json_tag("eval", [{"run": n, "eval": _eval(d)} for n, d in zip(names, run_dirs, strict=True)]),
            _json_tag("samples", {"steps": {}, "conversations": []}),
        ]
    )
    out = Path(out) if out is not None else run_dirs[0] / "compare.html"
    atomic_write_text(out, _page(f"queryrl runs: {info['run']}", body, examples=False))
    return out
