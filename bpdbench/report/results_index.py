"""results/README.md: every result folder, the grid cell that made it, its machine, its commit, and whether a
newer result replaced it.

Why a page: results/ holds dozens of folders from several machines, commits and grids, and nothing said which of
them a reader should cite. The status reuses the leaderboard's rule (leaderboard.collect: a board keeps only its
newest commit's folders, ordered by the code's git history, commit_time) and adds the sweep's: a folder is
superseded when a newer folder of the same grid cell on the same machine exists. Rendered by `bpdbench tables`, so
the committed page always follows the committed folders (a test renders it afresh and compares).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import paths
from ..experiments.commands import COMMANDS
from ..experiments.summary import to_markdown

FILE = "README.md"
CONFIG_FILES = tuple(dict.fromkeys(c.config_file for c in COMMANDS.values()))   # certify's: certify.json
# the summary each command leaves in its folder (CommandSpec.summary), run's last: summary.csv is the most generic name
COMMAND_FILES = tuple(sorted(((c.name, c.summary) for c in COMMANDS.values() if c.writes_folder),
                             key=lambda pair: pair[1] == "summary.csv"))
OLDER = "is older than"          # the leaderboard's reason for a folder a newer commit of its board replaced

HEADER = """# Result folders

Rendered by `bpdbench tables` (bpdbench/report/results_index.py) from each folder's config.json (certify.json for
`bpdbench certify`); do not edit by hand. One row per folder under results/ that records its settings (the rendered
tables/ left out).

- **made by**: the grid file and cell that ran it (config.json `sweep`), else the command that wrote it.
- **machine**: the CPU fingerprint the leaderboard groups by (hardware/fingerprint.py) and the CPU's name; `—` for
  folders written before the fingerprint was recorded.
- **commit**: the code that wrote it (short hash; `dirty` when the checkout had uncommitted changes).
- **status**: `superseded` when the leaderboard leaves the folder out because a newer commit's folder of the same
  board (machine, benchmark, model, dtype and protocol) replaced it, or when a folder of the same grid cell on the
  same machine was written by a newer commit (git history order); `current` otherwise. A current folder may still be
  one the leaderboard does not place (an older recipe, prompts not proven clean): **note** says why.

Paths inside these folders are recorded relative to the checkout, as `$BPDBENCH_CACHE/...`, or as `<outside>/<name>`
(docs/result-schema.md); `scripts/portable_results.py` rewrote the folders that recorded absolute paths.
"""


@dataclass(frozen=True)
class Entry:
    folder: str
    made_by: str
    machine: str
    commit: str
    status: str
    note: str


def result_folders(results: Path) -> list[Path]:
    """Every folder under `results` holding a config.json or certify.json, tables/ and git-ignored outputs (`make
    demo`'s runs) left out, in path order."""
    found = sorted({f.parent for name in CONFIG_FILES for f in results.rglob(name)
                    if "tables" not in f.parent.relative_to(results).parts and f.parent != results})
    ignored = paths.git_ignored(results, found)
    return [f for f in found if f not in ignored and not any(p in ignored for p in f.parents)]


def _config(folder: Path) -> dict:
    for name in CONFIG_FILES:
        if (folder / name).is_file():
            try:
                return json.loads((folder / name).read_text())
            except ValueError:
                return {}
    return {}


def command_of(folder: Path) -> str:
    return next((k for k, file in COMMAND_FILES if (folder / file).exists()), "unknown")


def made_by(config: dict, folder: Path) -> str:
    sweep = config.get("sweep") or {}
    if sweep.get("grid"):
        return f"{sweep['grid']}: {sweep.get('cell', '?')}"
    return f"bpdbench {command_of(folder)}"


def machine(env: dict) -> str:
    cpu = env.get("processor") or "?"
    return f"{env['fingerprint']} ({cpu})" if env.get("fingerprint") else f"— ({cpu})"


def entries(results: Path) -> list[Entry]:
    from .leaderboard import collect, commit_time, short
    results = Path(results)
    left = dict(collect(results).left_out)
    rows = []
    for folder in result_folders(results):
        config = _config(folder)
        env = config.get("environment") or {}
        rel = folder.relative_to(results).as_posix()
        commit = env.get("git_commit") or ""
        why = left.get(rel, "")
        rows.append([rel, made_by(config, folder), machine(env), short(commit) if commit else "—",
                     "superseded" if OLDER in why else "current", why, (config.get("sweep") or {}), env, commit])
    # the sweep's rule: of the folders one grid cell wrote on one machine, the newest commit's is current
    times = {c: commit_time(c) for c in {r[8] for r in rows if r[6].get("grid") and r[8]}}
    cells: dict[tuple, list] = {}
    for r in rows:
        if r[6].get("grid") and r[7].get("fingerprint") and times.get(r[8]) is not None:
            cells.setdefault((r[6]["grid"], r[6].get("cell"), r[7]["fingerprint"]), []).append(r)
    for group in cells.values():
        newest = max(group, key=lambda r: times[r[8]])
        for r in group:
            if times[r[8]] < times[newest[8]]:
                r[4] = "superseded"
                r[5] = r[5] or f"{newest[0]} holds the same grid cell from a newer commit ({short(newest[8])})"
    return [Entry(*r[:6]) for r in rows]


def render(results: Path) -> str:
    rows = entries(results)
    n = sum(e.status == "current" for e in rows)
    df = pd.DataFrame([e.__dict__ for e in rows], columns=list(Entry.__dataclass_fields__))
    df.columns = ["folder", "made by", "machine", "commit", "status", "note"]
    return (HEADER + f"\n{len(rows)} folders: {n} current, {len(rows) - n} superseded.\n\n"
            + (to_markdown(df) if rows else "No result folder.\n"))


def write(results: Path) -> Path:
    path = Path(results) / FILE
    path.write_text(render(results))
    return path
