"""The leaderboard: one page per machine, one board per benchmark, model and dtype, from `bpdbench speed` folders.

Why: a speedup belongs to a machine (what one forward over n tokens costs there), a dtype, a model and the code that
measured it; one table mixing them (the old speed.md: two CPU makes, several commits, two models) invites comparing
numbers that were never comparable. Spec-Bench's leaderboard is cited because it is one table per machine under one
protocol; this is that, for every folder under results/speed*/, results/leaderboard*/ (grids/leaderboard.toml) and
results/frontier*/. A folder whose run is still going (or was stopped) is placed with its prompts so far, and its
board says PARTIAL with how many of the planned prompts it holds. So that a table is always one experiment:
- a folder is placed only when its config.json records the machine (environment.fingerprint, cpu_flags, processor),
  the commit and torch's version; older folders are listed as left out, with what they lack;
- page = fingerprint; board = (task, model, dtype, protocol: prompts, new tokens, repeats, threads, heads profile,
  sampling; and whether it is the leaderboard grid's, so that a study of a few rows under the same protocol at a
  newer commit sits beside the grid's board and never retires it). Only a board's folders of its newest commit are
  kept, the others left out with the reason; those are merged (a method measured twice: the first folder's; heads of
  another version: left out), each row's speedup still against its own folder's AR;
- every Markdown table has at most MAX_COLUMNS columns (wider ones are split); the wide dumps stay in the CSVs.
"""
from __future__ import annotations

import re
import string
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pandas as pd

from .. import paths
from ..experiments.speed import by_prompt_method, counted
from ..store import read_examples
from . import load
from .verdicts import MAX_COLUMNS, best_two, ci, fit, is_drafter, num, pick, separated  # noqa: F401 (tests)
from .provenance import LEAKED, PUBLISHED_SINCE, keeps_state, missing, older_default, overlap  # noqa: F401 (tests read them here)

SPEED_KINDS = ("speed", "leaderboard", "frontier")      # result kinds holding `bpdbench speed` folders
POSITIONS = 8                       # a_1..a_8 at most
KEY_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
PROTOCOL = ("limit", "offset", "data_file", "max_prompt_tokens", "heads_profile", "temperature", "top_p", "top_k")
LETTERS = string.ascii_uppercase
CONVENTIONS = (
    "speedup = sum of AR's median seconds / sum of the method's over its counted prompts (output identical to "
    "greedy, or a certified bfloat16 near-tie), against the AR of its own folder; [95% CI] bootstrap over prompts. "
    "τ = new tokens / serial calls of the base model, prefill included = block efficiency: tokens per verify step "
    "counting the bonus token (AR = 1). predicted = the speedup the machine's calibrated forward costs predict from "
    "the counters. verified/step = tokens the base scores per verify forward. step cost = the method's seconds per "
    "serial call over AR's. identical / near-tie / lost = prompts equal to greedy / certified near-ties (counted) / "
    "not counted. (auto: AR) = an `auto` row that priced every shape on the tune split and found none faster than AR "
    "on this machine, so it ran AR's loop; it is never named the drafter to use.")


