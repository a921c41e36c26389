"""The leaderboard's objects: a kept speed folder (`Run`), a board, a machine's page, the whole leaderboard.

Why its own module: report/leaderboard.py groups folders into boards and report/board.py fills a board's tables;
both need these types, and neither should import the other's internals.
"""
from __future__ import annotations

import string
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pandas as pd

from .. import paths
from ..experiments.speed import by_prompt_method
from ..store import read_examples
from . import load
from .provenance import LEAKED, keeps_state, older_default

PROTOCOL = ("limit", "offset", "data_file", "max_prompt_tokens", "heads_profile", "temperature", "top_p", "top_k")
KEY_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
LETTERS = string.ascii_uppercase


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


def flags(env: dict) -> str:
    found = [x for x in KEY_FLAGS if x in (env.get("cpu_flags") or [])]
    return " ".join(found) if found else "no avx2"


def grid_name(path: str | None) -> str:
    """A recorded sweep grid as a page may print it: repo-relative as recorded, else only its file name (a page
    never carries a path of the machine that made the folder)."""
    if not path:
        return "no sweep recorded"
    p = Path(path)
    return f"{p.name} (outside the repository)" if p.is_absolute() else str(path)


@dataclass(frozen=True)
class Run:
    """One kept speed folder: its config, speed.csv rows and speed.jsonl records, method labels as measured (a
    default since changed or a leaked state says so), and the rows whose `auto` sized itself to AR."""
    folder: load.ResultFolder
    rel: str
    summary: pd.DataFrame
    records: pd.DataFrame
    nothing: frozenset = frozenset()
    resolved: dict = field(default_factory=dict)    # shown label -> config.json resolved.methods entry

    @property
    def env(self) -> dict:
        return dict(self.folder.environment)

    @property
    def commit(self) -> str:
        return self.env["git_commit"]

    @property
    def sweep(self) -> dict:
        return dict(self.folder.config.get("sweep") or {})

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
    def ar(self) -> pd.DataFrame:
        return self.records[self.records.method == "ar"]


def read_run(f: load.ResultFolder, rel: str) -> Run:
    records = pd.DataFrame(read_examples(f.path / "speed.jsonl", key=by_prompt_method))
    records["method"] = records["method"].map(load.label)
    summary = f.read("speed.csv")
    resolved = {load.label(k): v for k, v in ((f.config.get("resolved") or {}).get("methods") or {}).items()}
    rename = {m: older_default(m, resolved.get(m) or {}) for m in summary.method}
    if "repeat_drift" not in summary:           # made before state was restored per repeat (experiments/drift.py)
        rename = {m: r + (LEAKED if keeps_state(m, resolved.get(m) or {}) else "") for m, r in rename.items()}
    records["method"] = records["method"].map(lambda m: rename.get(m, m))
    # the `auto` rows that sized themselves to AR, under the label the board shows (renames keep the tag)
    nothing = frozenset(rename.get(m, m) for m, v in resolved.items() if isinstance(v, dict) and v.get("draft_nothing"))
    shown = {rename.get(m, m): v for m, v in resolved.items() if isinstance(v, dict)}
    return Run(f, rel, summary.assign(method=summary.method.map(rename)), records, nothing, shown)


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
    study: bool = False             # not the leaderboard grid's: on the machine's studies page
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)          # numeric, ranked by speedup
    engines: pd.DataFrame = field(default_factory=pd.DataFrame)       # other engines' rows (baseline not "ar")
    accept: dict[str, tuple[list[float], str]] = field(default_factory=dict)
    caption: str = ""
    heading: str = ""
    verdict: str = ""
    refused: str = ""               # why the board may not rank ("" when it may)
    noise: str = ""                 # the noise floor, repeat spread and load, in one line
    today: str = "n/a"              # "" when it follows today's grid, else what differs; "n/a" for studies
    partial: bool = False
    why_study: str = ""             # why a board sits on the studies page
    tables: list[Table] = field(default_factory=list)
    _png: bytes | None = None

    def figure(self) -> bytes | None:
        """The speedup bars (plots.speedup_bars), drawn on first use: collecting alone draws nothing; a refused
        board draws none (it ranks nothing)."""
        if self.refused:
            return None
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
    boards: list[Board]             # the leaderboard grid's: one per benchmark, model and dtype
    studies: list[Board] = field(default_factory=list)
    commits: str = ""               # which commit each grid board comes from, when they differ


@dataclass
class Leaderboard:
    machines: list[Machine]
    left_out: list[tuple[str, str]]
