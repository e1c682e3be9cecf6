"""A static site of a catalogue: one folder a team can publish, no server needed (it works from file://).

    OUT/index.html        every campaign, with filters (model, hardware, vLLM version, dates, text), a link to
                          each campaign's report (copied into OUT/reports/ where the campaign has one) and a
                          choice of campaigns to overlay
    OUT/overlay.html      the chosen campaigns' points (`?ids=a,b`): per like-for-like group (model, workload,
                          load variable, hardware) one figure of throughput against median TTFT, each
                          campaign's points and its Pareto front, and one of throughput against the load, a
                          curve per campaign and configuration; groups that hold only some of the chosen
                          campaigns are drawn apart and say what differs ("not comparable: ...")
    OUT/history.html      every configuration measured by more than one campaign, oldest to newest, with the
                          newest campaign's verdict against the one before it (`history`), regressions first
    OUT/history-<n>.html  one configuration (on one workload and hardware) over the campaigns: a line per load,
                          a campaign shown worse than the one before it ringed in red, and the table of means
    OUT/data/<id>.js      one campaign's points (mean over valid runs), loaded by the overlay as a script

Written whole: the folder is built beside OUT and put in its place at the end.
"""

from __future__ import annotations

import html
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from raysweep.catalog.fields import LABELS
from raysweep.catalog.history import Series, history
from raysweep.catalog.store import Catalog, state_of

__all__ = ["write_site"]

GROUP = ("model", "dataset", "dataset_params", "input_len", "output_len", "load_variable", "hardware")