@lru_cache(maxsize=None)
def commit_time(commit: str) -> float | None:
    """The commit's time from this checkout's git history (None when unknown here): "newest" must follow the
    code's history, not folder names or checkout mtimes."""
    try:
        done = subprocess.run(["git", "-C", str(paths.REPO), "log", "-1", "--format=%ct",
                               commit.removesuffix("-dirty")], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip()
    return float(out) if done.returncode == 0 and out.isdigit() else None


def short(commit: str) -> str:
    return commit[:7] + (" (dirty)" if commit.endswith("-dirty") else "")


@dataclass(frozen=True)
class Run:
    """One kept speed folder: its config, speed.csv rows and speed.jsonl records, method labels current."""
    folder: load.ResultFolder
    rel: str
    summary: pd.DataFrame
    records: pd.DataFrame

    @property
    def env(self) -> dict:
        return dict(self.folder.environment)

    @property
    def commit(self) -> str:
        return self.env["git_commit"]

    @property
    def protocol(self) -> tuple:
        cfg = self.folder.config.get("config") or {}
        return (*(cfg.get(k) for k in PROTOCOL), self.folder.config.get("per_category"), self.folder.max_new_tokens,
                self.folder.repeats, self.folder.threads)

    @property
    def heads(self) -> tuple | None:
        """The heads' version (recipe, greedy positions); None when the run loaded no heads."""
        h = self.folder.heads_info
        return (h.get("recipe"), h.get("greedy_positions")) if h else None

    @property
    def newness(self) -> tuple:
        t = commit_time(self.commit)     # unknown here: oldest, never a checkout's file times (not reproducible)
        return (t if t is not None else float("-inf"), self.commit.endswith("-dirty"))

    @property
    def ar(self) -> pd.DataFrame:
        return self.records[self.records.method == "ar"]


@dataclass(frozen=True)
class Table:
    id: str
    title: str
    frame: pd.DataFrame             # display strings, at most MAX_COLUMNS columns
    note: str = ""


@dataclass
class Board:
    fingerprint: str
    task: str
    model: str
    dtype: str
    slug: str
    runs: list[Run]
    left_out: list[tuple[str, str]]
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)          # numeric, ranked by speedup
    accept: dict[str, tuple[list[float], str]] = field(default_factory=dict)
    caption: str = ""
    heading: str = ""
    verdict: str = ""
    tables: list[Table] = field(default_factory=list)
    _png: bytes | None = None

    def figure(self) -> bytes | None:
        """The speedup bars (plots.speedup_bars), drawn on first use: collecting alone draws nothing."""
        if self._png is None:
            from .plots import speedup_bars
            self._png = speedup_bars(self.rows, f"Speedup over AR: {self.task}, {self.model}, {self.dtype}",
                                     self.caption) or b""
        return self._png or None


@dataclass
class Machine:
    fingerprint: str
    processor: str
    flags: list[str]
    cores: int | None
    boards: list[Board]


@dataclass
class Leaderboard:
    machines: list[Machine]
    left_out: list[tuple[str, str]]


def read_run(f: load.ResultFolder, rel: str) -> Run:
    records = pd.DataFrame(read_examples(f.path / "speed.jsonl", key=by_prompt_method))
    records["method"] = records["method"].map(load.label)
    summary = f.read("speed.csv")
    resolved = ((f.config.get("resolved") or {}).get("methods") or {})
    rename = {m: older_default(m, resolved.get(m) or {}) for m in summary.method}
    if "repeat_drift" not in summary:           # made before state was restored per repeat (experiments/drift.py)
        rename = {m: r + (LEAKED if keeps_state(m, resolved.get(m) or {}) else "") for m, r in rename.items()}
    records["method"] = records["method"].map(lambda m: rename.get(m, m))
    return Run(f, rel, summary.assign(method=summary.method.map(rename)), records)


def flags(env: dict) -> str:
    found = [x for x in KEY_FLAGS if x in (env.get("cpu_flags") or [])]
    return " ".join(found) if found else "no avx2"


