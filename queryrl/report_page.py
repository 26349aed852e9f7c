"""The run page's static parts (:func:`queryrl.report.write_report` fills them): the HTML skeleton with its
``@TITLE@``, ``@CSS@``, ``@JS@``, ``@DATA@``, ``@JUDGE@`` and eval-examples placeholders, the style sheet and the script
that draws the curves, the evaluation table and the rollout inspector from the page's JSON data tags."""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>@TITLE@</title><style>@CSS@</style></head>
<body><h1 id="title">@TITLE@</h1>
<nav><a href="#curves">Curves</a> · <a href="#evalsec">Evaluation</a>@EXAMPLES_NAV@
 · <a href="#inspector">Rollouts</a></nav>
<section id="curves"><h2>Training curves</h2>
<div class="controls"><label>Smoothing <input id="smoothing" type="range" min="0" max="0.99" step="0.01"
value="0.6"> <span id="smoothingvalue">0.60</span></label>
<span class="hint">an exponential moving average (debiased, as TensorBoard's); the raw values are drawn faint
behind. Click a legend entry to hide or show its curve; drag across a plot to zoom.</span></div>
@JUDGE@<div id="charts"></div></section>
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
body{font-family:system-ui,"Noto Sans CJK SC",sans-serif;margin:1em 2em;color:#222}
nav{margin-bottom:1em}section{margin-bottom:2em}
#charts,.multiples{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:1em}
.multiples{grid-template-columns:repeat(auto-fill,minmax(360px,1fr));grid-column:1/-1;gap:.6em}
.family{grid-column:1/-1}.family h3{margin:.3em 0}
.chart{border:1px solid #ddd;padding:.5em;min-width:0}.chart svg{width:100%;height:auto;display:block}
.legend{display:flex;flex-wrap:wrap}
.chart h3{margin:.2em 0;font-size:1em;overflow-wrap:anywhere}
.legend span{margin-right:1em;font-size:.8em;overflow-wrap:anywhere;cursor:pointer}
.legend span.off{opacity:.35;text-decoration:line-through}
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
// ticks at 1, 2 or 5 times a power of ten, about `n` of them over [lo, hi]; `integer`: steps. At most 50
// (counted by index, so that a range at the edge of float precision cannot loop)
function niceTicks(lo, hi, n, integer) {
  const raw = (hi - lo) / Math.max(n, 1);
  if (!(raw > 0) || !isFinite(raw)) return [lo];
  const mag = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / mag;
  let step = (f >= 7.5 ? 10 : f >= 3.5 ? 5 : f >= 1.5 ? 2 : 1) * mag;
  if (integer) step = Math.max(1, Math.round(step));
  const out = [];
  for (let i = Math.ceil(lo / step); i * step <= hi + step * 1e-9 && out.length < 50; i++)
    out.push(Number((i * step).toPrecision(12)));
  return out;
}
// TensorBoard's smoothing: an exponential moving average, debiased for its zero start
function smooth(pts, w) {
  if (!(w > 0)) return pts;
  let last = 0, n = 0;
  return pts.map(p => { last = last * w + (1 - w) * p[1]; n += 1; return [p[0], last / (1 - Math.pow(w, n))]; });
}
function smoothing() { return parseFloat(document.getElementById("smoothing").value) || 0; }
// a chart; `range` ([x0, x1]) zooms it: drag across the plot to zoom, double-click to go back. A legend
// entry hides or shows its curve (chart.hidden).
function drawChart(chart, range) {
  // a small multiple is narrower: drawn near its own size on screen, its labels keep their size
  const W = chart.group ? 380 : 520, H = chart.group ? 210 : 240, L = 52, R = 14, T = 10, B = 30;
  chart.hidden = chart.hidden || new Set();
  const box = el("div", null, "chart"); box.appendChild(el("h3", chart.title));
  const redraw = r => box.replaceWith(drawChart(chart, r));
  const inRange = p => !range || (p[0] >= range[0] && p[0] <= range[1]);
  const series = Object.entries(chart.series).map(([k, pts]) => [k, pts.filter(inRange)]);
  const w = smoothing(), smoothed = new Map(series.map(([k, pts]) => [k, smooth(pts, w)]));
  const all = series.filter(([k]) => !chart.hidden.has(k)).map(([k, pts]) => pts.concat(smoothed.get(k))).flat();
  if (!all.length && range) return drawChart(chart, null);
  let x0 = Math.min(...all.map(p => p[0])), x1 = Math.max(...all.map(p => p[0]));
  let y0 = Math.min(...all.map(p => p[1])), y1 = Math.max(...all.map(p => p[1]));
  if (!all.length) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
  if (range) { x0 = range[0]; x1 = range[1]; }
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 - y0 <= 1e-9 * Math.max(Math.abs(y0), Math.abs(y1))) {  // flat, to float precision
    const m = (y0 + y1) / 2; y0 = m - (Math.abs(m) * 0.1 || 1); y1 = m + (Math.abs(m) * 0.1 || 1);
  }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const s = svg("svg", {viewBox: `0 0 ${W} ${H}`, class: "plot", preserveAspectRatio: "xMidYMid meet",
                        "data-x0": fmt(x0), "data-x1": fmt(x1)});  // the step range shown
  for (const v of niceTicks(y0, y1, 5, false)) {  // y ticks with light grid lines
    s.appendChild(svg("line", {x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: "#eee", class: "grid"}));
    const t = svg("text", {x: L - 4, y: sy(v) + 3, "font-size": 10, "text-anchor": "end", class: "ytick"});
    t.textContent = fmt(v); s.appendChild(t);
  }
  const xt = niceTicks(x0, x1, 6, true).filter(v => v >= x0 && v <= x1);
  const last = Math.floor(x1);  // the last step is labelled too, unless a tick is already close to it
  if (last >= x0 && (!xt.length || sx(last) - sx(xt[xt.length - 1]) > 40)) xt.push(last);
  xt.forEach((v, i) => {  // x ticks: the step, whole; the first and last anchored inside the plot
    s.appendChild(svg("line", {x1: sx(v), x2: sx(v), y1: T, y2: H - B, stroke: "#f3f3f3", class: "grid"}));
    const anchor = sx(v) - L < 15 ? "start" : W - R - sx(v) < 15 ? "end" : "middle";
    const t = svg("text", {x: sx(v), y: H - B + 13, "font-size": 10, "text-anchor": anchor, class: "xtick"});
    t.textContent = fmt(v); s.appendChild(t);
  });
  const label = svg("text", {x: (L + W - R) / 2, y: H - 3, "font-size": 10, "text-anchor": "middle", class: "xlabel"});
  label.textContent = "step"; s.appendChild(label);
  s.appendChild(svg("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#999"}));
  const legend = el("div", null, "legend");
  series.forEach(([key, pts], i) => {
    const c = COLORS[i % COLORS.length], off = chart.hidden.has(key);
    const line = ps => ps.map((p, j) => (j ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
    if (!off && pts.length) {
      if (w > 0) s.appendChild(svg("path", {d: line(pts), fill: "none", stroke: c, "stroke-width": 1, opacity: 0.25,
                                            "data-raw": key}));
      const path = svg("path", {d: line(smoothed.get(key)), fill: "none", stroke: c, "stroke-width": 1.6,
                                "data-key": key});
      const title = svg("title", {}); title.textContent = key; path.appendChild(title); s.appendChild(path);
      if (pts.length < 20)
        for (const p of pts) s.appendChild(svg("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: c}));
    }
    const item = el("span", "\u25A0 " + key, off ? "off" : ""); item.style.color = c;
    item.title = off ? "click to show" : "click to hide";
    item.addEventListener("click", () => { off ? chart.hidden.delete(key) : chart.hidden.add(key); redraw(range); });
    legend.appendChild(item);
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
    if (b - a > (x1 - x0) / 100) redraw([a, b]);
    else band.setAttribute("width", 0);
  });
  s.addEventListener("dblclick", () => redraw(null));
  box.appendChild(s); box.appendChild(legend);
  box.appendChild(el("div", range ? "zoomed: double-click to see all steps" : "drag across to zoom", "hint"));
  return box;
}
// every chart, small multiples under their family's title
function drawCharts() {
  const host = document.getElementById("charts"); host.replaceChildren();
  if (!CURVES.length) { host.appendChild(el("p", "No metrics.jsonl in this run folder.")); return; }
  const families = new Map();
  for (const c of CURVES) {
    if (!c.group) { host.appendChild(drawChart(c)); continue; }
    if (!families.has(c.group)) {
      const f = el("div", null, "family"); f.appendChild(el("h3", c.group));
      const grid = el("div", null, "multiples"); f.appendChild(grid); host.appendChild(f); families.set(c.group, grid);
    }
    families.get(c.group).appendChild(drawChart(c));
  }
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
// the eval table and its paired differences; a comparison page (EVAL a list of {run, eval}) puts one column
// per run side by side
function evalTable() {
  const host = document.getElementById("evaltable");
  if (!Array.isArray(EVAL)) { oneEval(host, EVAL, "No eval.json in this run folder."); return; }
  const sides = el("div", null, "sides");
  for (const r of EVAL) {
    const col = el("div", null, "evalrun"); col.appendChild(el("h3", r.run));
    oneEval(col, r.eval, "No eval.json in this run folder."); sides.appendChild(col);
  }
  host.appendChild(sides);
}
function oneEval(host, E, none) {
  if (!E || !E.systems) { host.appendChild(el("p", none)); return; }
  const metrics = [];
  for (const m of Object.values(E.systems))
    for (const k in m) if (k + "_low" in m && !metrics.includes(k)) metrics.push(k);
  const notes = E.notes || {};  // why a part is empty (eval.json's notes), said in its place
  if (notes.retrieval || !metrics.length)
    host.appendChild(el("p", notes.retrieval || "No metric with an interval in eval.json.", "note"));
  if (metrics.length) {
    const t = el("table"), head = el("tr"); head.appendChild(el("th", "system"));
    for (const k of metrics) head.appendChild(el("th", k + " [95% interval]"));
    t.appendChild(head);
    for (const [name, m] of Object.entries(E.systems)) {
      const tr = el("tr"); tr.appendChild(el("td", name));
      for (const k of metrics)
        tr.appendChild(el("td", k in m ? `${fmt(m[k])} [${fmt(m[k + "_low"])}, ${fmt(m[k + "_high"])}]` : ""));
      t.appendChild(tr);
    }
    host.appendChild(t);
  }
  if (E.comparisons && Object.keys(E.comparisons).length) {
    host.appendChild(el("h3", "Paired differences (a - b)"));
    const c = el("table"), h = el("tr");
    for (const k of ["a", "b", "metric", "diff [95% interval]", "a better", "b better", "tie"])
      h.appendChild(el("th", k));
    c.appendChild(h);
    for (const cmp of Object.values(E.comparisons))
      for (const [metric, r] of Object.entries(cmp)) {
        if (r === null || typeof r !== "object") continue;
        const tr = el("tr");
        const interval = `${fmt(r.diff)} [${fmt(r.low)}, ${fmt(r.high)}]`;
        for (const v of [cmp.a, cmp.b, metric, interval, r.a_better, r.b_better, r.tie])
          tr.appendChild(el("td", v === undefined ? "" : fmt(v)));
        c.appendChild(tr);
      }
    if (notes.comparisons || c.children.length < 2)
      host.appendChild(el("p", notes.comparisons || notes.retrieval || "No pair has a difference to show.", "note"));
    if (c.children.length > 1) host.appendChild(c);  // never a table of headers only
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
  drawCharts();
  document.getElementById("smoothing").addEventListener("input", ev => {
    document.getElementById("smoothingvalue").textContent = Number(ev.target.value).toFixed(2);
    drawCharts();
  });
  evalTable();
  if (INFO.compare) {  // runs side by side: no rollout inspector
    document.getElementById("inspector").hidden = true;
    document.querySelector('nav a[href="#inspector"]').hidden = true;
    return;
  }
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