_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#f2f2f2}
tr.worse td,td.worse{background:#fde2e2}nav a{margin-right:1em}.filters label{margin-right:1em}
.note{color:#a33}figure{margin:1em 0}svg{background:#fff;border:1px solid #ddd}"""


def _page(title: str, body: str, script: str = "") -> str:
    nav = '<nav><a href="index.html">campaigns</a><a href="history.html">history</a></nav>'
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{nav}<h1>{html.escape(title)}</h1>{body}"
            f"<script>{script}</script></body></html>")


def _day(ts: Any) -> str:
    import datetime

    if ts is None or (isinstance(ts, float) and math.isnan(ts)):
        return ""
    return datetime.datetime.fromtimestamp(float(ts), datetime.timezone.utc).strftime("%Y-%m-%d")


def write_site(catalog: Catalog, out: str | Path) -> Path:
    """The site of `catalog` in `out` (replaced whole)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # named as `out` is (relative or not): a rename between an absolute and a relative name can cross mounts
    tmp = out.parent / Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent)).name
    try:
        (tmp / "data").mkdir()
        (tmp / "reports").mkdir()
        campaigns = sorted(catalog.campaigns.values(), key=lambda c: (c.get("first_date") or 0.0, c["name"]))
        _write_data(catalog, tmp / "data")
        (tmp / "index.html").write_text(_index(campaigns, tmp / "reports"))
        (tmp / "overlay.html").write_text(_overlay({c["id"]: c["name"] for c in campaigns}))
        page, pages = _history(catalog)
        (tmp / "history.html").write_text(page)
        for name, text in pages:
            (tmp / name).write_text(text)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_data(catalog: Catalog, data: Path) -> None:
    """Each campaign's points, as a script that adds them to `window.RS`."""
    keys = ", ".join(GROUP)
    df = catalog.query(
        f"SELECT campaign_id, {keys}, config, load_value, avg(output_throughput) AS thr, "
        "avg(median_ttft_ms) AS ttft, count(*) AS runs FROM runs WHERE coalesce(validity_ok, true) "
        "AND NOT coalesce(client_limited, false) AND output_throughput IS NOT NULL AND median_ttft_ms IS NOT NULL "
        f"GROUP BY ALL ORDER BY campaign_id, config, load_value")
    for c in catalog.campaigns:
        (data / f"{c}.js").write_text(f"RS.points[{json.dumps(c)}] = [];\n")
    for cid, g in df.groupby("campaign_id", sort=False):
        pts = []
        for row in g.itertuples(index=False):
            rec = row._asdict()
            pts.append({"g": {k: _plain(rec[k]) for k in GROUP}, "c": _plain(rec["config"]),
                        "l": _plain(rec["load_value"]), "x": round(float(rec["ttft"]), 4),
                        "y": round(float(rec["thr"]), 4)})
        (data / f"{cid}.js").write_text(f"RS.points[{json.dumps(cid)}] = {json.dumps(pts, allow_nan=False)};\n")


def _plain(value: object) -> Any:
    if value is None:
        return None
    try:
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    if isinstance(value, float):
        return value
    return str(value)


def _index(campaigns: list[dict[str, Any]], reports: Path) -> str:
    rows = []
    for c in campaigns:
        report = Path(c["path"]) / "report.html"
        link = ""
        if report.is_file():
            shutil.copyfile(report, reports / f"{c['id']}.html")
            link = f'<a href="reports/{html.escape(c["id"])}.html">report</a>'
        attrs = {"model": ", ".join(c["models"]), "hardware": ", ".join(c["hardware"]),
                 "vllm": ", ".join(c["vllm"]), "date": _day(c.get("first_date"))}
        data = " ".join(f'data-{k}="{html.escape(v)}"' for k, v in attrs.items())
        rows.append(f'<tr {data}><td><input type="checkbox" value="{html.escape(c["id"])}"></td>'
                    f'<td>{html.escape(c["name"])}</td><td>{html.escape(c["source"])}</td>'
                    f'<td>{html.escape(attrs["model"])}</td><td>{html.escape(attrs["hardware"])}</td>'
                    f'<td>{html.escape(attrs["vllm"])}</td><td>{attrs["date"]}</td><td>{c["runs"]}</td>'
                    f'<td>{html.escape(state_of(c))}</td><td>{link}</td>'
                    f'<td class="answer">{"<br>".join(html.escape(a) for a in c.get("answer") or []) or "-"}</td></tr>')

    def options(key: str) -> str:
        values = sorted({v for c in campaigns for v in c[key]})
        return "".join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in values)

    body = (f'<p>{len(campaigns)} campaigns, {sum(c["runs"] for c in campaigns)} runs. Choose campaigns and '
            'overlay them: only like-for-like points share a figure.</p><div class="filters">'
            f'<label>model <select id="f-model"><option value="">any</option>{options("models")}</select></label>'
            f'<label>hardware <select id="f-hardware"><option value="">any</option>{options("hardware")}'
            '</select></label>'
            f'<label>vLLM <select id="f-vllm"><option value="">any</option>{options("vllm")}</select></label>'
            '<label>from <input type="date" id="f-from"></label><label>to <input type="date" id="f-to"></label>'
            '<label>name <input type="search" id="f-text"></label>'
            '<button id="overlay">overlay the chosen campaigns</button> <span id="shown"></span></div>'
            '<table id="campaigns"><thead><tr><th></th><th>campaign</th><th>source</th><th>model</th>'
            '<th>hardware</th><th>vLLM</th><th>first run</th><th>runs</th><th>state</th><th>report</th>'
            '<th>its answer</th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table>')
    script = """
function has(list, v) { return !v || list.split(', ').indexOf(v) >= 0; }
function filter() {
  var m = document.getElementById('f-model').value, h = document.getElementById('f-hardware').value,
      v = document.getElementById('f-vllm').value, a = document.getElementById('f-from').value,
      b = document.getElementById('f-to').value, t = document.getElementById('f-text').value.toLowerCase();
  var n = 0;
  document.querySelectorAll('#campaigns tbody tr').forEach(function (r) {
    var d = r.dataset, ok = has(d.model, m) && has(d.hardware, h) && has(d.vllm, v) &&
      (!a || d.date >= a) && (!b || d.date <= b) && r.cells[1].textContent.toLowerCase().indexOf(t) >= 0;
    r.style.display = ok ? '' : 'none'; if (ok) n++;
  });
  document.getElementById('shown').textContent = n + ' shown';
}
['f-model', 'f-hardware', 'f-vllm', 'f-from', 'f-to', 'f-text'].forEach(function (id) {
  document.getElementById(id).addEventListener('input', filter);
  document.getElementById(id).addEventListener('change', filter);
});
document.getElementById('overlay').addEventListener('click', function () {
  var ids = Array.from(document.querySelectorAll('#campaigns input:checked')).map(function (i) { return i.value; });
  location.href = 'overlay.html?ids=' + encodeURIComponent(ids.join(','));
});
filter();
"""
    return _page("raysweep catalogue", body, script)


