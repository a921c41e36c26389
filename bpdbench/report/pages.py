"""The leaderboard's Markdown pages: the index (tables/leaderboard.md: machines, and every grid board marked
PARTIAL, refused, and whether it follows today's grid), one page per machine with the grid's boards only and one
"which drafter" answer per benchmark, model and dtype (tables/leaderboard/<fingerprint>.md), and the machine's
studies on their own page (<fingerprint>-studies.md). html.py renders the same structure as one HTML page.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..experiments.summary import to_markdown
from .runs import Board, Leaderboard, Machine, flags


def status(b: Board) -> list[str]:
    """The lines under a board's caption: what it may be read as (refused, partial, today's grid, noise floor)."""
    lines = [f"**{b.refused}** No ranking and no verdict are given." if b.refused else b.noise]
    if b.partial:
        lines.append("**PARTIAL**: the run has not measured every planned prompt yet.")
    if b.study:
        lines.append(f"On the studies page: {b.why_study}.")
    elif b.today == "":
        lines.append("Follows today's grid (grids/leaderboard.toml: the same cell, methods and protocol).")
    else:
        lines.append(f"Follows an older grid: {b.today}.")
    return lines


def machines(lb: Leaderboard) -> pd.DataFrame:
    """The index: one row per machine page (both renderers link its first column)."""
    return pd.DataFrame([{"machine": m.fingerprint, "CPU": m.processor, "flags": flags({"cpu_flags": m.flags}),
                          "cores": m.cores, "boards": ", ".join(f"{b.task} ({b.dtype})" for b in m.boards) or "—",
                          "studies": len(m.studies),
                          "folders": sum(len(b.runs) for b in [*m.boards, *m.studies])} for m in lb.machines],
                        columns=["machine", "CPU", "flags", "cores", "boards", "studies", "folders"])


def boards(lb: Leaderboard) -> pd.DataFrame:
    """The index's second table: every grid board, marked PARTIAL or refused, and whether it follows today's grid."""
    return pd.DataFrame([{"machine": m.fingerprint, "board": f"{b.task} · {b.model} · {b.dtype}",
                          "commit": b.runs[0].commit[:7], "prompts": "PARTIAL" if b.partial else "complete",
                          "noise floor": ("REFUSED" if b.refused else "checked" if b.noise.startswith("noise floor:")
                                          else "unchecked"),
                          "grid": "today's" if b.today == "" else f"older ({b.today})"}
                         for m in lb.machines for b in m.boards],
                        columns=["machine", "board", "commit", "prompts", "noise floor", "grid"])


def _board(b: Board, pages: Path, written: list[Path]) -> list[str]:
    text = [f"## {b.heading}", "", b.caption, "", *(f"{x}  " for x in status(b)), ""]
    if b.figure():
        png = pages / f"{b.fingerprint}-{b.slug}.png"
        png.write_bytes(b.figure())
        written.append(png)
        text += [f"![speedup over AR, {b.heading}]({png.name})", ""]
    for t in b.tables:
        text += [f"### {t.title}", "", to_markdown(t.frame), t.note, ""]
    return text


def machine_page(m: Machine, pages: Path, written: list[Path]) -> None:
    studies = f" Studies on this machine: [{m.fingerprint}-studies.md]({m.fingerprint}-studies.md)." \
        if m.studies else ""
    text = [f"# Leaderboard: {m.processor}, fingerprint {m.fingerprint}", "",
            f"CPU flags: {' '.join(m.flags)}; {m.cores} cores. The leaderboard grid's board per benchmark, model and "
            f"dtype, each from one commit and one sweep; rows ranked by speedup.{studies} "
            "[All machines](../leaderboard.md)", ""]
    if m.commits:
        text += [m.commits, ""]
    text += ["## Which drafter on this machine", "", *(f"- {b.verdict}" for b in m.boards), ""]
    if not m.boards:
        text += ["No leaderboard-grid board on this machine yet.", ""]
    for b in m.boards:
        text += _board(b, pages, written)
    path = pages / f"{m.fingerprint}.md"
    path.write_text("\n".join(text))
    written.append(path)
    if m.studies:
        text = [f"# Studies: {m.processor}, fingerprint {m.fingerprint}", "",
                "Boards that are not the leaderboard grid's (frontier-*, speed-*, other grids) or an older grid "
                "board of a benchmark the machine's page answers: each answers its own study's question under its "
                f"own protocol, never \"which drafter\" for this machine. [The machine's page]({m.fingerprint}.md)",
                ""]
        for b in m.studies:
            text += _board(b, pages, written)
            text[-1:] = ["", f"Fastest in this study: {b.verdict.split('**: ', 1)[-1]}", ""]
        path = pages / f"{m.fingerprint}-studies.md"
        path.write_text("\n".join(text))
        written.append(path)


def write(lb: Leaderboard, out: Path) -> list[Path]:
    """tables/leaderboard.md and tables/leaderboard/*.md (+ one PNG per ranked board); returns what it wrote."""
    pages = out / "leaderboard"
    pages.mkdir(exist_ok=True)
    for old in [*pages.glob("*.md"), *pages.glob("*.png")]:       # pages of machines no longer in the results
        old.unlink()
    written: list[Path] = []
    for m in lb.machines:
        machine_page(m, pages, written)
    index = machines(lb)
    index["machine"] = index.machine.map(lambda fp: f"[{fp}](leaderboard/{fp}.md)")
    index["studies"] = [f"[{n}](leaderboard/{m.fingerprint}-studies.md)" if n else "0"
                        for n, m in zip(index.studies, lb.machines)]
    text = ["# Leaderboard: one page per machine", "",
            "Rendered from results/speed*/, results/leaderboard*/ and results/frontier*/ by `bpdbench tables`; the "
            "same tables, sortable, with figures: [leaderboard.html](leaderboard.html). A machine's page holds the "
            "leaderboard grid's boards only (one per benchmark, model and dtype); its studies have their own page. "
            "A table never mixes machines (CPU fingerprint), models, dtypes, commits, sweeps or protocols. The wide "
            "dumps of every folder are speed.csv and speed_by_category.csv.", "",
            to_markdown(index) if not index.empty else "No speed folder records its machine.", ""]
    grid = boards(lb)
    if not grid.empty:
        text += ["## The grid's boards", "",
                 "PARTIAL: not every planned prompt measured yet. noise floor: the `null` row (AR timed as a method) "
                 "within 1.00 ± 3% with an interval containing 1 (checked), outside it (REFUSED: no ranking), or no "
                 "such row (unchecked on a board made before boards carried one; REFUSED on one of today's protocol). grid: whether the board is a cell of today's "
                 "grids/leaderboard.toml with the same methods and protocol.", "", to_markdown(grid), ""]
    if lb.left_out:
        text += ["## Left out", "", to_markdown(pd.DataFrame(lb.left_out, columns=["folder", "why"])), ""]
    (out / "leaderboard.md").write_text("\n".join(text))
    return [*written, out / "leaderboard.md"]