def collect(results: Path) -> Leaderboard:
    """Every speed folder under results/{speed,leaderboard,frontier}*/, placed on its machine's page or listed as left
    out."""
    results = Path(results)
    groups: dict[tuple, list[Run]] = defaultdict(list)
    left: list[tuple[str, str]] = []
    for kind in [k for prefix in SPEED_KINDS for k in load.kinds(results, prefix)]:
        for f in load.folders(results, kind, "speed.csv"):
            rel = str(f.path.relative_to(results))
            why = missing(f) or overlap(f)
            if why:
                left.append((rel, why))
                continue
            run = read_run(f, rel)
            groups[(run.env["fingerprint"], f.task, f.model, f.dtype, run.protocol, grid_folder(rel))
                   ].append(run)
    by_machine: dict[str, list[Board]] = defaultdict(list)
    for (fp, task, model, dtype, *_), runs in groups.items():
        runs = sorted(runs, key=lambda r: r.newness, reverse=True)
        kept, out = [], []
        for r in sorted([r for r in runs if r.commit == runs[0].commit], key=lambda r: r.rel):
            clash = next((k for k in kept if None not in (k.heads, r.heads) and k.heads != r.heads), None)
            if clash:
                out.append((r.rel, f"its heads {r.heads} differ from those of {clash.rel} {clash.heads}"))
            else:
                kept.append(r)
        out += [(r.rel, f"commit {short(r.commit)} is older than {short(kept[0].commit)} of {kept[0].rel} (same "
                        f"machine, benchmark, model, dtype and protocol)") for r in runs if r.commit != kept[0].commit]
        left.extend(out)
        by_machine[fp].append(Board(fp, task, model, dtype, "", kept, out))
    sources = load.StandIns(results)
    machines = []
    for fp, boards in sorted(by_machine.items()):
        boards.sort(key=lambda b: (b.task, b.model, b.dtype, not from_grid(b),
                                   -len(set().union(*(r.summary.method for r in b.runs)))))
        seen: dict[str, int] = defaultdict(int)
        for b in boards:
            base = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{b.task}-{Path(b.model).name}-{b.dtype}")
            seen[base] += 1
            b.slug = base if seen[base] == 1 else f"{base}-{seen[base]}"
            fill(b, sources)
        env = boards[0].runs[0].env
        machines.append(Machine(fp, env["processor"], list(env["cpu_flags"]), env.get("cpu_count"), boards))
    return Leaderboard(machines, sorted(left))


def ranked(runs: list[Run]) -> pd.DataFrame:
    """speed.csv rows of the board's folders (a method once: the first folder's), ranked by speedup."""
    frames, seen = [], set()
    for letter, run in zip(LETTERS, runs):
        s = run.summary[~run.summary.method.isin(seen)]
        seen.update(s.method)
        frames.append(s.assign(run=letter, folder=run.rel))
    df = pd.concat(frames, ignore_index=True)
    for c in ("speedup_ci_low", "speedup_ci_high", "predicted_speedup", "verify_tokens_per_step", "step_cost",
              "block_efficiency", "n_near_tie"):
        if c not in df:
            df[c] = float("nan")
    df["lost"] = df.n_prompts - df.n_counted
    nothing = {letter: drafts_nothing(run) for letter, run in zip(LETTERS, runs)}
    df["nothing"] = [m in nothing[x] for m, x in zip(df.method, df.run)]
    return df.sort_values("speedup_vs_ar", ascending=False, kind="stable", na_position="last").reset_index(drop=True)


def drafts_nothing(run: Run) -> set[str]:
    """The run's `auto` rows that sized themselves to AR (resolved `draft_nothing`: no shape pays on this machine):
    they are AR's loop under another name, so the tables say so and never name them the drafter to use."""
    resolved = (run.folder.config.get("resolved") or {}).get("methods") or {}
    return {m for m, v in resolved.items() if isinstance(v, dict) and v.get("draft_nothing")}


def by_category(b: Board) -> pd.DataFrame:
    """Per category and method: speedup over the counted prompts against the same folder's AR (speed.jsonl median
    seconds), with the per-prompt seconds (`num`, `den`) that best_two bootstraps intervals from: only the two best of
    a category show one, and a bootstrap per cell would cost seconds for nothing."""
    out = []
    for letter, run in zip(LETTERS, b.runs):
        r = run.records
        if "category" not in r or r.category.isna().all():
            continue
        ar = run.ar.set_index("id").median_s
        r = r[r.method.isin(set(b.rows[b.rows.run == letter].method))].assign(ar_s=lambda d: d.id.map(ar))
        r = r[counted(r) & r.ar_s.notna()]
        for (cat, m), g in r.groupby(["category", "method"], sort=False):
            out.append({"category": cat, "method": m, "n": len(g), "speedup": g.ar_s.sum() / g.median_s.sum(),
                        "num": g.ar_s.tolist(), "den": g.median_s.tolist()})
    return pd.DataFrame(out, columns=["category", "method", "n", "speedup", "num", "den"])