_LABELS_JS = json.dumps(LABELS)
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")

_OVERLAY_JS = """
var RS = {points: {}};
var LABELS = %s;
var GROUP = %s;
var COLORS = %s;
var ids = (new URLSearchParams(location.search).get('ids') || '').split(',').filter(Boolean);
var left = ids.length;
function key(g) { return GROUP.map(function (k) { return String(g[k]); }).join('|'); }
function front(pts) {
  var s = pts.slice().sort(function (a, b) { return a.x - b.x || b.y - a.y; }), out = [], best = -Infinity;
  s.forEach(function (p) { if (p.y > best) { out.push(p); best = p.y; } });
  return out;
}
function svg(tag, attrs) {
  var e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
  return e;
}
var DASHES = ['', '6,3', '2,3', '8,3,2,3'];  // the configurations of one campaign on the load curves
function axes(xs, ys, xlabel, ylabel, cls) {
  // an SVG with both axes, their labels and a scale of five ticks a side, from 0 (y) and the data's range (x)
  var W = 640, H = 360, P = 50;
  var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs) || 1, y1 = Math.max.apply(null, ys) || 1;
  var sx = function (x) { return P + (x - x0) / ((x1 - x0) || 1) * (W - 2 * P); };
  var sy = function (y) { return H - P - y / y1 * (H - 2 * P); };
  var s = svg('svg', {width: W, height: H, 'class': cls});
  s.appendChild(svg('line', {x1: P, y1: H - P, x2: W - P, y2: H - P, stroke: '#888'}));
  s.appendChild(svg('line', {x1: P, y1: P, x2: P, y2: H - P, stroke: '#888'}));
  var xl = svg('text', {x: W / 2, y: H - 10, 'text-anchor': 'middle', 'font-size': 12});
  xl.textContent = xlabel; s.appendChild(xl);
  var yl = svg('text', {x: 12, y: 20, 'font-size': 12}); yl.textContent = ylabel; s.appendChild(yl);
  for (var i = 0; i <= 4; i++) {
    var xv = x0 + i * (x1 - x0) / 4, yv = i * y1 / 4;
    var xt = svg('text', {x: sx(xv), y: H - P + 14, 'text-anchor': 'middle', 'font-size': 10, 'class': 'tick'});
    xt.textContent = Number(xv.toPrecision(3)); s.appendChild(xt);
    var yt = svg('text', {x: P - 4, y: sy(yv) + 3, 'text-anchor': 'end', 'font-size': 10, 'class': 'tick'});
    yt.textContent = Number(yv.toPrecision(3)); s.appendChild(yt);
    s.appendChild(svg('line', {x1: sx(xv), y1: H - P, x2: sx(xv), y2: H - P + 4, stroke: '#888'}));
    s.appendChild(svg('line', {x1: P - 3, y1: sy(yv), x2: P, y2: sy(yv), stroke: '#888'}));
  }
  return {svg: s, sx: sx, sy: sy};
}
function dot(a, x, y, color, m, p) {
  var c = svg('circle', {cx: a.sx(x), cy: a.sy(y), r: 3, fill: color, 'fill-opacity': 0.5});
  var t = svg('title', {});
  t.textContent = (NAMES[m] || m) + ' ' + p.c + ' load ' + p.l + ': ' + p.y + ' tok/s, ' + p.x + ' ms';
  c.appendChild(t);
  return c;
}
function draw() {
  var main = document.getElementById('figures'), groups = {};
  ids.forEach(function (id, i) {
    (RS.points[id] || []).forEach(function (p) {
      var k = key(p.g);
      (groups[k] = groups[k] || {g: p.g, by: {}}).by[id] = (groups[k].by[id] || []).concat([p]);
    });
  });
  var keys = Object.keys(groups);
  // a chosen campaign with no valid run (every run flagged, or none finished) is said, never dropped silently
  var empty = ids.filter(function (id) { return !(RS.points[id] || []).length; });
  document.getElementById('summary').textContent = ids.length + ' campaigns chosen, ' + keys.length +
      ' like-for-like group(s)' + (empty.length ? '; not drawn, no valid run (every run flagged, or none ' +
      'finished): ' + empty.map(function (m) { return NAMES[m] || m; }).join(', ') : '');
  keys.forEach(function (k) {
    var grp = groups[k], fig = document.createElement('figure'), members = Object.keys(grp.by);
    var cap = document.createElement('figcaption');
    cap.textContent = GROUP.map(function (f) { return (LABELS[f] || f) + ' ' + grp.g[f]; }).join(', ');
    fig.appendChild(cap);
    if (members.length < ids.length) {
      var note = document.createElement('p'); note.className = 'note';
      var other = keys.filter(function (o) { return o !== k; })[0];
      var why = other ? GROUP.filter(function (f) { return String(groups[other].g[f]) !== String(grp.g[f]); })
        .map(function (f) { return 'not comparable: ' + (LABELS[f] || f) + ' ' + grp.g[f] + ' vs ' +
          groups[other].g[f]; }).join('; ') : '';
      note.textContent = 'only ' + members.map(function (m) { return NAMES[m] || m; }).join(', ') +
        ' measured this' + (why ? ' (' + why + ')' : '');
      fig.appendChild(note);
    }
    var all = [].concat.apply([], members.map(function (m) { return grp.by[m]; }));
    var color = function (m) { return COLORS[ids.indexOf(m) %% COLORS.length]; };
    // output throughput against median TTFT: each campaign's points and its Pareto front
    var a = axes(all.map(function (p) { return p.x; }), all.map(function (p) { return p.y; }), 'median TTFT (ms)',
                 'output tokens/s', 'overlay');
    members.forEach(function (m) {
      var g = svg('g', {'data-campaign': m});
      grp.by[m].forEach(function (p) { g.appendChild(dot(a, p.x, p.y, color(m), m, p)); });
      g.appendChild(svg('polyline', {points: front(grp.by[m]).map(function (p) { return a.sx(p.x) + ',' + a.sy(p.y); })
        .join(' '), fill: 'none', stroke: color(m), 'stroke-width': 2, 'class': 'front'}));
      a.svg.appendChild(g);
    });
    // output throughput against the load: one curve per campaign and configuration
    var b = axes(all.map(function (p) { return Number(p.l); }), all.map(function (p) { return p.y; }),
                 (LABELS.load_value || 'load') + ' (' + grp.g.load_variable + ')', 'output tokens/s', 'curves');
    // a configuration has one line style in the whole figure (its place among the group's configurations)
    var configs = Object.keys(all.reduce(function (o, p) { o[p.c] = 1; return o; }, {})).sort();
    members.forEach(function (m) {
      var g = svg('g', {'data-campaign': m}), byConfig = {};
      grp.by[m].forEach(function (p) { (byConfig[p.c] = byConfig[p.c] || []).push(p); });
      Object.keys(byConfig).sort().forEach(function (c) {
        var j = configs.indexOf(c);
        var pts = byConfig[c].slice().sort(function (u, v) { return Number(u.l) - Number(v.l); });
        pts.forEach(function (p) { g.appendChild(dot(b, Number(p.l), p.y, color(m), m, p)); });
        var line = svg('polyline', {points: pts.map(function (p) { return b.sx(Number(p.l)) + ',' + b.sy(p.y); })
          .join(' '), fill: 'none', stroke: color(m), 'stroke-width': 1.5, 'class': 'curve', 'data-config': c,
          'stroke-dasharray': DASHES[j %% DASHES.length]});
        var t = svg('title', {}); t.textContent = (NAMES[m] || m) + ' ' + c; line.appendChild(t);
        g.appendChild(line);
      });
      b.svg.appendChild(g);
    });
    var legend = document.createElement('p');
    legend.className = 'legend';
    legend.innerHTML = 'colour: campaign ' + members.map(function (m) {
      return '<span style="color:' + color(m) + '">&#9632; ' +
        (NAMES[m] || m).replace(/</g, '&lt;') + '</span>';
    }).join(' ') + '<br>line (load curves): configuration ' + configs.map(function (c, j) {
      return '<span class="dash"><svg width="28" height="8"><line x1="0" y1="4" x2="28" y2="4" stroke="#444" ' +
        'stroke-width="1.5" stroke-dasharray="' + DASHES[j %% DASHES.length] + '"/></svg> ' +
        String(c).replace(/</g, '&lt;') + '</span>';
    }).join(' ');
    fig.appendChild(a.svg); fig.appendChild(b.svg); fig.appendChild(legend); main.appendChild(fig);
  });
  document.body.setAttribute('data-drawn', 'yes');
}
ids.forEach(function (id) {
  var s = document.createElement('script');
  s.src = 'data/' + encodeURIComponent(id) + '.js';
  s.onload = s.onerror = function () { if (--left === 0) draw(); };
  document.head.appendChild(s);
});
if (!ids.length) { document.getElementById('summary').textContent = 'no campaign chosen: choose some on the index'; }
"""


