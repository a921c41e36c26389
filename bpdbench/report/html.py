"""The leaderboard as one self-contained HTML page: the Markdown pages' tables, sortable by a click on a header, and
their figures embedded as base64 PNGs.

Why self-contained: the page is read on machines without internet (no CDN, no external script or style) and passed
around as one file. Sorting is a few lines of inline JavaScript: numbers sort as numbers ("1.51 [1.40, 1.64]" by its
first number), text as text, "n/a" last. Opening the page with `#sort=<table id>:<column>` sorts that table on load,
so a headless browser can check the sorting without a click.
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

from .pages import boards, machines, status
from .runs import Board, Leaderboard, Table

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1350px; color: #222; }
table { border-collapse: collapse; margin: 0.4em 0 0.3em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 2px 7px; text-align: right; white-space: nowrap; }
td.text, th { text-align: left; }
th { background: #eef2f6; cursor: pointer; user-select: none; }
th[data-dir=asc]::after { content: " \\25B2"; } th[data-dir=desc]::after { content: " \\25BC"; }
tbody tr:nth-child(even) { background: #fafafa; }
.caption { color: #444; font-size: 13px; } .note { color: #555; font-size: 12px; max-width: 1300px; }
img { max-width: 100%; border: 1px solid #ddd; } h2 { border-top: 2px solid #888; padding-top: 0.6em; }
"""

SCRIPT = """
function cellKey(row, i) {
  const t = row.cells[i] ? row.cells[i].textContent.trim() : "";
  const n = parseFloat(t);
  return isNaN(n) ? [1, t.toLowerCase()] : [0, n];
}
function sortBy(th) {
  const table = th.closest("table"), i = Array.from(th.parentNode.children).indexOf(th);
  const asc = th.dataset.dir !== "asc";
  table.querySelectorAll("th").forEach(h => delete h.dataset.dir);
  th.dataset.dir = asc ? "asc" : "desc";
  const body = table.tBodies[0];
  Array.from(body.rows).sort((a, b) => {
    const x = cellKey(a, i), y = cellKey(b, i);
    if (x[0] !== y[0]) return x[0] - y[0];
    const c = x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0;
    return asc ? c : -c;
  }).forEach(r => body.appendChild(r));
}
document.querySelectorAll("table.sortable td").forEach(td => {
  const t = td.textContent.trim();
  if (isNaN(parseFloat(t)) && t !== "n/a" && t !== "") td.classList.add("text");
});
document.querySelectorAll("table.sortable th").forEach(th => th.addEventListener("click", () => sortBy(th)));
const wanted = decodeURIComponent(location.hash).match(/^#sort=(.+):(\\d+)$/);
if (wanted && document.getElementById(wanted[1])) {
  sortBy(document.getElementById(wanted[1]).tHead.rows[0].cells[Number(wanted[2])]);
}
"""


def _text(s: str) -> str:
    """Escaped text with the Markdown bold the verdicts use."""
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(s))


def _table(t: Table, heading: str = "h4", escaped: bool = False) -> str:
    """`escaped`: the frame's cells are HTML already (links), everything else is escaped here."""
    body = t.frame.to_html(table_id=t.id, classes="sortable", index=False, border=0, escape=not escaped, na_rep="")
    note = f'<p class="note">{_text(t.note)}</p>' if t.note else ""
    return f"<{heading}>{html.escape(t.title)}</{heading}>\n{body}\n{note}"


def _png(data: bytes | None, alt: str) -> str:
    if not data:
        return ""
    return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}"></p>'


def _board(b: Board) -> list[str]:
    return [f'<h3 id="{b.fingerprint}-{b.slug}">{html.escape(b.heading)}</h3>',
            f'<p class="caption">{html.escape(b.caption)}</p>',
            *(f'<p class="note">{_text(x)}</p>' for x in status(b)),
            _png(b.figure(), f"speedup bars, {b.heading}"), *(_table(t) for t in b.tables)]


def page(lb: Leaderboard) -> str:
    """The whole page, in the Markdown pages' structure: the machine index and the grid's boards, what was left
    out, then per machine its verdicts, the grid's boards, and its studies apart."""
    index = machines(lb).map(lambda v: html.escape(v) if isinstance(v, str) else v)
    index["machine"] = index.machine.map(lambda fp: f'<a href="#{fp}">{fp}</a>')
    parts = ["<h1>bpdbench leaderboard: one section per machine</h1>",
             '<p class="note">Rendered by <code>bpdbench tables</code> from results/speed*/, results/leaderboard*/ '
             "and results/frontier*/ folders. A machine's section holds the leaderboard grid's boards (one per "
             "benchmark, model and dtype), then its studies apart. A table never mixes machines (CPU fingerprint), "
             "models, dtypes, commits, sweeps or protocols; folders that do not record their machine are left out. "
             "Click a header to sort.</p>",
             _table(Table("machines", "Machines", index), "h2", escaped=True)]
    grid = boards(lb)
    if not grid.empty:
        parts.append(_table(Table("boards", "The grid's boards", grid), "h2"))
    if lb.left_out:
        left = pd.DataFrame(lb.left_out, columns=["folder", "why left out"])
        parts.append(_table(Table("left-out", "Left out", left), "h2"))
    for m in lb.machines:
        parts.append(f'<h2 id="{m.fingerprint}">{html.escape(m.processor)} (fingerprint {m.fingerprint})</h2>')
        parts.append(f'<p class="caption">CPU flags: {html.escape(" ".join(m.flags))}; {m.cores} cores</p>')
        if m.commits:
            parts.append(f'<p class="note">{_text(m.commits)}</p>')
        parts.append("<h3>Which drafter on this machine</h3><ul>"
                     + "".join(f"<li>{_text(b.verdict)}</li>" for b in m.boards) + "</ul>")
        for b in m.boards:
            parts.extend(_board(b))
        if m.studies:
            parts.append(f'<h3 id="{m.fingerprint}-studies">Studies on this machine (not the leaderboard grid: '
                         "never its answer)</h3>")
            for b in m.studies:
                parts.extend(_board(b))
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>bpdbench leaderboard</title>"
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(parts) + f"\n<script>{SCRIPT}</script>\n"
            "</body></html>\n")


def write(lb: Leaderboard, path: Path) -> Path:
    path.write_text(page(lb), encoding="utf-8")
    return path
