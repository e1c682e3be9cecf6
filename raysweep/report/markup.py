"""The report's HTML pieces: its style sheet and table-sorting script, escaping, table cells that keep
their exact number for sorting, and tables from rows or a data frame."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

CSS = """
body{font-family:system-ui,sans-serif;margin:1em auto;max-width:1400px;padding:0 1em;color:#222}
h1{margin:.2em 0 .1em;font-size:1.6em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.4em}
h3{margin:.2em 0 .4em;font-size:1.05em}
nav{margin:.4em 0 .6em} nav a{margin-right:1em} pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}
table{border-collapse:collapse;font-size:12px} th,td{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f0f0f0;position:sticky;top:0} td.t,th.t{text-align:left}
table.sortable th{cursor:pointer} .wide{overflow-x:auto;max-height:70vh}
figure{margin:1em 0} figcaption{font-size:12px;color:#555} img{max-width:100%}
.note{color:#7a5a00} .muted{color:#777} .flag{color:#b00;font-weight:bold}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(430px,1fr));gap:1em;margin-bottom:1em}
.card{border:1px solid #cfd8e3;border-radius:6px;padding:.7em .9em;background:#f8fbff}
.win{font-size:1.1em;margin:.2em 0} .win b{color:#0b5394}
.sig{color:#1e7b34;font-weight:bold} .insig{color:#9a6700;font-weight:bold}
.card figure{margin:.3em 0} .card table{margin:.4em 0} .card td{white-space:nowrap} .card .wide{max-height:none}
"""


SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function(t){
  t.querySelectorAll('th').forEach(function(th,i){
    th.addEventListener('click',function(){
      var body=t.tBodies[0], rows=Array.from(body.rows), asc=th.dataset.dir!=='asc';
      t.querySelectorAll('th').forEach(function(h){delete h.dataset.dir;});
      th.dataset.dir=asc?'asc':'desc';
      function key(r){var c=r.cells[i], v=c.dataset.v; return v!==undefined?Number(v):c.textContent;}
      rows.sort(function(a,b){var x=key(a),y=key(b);
        var r=(typeof x==='number'&&typeof y==='number')?x-y:String(x).localeCompare(String(y));
        return asc?r:-r;});
      rows.forEach(function(r){body.appendChild(r);});
    });
  });
});
"""


def esc(value: object) -> str:
    return html.escape(str(value))


def _cell(value: object) -> str:
    """A table cell: numbers right-aligned with their exact value kept for sorting, text escaped."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '<td class="t"></td>'
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        sort = value if math.isfinite(value) else ("1e308" if value > 0 else "-1e308")
        return f'<td data-v="{sort}">{shown}</td>'
    return f'<td class="t">{esc(value)}</td>'


def html_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], sortable: bool = False) -> str:
    head = "".join(f'<th class="t">{esc(c)}</th>' for c in columns)
    body = "".join("<tr>" + "".join(_cell(_plain(v)) for v in row) + "</tr>\n" for row in rows)
    cls = ' class="sortable"' if sortable else ""
    return f'<div class="wide"><table{cls}><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table></div>'


def _plain(value: object) -> Any:
    """numpy scalars as Python ones, so cells format them as numbers."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def frame_table(df: pd.DataFrame, sortable: bool = False) -> str:
    return html_table(list(df.columns), df.itertuples(index=False, name=None), sortable)


_NOTHING = re.compile(r'^<p class="nothing">(.*)</p>$', re.S)


def nothing(text: str) -> str:
    """A section's whole body when it has nothing to show, `text` saying why: the page leaves such a section
    out and names it, with `text`, in one line under the conclusions (`report.page`)."""
    return f'<p class="nothing">{esc(text)}</p>'


def nothing_said(body: str) -> str | None:
    """Why a section's body has nothing to show (the text `nothing` was given), or None for any other body."""
    m = _NOTHING.match(body.strip())
    return html.unescape(m.group(1)) if m else None


SHARED_NOTE = "On the figures below: "  # the figures' notes said once above them (`report.figures`)
_NOTES = re.compile(r'<p class="note">(.*?)</p>|<br><span class="note">(.*?)</span>', re.S)


def notes_once(parts: Sequence[str]) -> list[str]:
    """The page's parts (in page order) with each note said once: a note already said higher up (the GPU
    count a card's Pareto front and the Pareto figure both derive, say) is left out where it comes again."""
    seen: set[str] = set()

    def once(m: re.Match[str]) -> str:
        text = (m.group(1) if m.group(1) is not None else m.group(2)).removeprefix(SHARED_NOTE)
        if text in seen:
            return ""
        seen.add(text)
        return m.group(0)

    return [_NOTES.sub(once, part) for part in parts]
