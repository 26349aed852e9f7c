"""The run page's static parts (:func:`queryrl.report.write_report` fills them): the HTML skeleton with its
``@TITLE@``, ``@CSS@``, ``@JS@``, ``@DATA@`` and eval-examples placeholders, the style sheet and the script
that draws the curves, the evaluation table and the rollout inspector from the page's JSON data tags."""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>@TITLE@</title><style>@CSS@</style></head>
<body><h1 id="title">@TITLE@</h1>
<nav><a href="#curves">Curves</a> · <a href="#evalsec">Evaluation</a>@EXAMPLES_NAV@
 · <a href="#inspector">Rollouts</a></nav>
<section id="curves"><h2>Training curves</h2><div id="charts"></div></section>
<section id="evalsec"><h2>Evaluation</h2><div id="evaltable"></div></section>
@EXAMPLES@
<section id="inspector"><h2>Rollout inspector</h2>
<p id="subsample"></p>
<div class="controls">
<label>Step <select id="step"></select></label>
<label>min score <input id="minscore" type="number" step="any"></label>
<label>max score <input id="maxscore" type="number" step="any"></label>
<label><input id="failed" type="checkbox"> failed only</label>
<label><input id="zerovar" type="checkbox"> zero-variance groups only</label>
<span id="count"></span></div>
<div id="samplelist"></div></section>
@DATA@
<script>@JS@</script></body></html>
"""

CSS = """
body{font-family:system-ui,"Noto Sans CJK SC",sans-serif;margin:1em 2em;color:#222;max-width:1200px}
nav{margin-bottom:1em}section{margin-bottom:2em}
#charts{display:flex;flex-wrap:wrap;gap:1em}.chart{border:1px solid #ddd;padding:.5em;width:530px}
.legend{display:flex;flex-wrap:wrap}
.chart h3{margin:.2em 0;font-size:1em}.legend span{margin-right:1em;font-size:.8em;white-space:nowrap}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}
.controls label{margin-right:1em}.group{border:1px solid #bbb;margin:.8em 0;padding:.5em}
.sample{border-top:1px dashed #ccc;padding:.4em 0}.turn{margin:.2em 0;padding:.3em;background:#f6f6f6}
.role{font-weight:bold;margin-right:.5em;color:#555}.response{background:#eef6ff;padding:.3em}
.failed{background:#ffecec}pre{white-space:pre-wrap;margin:0;font-family:inherit}
.tool{background:#fff7e0;border-left:3px solid #e0a000;padding:.2em}.gold{font-weight:bold;color:#070}
.hint{font-size:.75em;color:#888}.plot{cursor:crosshair;user-select:none}
.error{color:#a00;font-weight:bold}.info{margin:.3em 0}.sides{display:flex;flex-wrap:wrap;gap:1em}
tr.goldrow td{background:#e6f6e6;font-weight:bold}
"""

JS = r"""
"use strict";
const data = id => JSON.parse(document.getElementById("data-" + id).textContent);
const INFO = data("info"), CURVES = data("curves"), EVAL = data("eval"), EMBEDDED = data("samples");
const SAMPLES = EMBEDDED.steps, CONVERSATIONS = EMBEDDED.conversations;  // a sample's conversation: an index
// the SVG namespace, taken from an <svg> the HTML parser made (no URL written in the page)
const SVG = (() => {
  const d = document.createElement("div"); d.innerHTML = "<svg></svg>"; return d.firstChild.namespaceURI;
})();
const COLORS = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2","#7f7f7f","#bcbd22","#17becf"];
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  return e;
}
function fmt(v) {
  if (typeof v !== "number") return String(v);
  return Math.abs(v) >= 1000 || Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
}
// a chart; `range` ([x0, x1]) zooms it: drag across the plot to zoom, double-click to go back
function drawChart(chart, range) {
  const W = 520, H = 240, L = 55, R = 10, T = 10, B = 25;
  const box = el("div", null, "chart"); box.appendChild(el("h3", chart.title));
  const inRange = p => !range || (p[0] >= range[0] && p[0] <= range[1]);
  const series = Object.entries(chart.series).map(([k, pts]) => [k, pts.filter(inRange)]);
  const all = series.map(([, pts]) => pts).flat();
  if (!all.length) return drawChart(chart, null);
  let x0 = Math.min(...all.map(p => p[0])), x1 = Math.max(...all.map(p => p[0]));
  let y0 = Math.min(...all.map(p => p[1])), y1 = Math.max(...all.map(p => p[1]));
  if (range) { x0 = range[0]; x1 = range[1]; }
  if (x1 === x0) { x0 -= 1; x1 += 1; } if (y1 === y0) { y0 -= 1; y1 += 1; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const s = svg("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "plot"});
  s.appendChild(svg("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#999"}));
  for (const [v, y] of [[y0, H - B], [y1, T + 10]]) {
    const t = svg("text", {x: 2, y: y, "font-size": 10}); t.textContent = fmt(v); s.appendChild(t);
  }
  for (const [v, x, cls] of [[x0, L, "xmin"], [x1, W - R - 30, "xmax"]]) {
    const t = svg("text", {x: x, y: H - 8, "font-size": 10, class: cls}); t.textContent = "step " + fmt(v);
    s.appendChild(t);
  }
  const legend = el("div", null, "legend");
  series.forEach(([key, pts], i) => {
    const c = COLORS[i % COLORS.length];
    const d = pts.map((p, j) => (j ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
    const path = svg("path", {d: d, fill: "none", stroke: c, "stroke-width": 1.5, "data-key": key});
    const title = svg("title", {}); title.textContent = key; path.appendChild(title); s.appendChild(path);
    if (pts.length < 20)
      for (const p of pts) s.appendChild(svg("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: c}));
    const item = el("span", "\u25A0 " + key); item.style.color = c; legend.appendChild(item);
  });
  // zoom: the step range under a drag; the SVG's own coordinates, whatever its size on screen
  const band = svg("rect", {y: T, height: H - T - B, width: 0, fill: "#1f77b4", opacity: 0.15});
  s.appendChild(band);
  const stepAt = ev => {
    const r = s.getBoundingClientRect(), x = Math.max(L, Math.min(W - R, (ev.clientX - r.left) * W / r.width));
    return {x: x, step: x0 + (x - L) / (W - L - R) * (x1 - x0)};
  };
  let start = null;
  s.addEventListener("mousedown", ev => { start = stepAt(ev); band.setAttribute("x", start.x); ev.preventDefault(); });
  s.addEventListener("mousemove", ev => {
    if (!start) return; const now = stepAt(ev);
    band.setAttribute("x", Math.min(start.x, now.x)); band.setAttribute("width", Math.abs(now.x - start.x));
  });
  s.addEventListener("mouseup", ev => {
    if (!start) return; const end = stepAt(ev), a = Math.min(start.step, end.step), b = Math.max(start.step, end.step);
    start = null;
    if (b - a > (x1 - x0) / 100) box.replaceWith(drawChart(chart, [a, b]));
    else band.setAttribute("width", 0);
  });
  s.addEventListener("dblclick", () => box.replaceWith(drawChart(chart, null)));
  box.appendChild(s); box.appendChild(legend);
  box.appendChild(el("div", range ? "zoomed: double-click to see all steps" : "drag across to zoom", "hint"));
  return box;
}
function kvTable(obj) {
  const t = el("table");
  for (const [k, v] of Object.entries(obj)) {
    const tr = el("tr"); tr.appendChild(el("th", k)); const td = el("td");
    if (v !== null && typeof v === "object") td.appendChild(kvTable(v)); else td.appendChild(el("pre", fmt(v)));
    tr.appendChild(td); t.appendChild(tr);
  }
  return t;
}
// an object whose object values share number keys (a verdict's two sides' scores) as one table, rows the
// keys and a column per side; its other entries above it
function matrixOrKv(obj) {
  const sides = Object.entries(obj).filter(([, v]) => v && typeof v === "object" && !Array.isArray(v)
    && Object.values(v).every(x => typeof x === "number"));
  if (sides.length < 2) return kvTable(obj);
  const box = el("div"), plain = Object.fromEntries(Object.entries(obj).filter(([k]) => !sides.some(([s]) => s === k)));
  if (Object.keys(plain).length) box.appendChild(kvTable(plain));
  const rows = []; for (const [, v] of sides) for (const r in v) if (!rows.includes(r)) rows.push(r);
  const t = el("table", null, "matrix"), head = el("tr"); head.appendChild(el("th", ""));
  for (const [name] of sides) head.appendChild(el("th", name)); t.appendChild(head);
  for (const r of rows) {
    const tr = el("tr"); tr.appendChild(el("th", r));
    for (const [, v] of sides) tr.appendChild(el("td", r in v ? fmt(v[r]) : ""));
    t.appendChild(tr);
  }
  box.appendChild(t); return box;
}
function evalTable() {
  const host = document.getElementById("evaltable");
  if (!EVAL || !EVAL.systems) { host.appendChild(el("p", "No eval.json in this run folder.")); return; }
  const metrics = [];
  for (const m of Object.values(EVAL.systems))
    for (const k in m) if (k + "_low" in m && !metrics.includes(k)) metrics.push(k);
  const t = el("table"), head = el("tr"); head.appendChild(el("th", "system"));
  for (const k of metrics) head.appendChild(el("th", k + " [95% interval]"));
  t.appendChild(head);
  for (const [name, m] of Object.entries(EVAL.systems)) {
    const tr = el("tr"); tr.appendChild(el("td", name));
    for (const k of metrics)
      tr.appendChild(el("td", k in m ? `${fmt(m[k])} [${fmt(m[k + "_low"])}, ${fmt(m[k + "_high"])}]` : ""));
    t.appendChild(tr);
  }
  host.appendChild(t);
  if (EVAL.comparisons) {
    host.appendChild(el("h3", "Paired differences (a - b)"));
    const c = el("table"), h = el("tr");
    for (const k of ["a", "b", "metric", "diff [95% interval]", "a better", "b better", "tie"])
      h.appendChild(el("th", k));
    c.appendChild(h);
    for (const cmp of Object.values(EVAL.comparisons))
      for (const [metric, r] of Object.entries(cmp)) {
        if (r === null || typeof r !== "object") continue;
        const tr = el("tr");
        const interval = `${fmt(r.diff)} [${fmt(r.low)}, ${fmt(r.high)}]`;
        for (const v of [cmp.a, cmp.b, metric, interval, r.a_better, r.b_better, r.tie])
          tr.appendChild(el("td", v === undefined ? "" : fmt(v)));
        c.appendChild(tr);
      }
    host.appendChild(c);
  }
}
const isFailed = s => s.failed === true || ((s.score === null || s.score === undefined) && s.unscored !== true);
// a sample no TRL-style function scored: trained with advantage 0, shown as "unscored"
const hasScore = s => typeof s.score === "number";
const scoreText = s => isFailed(s) ? "failed" : s.unscored === true ? "unscored" : fmt(s.score);
const SHOWN = new Set(["conversation", "response", "transcript", "score", "group", "step", "failed", "error",
  "unscored", "reward_info", "reward_parts"]);
// a list of records (retrieved documents) as a table; a row with gold: true is marked
function listTable(title, items) {
  const box = el("div"); box.appendChild(el("b", title));
  const cols = []; for (const it of items) for (const k in it) if (!cols.includes(k)) cols.push(k);
  const t = el("table", null, "docs"), head = el("tr"); head.appendChild(el("th", "#"));
  for (const k of cols) head.appendChild(el("th", k)); t.appendChild(head);
  items.forEach((it, i) => {
    const tr = el("tr", null, it.gold === true ? "goldrow" : ""); tr.appendChild(el("td", i + 1));
    for (const k of cols) {
      const v = it[k];
      tr.appendChild(el("td", k === "gold" ? (v === true ? "\u2605 gold" : v === false ? "" : fmt(v))
        : v !== null && typeof v === "object" ? JSON.stringify(v) : v === undefined ? "" : fmt(v)));
    }
    t.appendChild(tr);
  });
  box.appendChild(t); return box;
}
// the reward's own values (retrieved documents side by side, the judge's verdict, an extracted answer)
function rewardInfo(info) {
  const box = el("div", null, "info");
  const records = v => Array.isArray(v) && v.length > 0 && v.every(x => x && typeof x === "object");
  const lists = Object.entries(info).filter(([, v]) => records(v));
  const rest = Object.entries(info).filter(([k]) => !lists.some(([l]) => l === k));
  const plain = rest.filter(([, v]) => v === null || typeof v !== "object");
  if (plain.length) {
    const t = el("table");
    for (const [k, v] of plain) {
      const tr = el("tr"); tr.appendChild(el("th", k)); tr.appendChild(el("td", fmt(v))); t.appendChild(tr);
    }
    box.appendChild(t);
  }
  if (lists.length) {
    const sides = el("div", null, "sides");
    for (const [k, v] of lists) sides.appendChild(listTable(k, v));
    box.appendChild(sides);
  }
  for (const [k, v] of rest.filter(([, v]) => v !== null && typeof v === "object")) {
    const d = el("div"); d.appendChild(el("b", k)); d.appendChild(matrixOrKv(v)); box.appendChild(d);
  }
  return box;
}
function sampleView(s) {
  const box = el("div", null, "sample" + (isFailed(s) ? " failed" : ""));
  box.dataset.step = s.step;
  const head = el("div"); head.appendChild(el("b", "score " + scoreText(s)));
  const parts = Object.entries(s).filter(([k, v]) => typeof v === "number" && !SHOWN.has(k))
    .concat(Object.entries(s.reward_parts || {}).filter(([, v]) => typeof v === "number"));
  if (parts.length) head.appendChild(el("span", "  " + parts.map(([k, v]) => k + "=" + fmt(v)).join("  ")));
  box.appendChild(head);
  if (s.error) box.appendChild(el("div", "reward failed: " + s.error, "error"));
  const r = el("div", null, "response");
  r.appendChild(el("span", "response", "role")); r.appendChild(el("pre", s.response));
  box.appendChild(r);
  if (s.transcript) {  // an agent episode: tool calls and results set apart
    const t = el("div", null, "turn"); t.appendChild(el("span", "transcript", "role"));
    for (const part of s.transcript) {
      const p = el("div", null, part.kind === "model" ? "" : "tool " + part.kind);
      if (part.kind !== "model")
        p.appendChild(el("span", part.kind === "tool_call" ? "tool call" : "tool result", "role"));
      p.appendChild(el("pre", part.text)); t.appendChild(p);
    }
    box.appendChild(t);
  }
  if (s.reward_info && typeof s.reward_info === "object") box.appendChild(rewardInfo(s.reward_info));
  const rest = Object.fromEntries(Object.entries(s).filter(([k, v]) => !SHOWN.has(k) && typeof v !== "number"));
  if (Object.keys(rest).length) box.appendChild(kvTable(rest));
  return box;
}
function conversationView(s) {
  const box = el("div", null, "conversation");
  for (const turn of CONVERSATIONS[s.conversation] || []) {
    const t = el("div", null, "turn");
    t.appendChild(el("span", turn.role, "role")); t.appendChild(el("pre", turn.content));
    box.appendChild(t);
  }
  return box;
}
// each prompt's groups by step, for "what changed since an early step" under a group
const promptKey = s => s.conversation;
const SEEN = new Map();
for (const st of Object.keys(SAMPLES).map(Number).sort((a, b) => a - b))
  for (const s of SAMPLES[st]) {
    const k = promptKey(s); if (!SEEN.has(k)) SEEN.set(k, new Map());
    const bySteps = SEEN.get(k); if (!bySteps.has(st)) bySteps.set(st, []); bySteps.get(st).push(s);
  }
const meanScore = ss => { const v = ss.filter(hasScore).map(s => s.score);
  return v.length ? fmt(v.reduce((a, b) => a + b, 0) / v.length) : "failed"; };
function earlier(step, members) {
  const bySteps = SEEN.get(promptKey(members[0])), first = bySteps ? Math.min(...bySteps.keys()) : Number(step);
  if (first >= Number(step)) return null;
  const old = bySteps.get(first), d = el("details", null, "earlier");
  d.appendChild(el("summary", `same prompt at step ${first}: mean score ${meanScore(old)} -> ${meanScore(members)}`));
  for (const s of old) d.appendChild(el("pre", `${scoreText(s)}  ${s.response}`));
  return d;
}
function render() {
  const step = document.getElementById("step").value, rows = SAMPLES[step] || [];
  const lo = parseFloat(document.getElementById("minscore").value);
  const hi = parseFloat(document.getElementById("maxscore").value);
  const failedOnly = document.getElementById("failed").checked, zeroVar = document.getElementById("zerovar").checked;
  const groups = new Map();
  for (const s of rows) { const g = s.group ?? "?"; if (!groups.has(g)) groups.set(g, []); groups.get(g).push(s); }
  const host = document.getElementById("samplelist"); host.replaceChildren();
  let shown = 0;
  for (const [g, members] of groups) {
    const scores = members.filter(hasScore).map(s => s.score);
    const flat = scores.length > 0 && scores.every(v => v === scores[0]);
    if (zeroVar && !flat) continue;
    const kept = members.filter(s => (!failedOnly || isFailed(s)) &&
      (isNaN(lo) || (hasScore(s) && s.score >= lo)) && (isNaN(hi) || (hasScore(s) && s.score <= hi)));
    if (!kept.length) continue;
    const box = el("div", null, "group");
    const title = `step ${step}, group ${g}: ${members.length} candidates` + (flat ? " (zero variance)" : "");
    box.appendChild(el("h3", title));
    const before = earlier(step, members); if (before) box.appendChild(before);
    box.appendChild(conversationView(members[0]));  // the group's prompt, shared by its candidates
    for (const s of kept) box.appendChild(sampleView(s));
    host.appendChild(box); shown += kept.length;
  }
  document.getElementById("count").textContent = `${shown} of ${rows.length} samples shown`;
}
function init() {
  const charts = document.getElementById("charts");
  if (!CURVES.length) charts.appendChild(el("p", "No metrics.jsonl in this run folder."));
  for (const c of CURVES) charts.appendChild(drawChart(c));
  evalTable();
  const sel = document.getElementById("step");
  for (const st of INFO.embedded) { const o = el("option", "step " + st); o.value = String(st); sel.appendChild(o); }
  sel.value = String(INFO.embedded[INFO.embedded.length - 1] ?? "");
  const which = INFO.every > 1
    ? `every ${INFO.every_ordinal} step (counted back from the last) is embedded, ${INFO.embedded.length} steps`
    : "all are embedded";
  document.getElementById("subsample").textContent =
    `${INFO.sample_steps} steps saved samples; ${which}. Texts over ${INFO.max_text} characters are cut.`;
  for (const id of ["step", "minscore", "maxscore", "failed", "zerovar"])
    document.getElementById(id).addEventListener("input", render);
  document.getElementById("step").addEventListener("change", render);
  render();
}
init();
"""