def _overlay(names: dict[str, str]) -> str:
    body = '<p id="summary"></p><div id="figures"></div>'
    return _page("overlay of chosen campaigns", body,
                 f"var NAMES = {json.dumps(names)};" + _OVERLAY_JS % (_LABELS_JS, json.dumps(list(GROUP)),
                                                                      json.dumps(list(_COLORS))))


def _history(catalog: Catalog) -> tuple[str, list[tuple[str, str]]]:
    """history.html, and one page per configuration (its series at every load: `_config_page`)."""
    series = [s for s in history(catalog, "output_throughput", 0.05) if len(s.points) > 1]
    series.sort(key=lambda s: (not s.regressed, s.config))
    configs: dict[tuple[Any, ...], list[Series]] = {}
    for s in series:
        configs.setdefault(_config_key(s), []).append(s)
    page_of = {key: f"history-{i}.html" for i, key in enumerate(sorted(configs, key=str))}
    rows = []
    for s in series:
        k = s.key
        steps = " → ".join(f"{html.escape(j.campaign)} ({html.escape(j.vllm or '-')}) {j.mean:.4g}"
                           for j in s.points)
        newest = s.points[-1]
        link = f'<a href="{page_of[_config_key(s)]}">{html.escape(s.config)}</a>'
        rows.append(f'<tr class="{"worse" if s.regressed else ""}"><td>{link}</td>'
                    f'<td>{html.escape(str(k["model"]))}</td><td>{html.escape(str(s.dataset))} in {s.input_len} '
                    f'out {s.output_len}</td><td>{html.escape(str(k["load_variable"]))}={k["load_value"]:g}</td>'
                    f'<td>{html.escape(str(k["hardware"]))}</td><td>{steps}</td>'
                    f'<td>{html.escape(newest.text)}</td></tr>')
    body = (f"<p>{len(series)} configurations measured by more than one campaign; output throughput (tokens/s), "
            "each campaign against the one before it (margin 5 %, one-sided at 5 % over all of them); "
            f"{sum(s.regressed for s in series)} with the newest campaign worse, listed first.</p>"
            '<label>filter <input type="search" id="h-text"></label>'
            '<table id="history"><thead><tr><th>configuration</th><th>model</th><th>workload</th><th>load</th>'
            '<th>hardware</th><th>campaigns (vLLM) mean</th><th>newest against the one before</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')
    script = """document.getElementById('h-text').addEventListener('input', function (e) {
  var t = e.target.value.toLowerCase();
  document.querySelectorAll('#history tbody tr').forEach(function (r) {
    r.style.display = r.textContent.toLowerCase().indexOf(t) >= 0 ? '' : 'none'; });
});"""
    pages = [(page_of[key], _config_page(group)) for key, group in configs.items()]
    return _page("history across campaigns", body, script), pages