def experiments(b: Board) -> str:
    """The board's result folders by experiment (results/<experiment>/<task>...): two boards of one benchmark on one
    machine (the leaderboard grid and a frontier study, say) differ in protocol, and their headings must say which is
    which."""
    return ", ".join(dict.fromkeys(r.rel.split("/")[0] for r in b.runs))


def grid_folder(rel: str) -> bool:
    """Whether a result folder is the leaderboard grid's (results/leaderboard-<fingerprint>/...)."""
    return rel.startswith("leaderboard")


def from_grid(b: Board) -> bool:
    """Whether the board holds the leaderboard grid's folders: listed first."""
    return any(grid_folder(r.rel) for r in b.runs)


def describe(b: Board) -> str:
    """The board's heading and caption (machine, flags, cores/threads, model, dtype, torch, commit, n); returns the
    short title every table of the board carries."""
    run, env, ar = b.runs[0], b.runs[0].env, b.runs[0].ar
    cats = list(dict.fromkeys(ar.category.dropna())) if "category" in ar else []
    what = f"{cats[0]}" if len(cats) == 1 else f"{len(cats)} categories" if cats else "no categories"
    if cats:              # the prompts counted per category, not the planned number (`--limit` takes fewer)
        lo, hi = int(ar.category.value_counts().min()), int(ar.category.value_counts().max())
        what = f"{lo if lo == hi else f'{lo}-{hi}'} per category, {what}"
    planned = (run.folder.config.get("resolved") or {}).get("n_selected")
    if planned and len(ar) < planned:     # a long run (the leaderboard) is accumulated and rendered as it goes
        what += f"; PARTIAL: {len(ar)} of the {planned} planned prompts measured so far"
    b.heading = f"{b.task} · {b.model} · {b.dtype} · {len(ar)} prompts ({what}) · {experiments(b)}"
    b.caption = (f"{env['processor']} ({flags(env)}), {env.get('cpu_count')} cores, {run.folder.threads} thread"
                 f"{'' if run.folder.threads == 1 else 's'} · "
                 f"{b.model} · {b.dtype} · torch {env['versions']['torch']} · commit {short(run.commit)} · n = "
                 f"{len(ar)} prompts ({what}), {int(ar.tokens.sum()) if len(ar) else 0} new tokens (≤ "
                 f"{run.folder.max_new_tokens} per prompt), median of {run.folder.repeats} repeats")
    return f"{b.task} · {b.model} · {b.dtype} · {env['processor']}"


