"""The leaderboard: one page per machine holding the leaderboard grid's board, one per benchmark, model and dtype,
and a studies page per machine for everything else, from `bpdbench speed` folders.

Why: a speedup belongs to a machine (what one forward over n tokens costs there), a dtype, a model and the code that
measured it; one table mixing them invites comparing numbers that were never comparable, and a page of several
boards gives several answers to "which drafter". Spec-Bench's leaderboard is cited because it is one table per
machine under one protocol; this is that, for every folder under results/speed*/, results/leaderboard*/
(grids/leaderboard.toml) and results/frontier*/. So that a table is always one experiment:
- a folder is placed only when its config.json records the machine (environment.fingerprint, cpu_flags, processor),
  the commit and torch's version; older folders are listed as left out, with what they lack;
- board = (machine, task, model, dtype, protocol: prompts, new tokens, repeats, threads, heads profile, sampling;
  and the sweep: the leaderboard grid's file and its content hash where recorded, else "a study"). A board comes
  from one commit: only its folders of the newest commit are kept, the others left out with the reason; those are
  merged (a method measured twice: the first folder's; heads of another version: left out), each row's speedup
  still against its own folder's AR;
- the machine's page holds the grid's boards only, the newest per benchmark, model and dtype; studies (frontier-*,
  speed-*, other grids) and older grid boards go to its studies page (report/pages.py), as do boards of an older
  leaderboard grid of any benchmark once the machine has one that follows today's grid;
- a board ranks only when its noise floor holds (report/checks.py), and says whether it follows today's grid.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from . import checks, load, replication
from .board import CONVENTIONS, POSITIONS, acceptance, describe, fill, ranked, training_reports  # noqa: F401
from .provenance import LEAKED, PUBLISHED_SINCE, keeps_state, missing, older_default, overlap  # noqa: F401 (tests)
from .runs import (LETTERS, Board, Leaderboard, Machine, Run, Table, commit_time, flags, grid_name,  # noqa: F401
                   read_run, short)
from .verdicts import MAX_COLUMNS, ci, fit, is_drafter, num  # noqa: F401 (tests read them here)

SPEED_AREAS = ("speed", "leaderboard", "frontier")      # result areas holding `bpdbench speed` folders


def grid_folder(rel: str) -> bool:
    """Whether a result folder without a recorded sweep is the leaderboard grid's (results/leaderboard-*/...)."""
    return rel.startswith("leaderboard")


def newness(run: Run) -> tuple:
    """When the folder's commit was made (this checkout's git; oldest where unknown here, never a checkout's file
    times, which a fresh clone sets arbitrarily)."""
    t = commit_time(run.commit)
    return (t if t is not None else float("-inf"), run.commit.endswith("-dirty"))


def from_grid(run: Run) -> bool:
    """Whether a folder belongs to the leaderboard grid's board: its config.json names grids/leaderboard.toml (or
    its -full variant) as its sweep; a folder that records no sweep, by where the grid writes."""
    grid = run.sweep.get("grid")
    return checks.is_grid(grid) if grid else grid_folder(run.rel)


def collect(results: Path) -> Leaderboard:
    """Every speed folder under results/{speed,leaderboard,frontier}*/, placed on its machine's page (the grid's
    boards) or studies page, or listed as left out."""
    results = Path(results)
    groups: dict[tuple, list[Run]] = defaultdict(list)
    left: list[tuple[str, str]] = []
    for area in [k for prefix in SPEED_AREAS for k in load.areas(results, prefix)]:
        for f in load.folders(results, area, "speed.csv"):
            rel = str(f.path.relative_to(results))
            if replication.partner_of(f.path) is not None:
                continue            # a board's replication: a table of that board (report/replication.py)
            why = missing(f) or overlap(f)
            if why:
                left.append((rel, why))
                continue
            run = read_run(f, rel)
            grid = from_grid(run)
            sweep = (run.sweep.get("grid"), run.sweep.get("grid_sha256")) if grid else None
            groups[(run.env["fingerprint"], f.task, f.model, f.dtype, run.protocol, grid, sweep)].append(run)
    by_machine: dict[str, list[Board]] = defaultdict(list)
    for (fp, task, model, dtype, _, grid, _), runs in groups.items():
        runs = sorted(runs, key=newness, reverse=True)
        kept, out = [], []
        for r in sorted([r for r in runs if r.commit == runs[0].commit], key=lambda r: r.rel):
            clash = next((k for k in kept if None not in (k.heads, r.heads) and k.heads != r.heads), None)
            if clash:
                out.append((r.rel, f"its heads {r.heads} differ from those of {clash.rel} {clash.heads}"))
            else:
                kept.append(r)
        out += [(r.rel, f"commit {short(r.commit)} is older than {short(kept[0].commit)} of {kept[0].rel} (same "
                        f"machine, benchmark, model, dtype, protocol and sweep)") for r in runs
                if r.commit != kept[0].commit]
        left.extend(out)
        by_machine[fp].append(Board(fp, task, model, dtype, "", kept, out, study=not grid))
    sources, training = load.StandIns(results), training_reports(results)
    machines = []
    for fp, boards in sorted(by_machine.items()):
        boards.sort(key=lambda b: (b.task, b.model, b.dtype, b.study,
                                   -newness(b.runs[0])[0],
                                   -len(set().union(*(r.summary.method for r in b.runs)))))
        seen: dict[str, int] = defaultdict(int)
        answered: dict[tuple, Board] = {}
        for b in boards:
            base = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{b.task}-{Path(b.model).name}-{b.dtype}")
            seen[base] += 1
            b.slug = base if seen[base] == 1 else f"{base}-{seen[base]}"
            if b.study:
                b.why_study = f"a study ({sweep_of(b)}), not the leaderboard grid"
            elif (b.task, b.model, b.dtype) in answered:
                first = answered[(b.task, b.model, b.dtype)]
                b.study = True
                b.why_study = (f"an older leaderboard-grid board of this benchmark, model and dtype (commit "
                               f"{short(b.runs[0].commit)}; the page's is at {short(first.runs[0].commit)})")
            else:
                answered[(b.task, b.model, b.dtype)] = b
                whys = [w for r in b.runs if (w := checks.follows_today(r.folder, r.rel))]
                b.today = whys[0] if whys else ""
            fill(b, sources, training)
        if any(not b.study and b.today == "" for b in boards):     # today's grid answers here: older grids' boards
            for b in boards:                                       # (another benchmark, e.g. the MT-Bench board the
                if not b.study and b.today:                        # first protocol had) go to the studies page
                    b.study = True
                    b.why_study = f"a board of an older leaderboard grid ({b.today}); this machine has today's"
        env = boards[0].runs[0].env
        page = [b for b in boards if not b.study]
        commits = dict.fromkeys(short(b.runs[0].commit) for b in page)
        note = ("" if len(commits) < 2 else
                f"The grid's boards on this page come from {len(commits)} commits ("
                + ", ".join(f"{b.task} at {short(b.runs[0].commit)}" for b in page)
                + "): each board is one commit and one sweep, so they are shown as separate boards, never merged "
                "or compared with each other.")
        machines.append(Machine(fp, env["processor"], list(env["cpu_flags"]), env.get("cpu_count"), page,
                                [b for b in boards if b.study], note))
    return Leaderboard(machines, sorted(left))


def sweep_of(b: Board) -> str:
    grids = dict.fromkeys(grid_name(r.sweep.get("grid")) for r in b.runs)
    return "sweep " + ", ".join(grids) + "; " + ", ".join(dict.fromkeys(r.rel.split("/")[0] for r in b.runs))