def _config_key(s: Series) -> tuple[Any, ...]:
    """A configuration on one workload and hardware: its series at every load."""
    k = s.key
    return (k["model"], k["server_settings"], k["workload"], k["load_variable"], k["hardware"])


def _config_page(group: list[Series]) -> str:
    """One configuration's history: output throughput per campaign (oldest to newest), a line per load, a
    campaign shown worse than the one before it ringed in red; then the table of means and verdicts."""
    group = sorted(group, key=lambda s: float(s.key["load_value"]))
    order: dict[str, float] = {}
    for s in group:
        for j in s.points:
            order[j.campaign] = min(order.get(j.campaign, j.date), j.date)
    names = sorted(order, key=lambda c: (order[c], c))
    vllm = {j.campaign: j.vllm or "-" for s in group for j in s.points}
    top = max((j.mean for s in group for j in s.points if math.isfinite(j.mean)), default=1.0) or 1.0
    w, h, pad, right = 860, 380, 60, 160  # the loads' names at the right of their lines
    sx = {c: pad + i * (w - pad - right) / max(len(names) - 1, 1) for i, c in enumerate(names)}

    def sy(v: float) -> float:
        return h - pad - v / top * (h - 2 * pad)

    parts = [f'<svg width="{w}" height="{h}" class="history">',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - right}" y2="{h - pad}" stroke="#888"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#888"/>',
             '<text x="12" y="20" font-size="12">output tokens/s (mean of valid runs)</text>']
    for i in range(5):
        v = top * i / 4
        parts.append(f'<text x="{pad - 4}" y="{sy(v) + 3:.1f}" font-size="10" text-anchor="end" class="tick">'
                     f'{v:.3g}</text>')
    for c in names:
        parts.append(f'<text x="{sx[c]:.1f}" y="{h - pad + 14}" font-size="10" text-anchor="middle" class="tick">'
                     f'{html.escape(c)} ({html.escape(vllm[c])})</text>')
    for n, s in enumerate(group):
        color = _COLORS[n % len(_COLORS)]
        pts = [j for j in s.points if math.isfinite(j.mean)]
        load = f'{s.key["load_variable"]}={float(s.key["load_value"]):g}'
        coords = " ".join(f"{sx[j.campaign]:.1f},{sy(j.mean):.1f}" for j in pts)
        parts.append(f'<g data-load="{html.escape(load)}"><polyline points="{coords}" fill="none" stroke="{color}" '
                     f'stroke-width="1.5" class="load"/>')
        for j in pts:
            ring = ' stroke="#d00" stroke-width="2" class="worse"' if j.word == "worse" else ""
            parts.append(f'<circle cx="{sx[j.campaign]:.1f}" cy="{sy(j.mean):.1f}" r="4" fill="{color}"{ring}>'
                         f'<title>{html.escape(load)}, {html.escape(j.campaign)}: {j.mean:.4g} tok/s; '
                         f'{html.escape(j.text)}</title></circle>')
        parts.append(f'<text x="{w - right + 8}" y="{sy(pts[-1].mean) + 3:.1f}" font-size="10" fill="{color}">'
                     f'{html.escape(load)}</text></g>' if pts else "</g>")
    parts.append("</svg>")
    head = "".join(f"<th>{html.escape(c)} ({html.escape(vllm[c])})</th>" for c in names)
    rows = []
    for s in group:
        by = {j.campaign: j for j in s.points}
        cells = "".join(f'<td class="{"worse" if c in by and by[c].word == "worse" else ""}">'
                        + (f"{by[c].mean:.4g}<br><small>{html.escape(by[c].text)}</small>" if c in by else "-")
                        + "</td>" for c in names)
        rows.append(f'<tr><td>{html.escape(str(s.key["load_variable"]))}={float(s.key["load_value"]):g}</td>'
                    f"{cells}</tr>")
    first = group[0]
    k = first.key
    body = (f"<p>{html.escape(str(k['model']))}, {html.escape(str(first.dataset))} in {first.input_len} out "
            f"{first.output_len}, {html.escape(str(k['hardware']))}; server: <code>"
            f"{html.escape(str(k['server_settings']))}</code>. Each campaign against the one before it at the same "
            "load (margin 5 %, as <code>raysweep history</code>); a worse one is ringed in red.</p>"
            f"<figure>{''.join(parts)}</figure>"
            f'<table class="config-history"><thead><tr><th>load</th>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")
    return _page(f"history: {first.config}", body)