def fill(b: Board, sources: load.StandIns) -> None:
    """The board's numbers, heading, caption, verdict and display tables."""
    b.rows = r = ranked(b.runs)
    title, tid = describe(b), f"{b.fingerprint}-{b.slug}"
    speed = pd.DataFrame({
        "#": range(1, len(r) + 1), "method": [m + (" (auto: AR)" if n else "") for m, n in zip(r.method, r.nothing)],
        "speedup [95% CI]": [ci(*x) for x in zip(r.speedup_vs_ar, r.speedup_ci_low, r.speedup_ci_high)],
        "τ": r.block_efficiency.map(num), "predicted": r.predicted_speedup.map(num),
        "verified/step": r.verify_tokens_per_step.map(lambda v: num(v, 1)), "step cost": r.step_cost.map(num),
        "identical": r.n_identical, "near-tie": r.n_near_tie.fillna(0).astype(int), "lost": r.lost})
    if len(b.runs) > 1:
        speed["run"] = r.run
    folders = "; ".join(f"{LETTERS[i]} = {x.rel}" for i, x in enumerate(b.runs))
    left = "".join(f" Left out: {rel}: {why}." for rel, why in b.left_out)
    b.tables = [Table(f"{tid}-speed", f"Speed, ranked by speedup: {title}", speed,
                      f"{CONVENTIONS} Folders: {folders} (each row against its own folder's AR).{left}")]
    b.accept = acceptance(b, sources)
    depth = max([1, *(len(a) for a, _ in b.accept.values())])
    if b.accept:
        acc = pd.DataFrame([{"method": m, **{f"a_{j + 1}": num(a[j], 3) if j < len(a) else "" if a or j else "n/a"
                                             for j in range(depth)}, "source": src}
                            for m, (a, src) in b.accept.items()])
        b.tables.append(Table(f"{tid}-accept", f"Acceptance per draft position: {title}", acc,
                              "a_j = steps where draft position j was accepted / verify steps, summed over prompts "
                              f"(up to {POSITIONS} positions). source: this speed run's speed.jsonl, else a replay or "
                              "run of the same task, model, dtype and heads profile (greedy trajectories; its "
                              "config.json names its machine and heads), else n/a."))
    top = best_two(r[~r.nothing].rename(columns={"speedup_vs_ar": "speedup", "speedup_ci_low": "lo",
                                                  "speedup_ci_high": "hi"}))
    b.verdict = f"**{b.heading}**: " + (" ".join(pick(top, 0)) if top else "no drafter measured")
    if len(top) > 1:
        b.verdict += f"; second {' '.join(pick(top, 1))}; separated: {separated(top)}"
    if top and top[0]["speedup"] < 1:
        b.verdict += "; no drafter is faster than AR here"
    cat = by_category(b)
    if cat.category.nunique() < 2:                  # one category: the speed table already says it all
        return
    order, counts = list(dict.fromkeys(cat.category)), cat.groupby("category", sort=False).n.max()
    grid = cat.pivot(index="method", columns="category", values="speedup")
    grid = grid.reindex([m for m in r.method if m in grid.index])[order].map(num)
    grid = grid.reset_index().rename_axis(columns=None)
    parts = fit(grid)
    for i, part in enumerate(parts, 1):
        k = f" ({i}/{len(parts)})" if len(parts) > 1 else ""
        b.tables.append(Table(f"{tid}-category-{i}", f"Speedup by category{k}: {title}", part,
                              "Per category: sum of AR's median seconds / the method's over its counted prompts of "
                              "that category (speed.jsonl); prompts per category: "
                              f"{', '.join(f'{c} {n}' for c, n in counts.items())}."))
    which, drafters = [], cat[~cat.method.isin(set(r.method[r.nothing]))]
    for c in order:
        t = best_two(drafters[drafters.category == c])
        (best, s1), (second, s2) = pick(t, 0), pick(t, 1)
        which.append({"category": c, "prompts": int(counts[c]), "best": best, "speedup [95% CI]": s1,
                      "second": second, "second [95% CI]": s2, "separated": separated(t) if t else "n/a"})
    b.tables.append(Table(f"{tid}-which", f"Which drafter per category: {title}", pd.DataFrame(which),
                          "separated: whether the best's 95% interval lies above the second best's; with one or "
                          "two prompts per category the intervals say little."))


def acceptance(b: Board, sources: load.StandIns) -> dict[str, tuple[list[float], str]]:
    """a_1..a_POSITIONS per drafter of the board: the speed run's own counts, else a stand-in folder's, else []."""
    out: dict[str, tuple[list[float], str]] = {}
    for m, letter in zip(b.rows.method, b.rows.run):
        if not is_drafter(m):
            continue
        run = b.runs[LETTERS.index(letter)]
        mine = run.records[run.records.method == m]
        got = load.summed_acceptance(mine[counted(mine)].to_dict("records")) if len(mine) else None
        found = (*got, "this run") if got else sources.find(run.folder, m)
        if found and found[0]:
            steps, acc, src = found
            out[m] = ([a / steps for a in acc[:POSITIONS]], src)
        else:
            out[m] = ([], "n/a")
    return out

