"""The one reader of result folders behind every table: `results/<area>/<folder>/{config.json, *.csv, *.jsonl}`.

Why one: each table reader used to glob its own folders, read config.json keys its own way (the speed table the
environment's dtype, the drafter tables the run's heads profile, the hardware table the run's dtype) and re-parse
method spellings with canonical(), so two tables could disagree on the same folder and an old spelling (bpd-h3,
oracle-k16) was only as current as the reader that remembered to map it. Here a folder is read once into a
`ResultFolder` (config.json once, its methods parsed once with the one grammar, methods/spelling.py), and an area's
CSV rows come back with `method` set to the parsed Method's label, beside the Methods themselves (`Rows`), so
readers select and pivot on labels and ask the Method for its name and parameters instead of parsing text.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from functools import lru_cache
from itertools import zip_longest
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from .. import paths
from ..methods.base import Method, MethodError
from ..methods.registry import canonical, parse
from ..store import CONFIG, read_examples, read_table


@lru_cache(maxsize=None)
def method(spelling: str) -> Method | None:
    """The Method a spelling names, old spellings included (bpd-h3 -> bpd:heads=3); None where it names no method
    (a file written by a method since removed): its rows keep their text, as the tables always did. Cached, so
    every folder and table that meets a spelling shares one parse of it."""
    try:
        return parse(spelling)
    except MethodError:
        return None


def label(spelling: Any) -> Any:
    """The current label of a spelling (methods.canonical), or the value itself where it is no string at all."""
    return canonical(spelling) if isinstance(spelling, str) else spelling


def methods(spellings: Iterable[str]) -> tuple[Method, ...]:
    """The Methods of some spellings in order, one per label (old and new spellings of one method are one), those
    that name no method left out."""
    found: dict[str, Method] = {}
    for s in spellings:
        m = method(s) if isinstance(s, str) else None
        if m is not None:
            found.setdefault(m.label, m)
    return tuple(found.values())


@dataclass(frozen=True)
class ResultFolder:
    """One result folder and its config.json, read once. The typed fields are what the tables compare runs by;
    where the file records a value twice (asked for in `config`, used in `environment`/`resolved`), the used one
    wins, since that is what the numbers were measured with. A folder without config.json (tests' fixtures, hand-
    copied CSVs) is still a folder: its fields are None, `task` its first folder name under the area, no methods."""
    path: Path
    area: str                       # the sub-folder of the results root: "replay", "drafters/runs", ...
    task: str
    model: str | None
    dtype: str | None
    threads: int | None
    max_new_tokens: int | None
    heads: int | str | None         # --heads (a count, or "auto")
    heads_path: str | None          # --heads-path: heads read from a folder instead of the profile's cache
    heads_profile: str | None       # --heads-profile: the profile trained heads and drafters are read at
    repeats: int | None             # timing repeats of a `speed` run
    config: Mapping[str, Any]       # the whole config.json ({} when there is none), for what only one table needs
    methods: tuple[Method, ...]     # what the run was asked for (its `methods`, else its `config.method`)
    has_config: bool

    @property
    def resolved(self) -> Mapping[str, Any]:
        """What the run resolved (auto sizes, max_new_tokens, the heads it read): `resolved` in config.json."""
        return self.config.get("resolved") or {}

    @property
    def heads_info(self) -> Mapping[str, Any]:
        """The record of the heads the run read (path, profile, held-out agreement); run folders keep it under
        `resolved`, replay folders at the top level."""
        return self.resolved.get("heads") or self.config.get("heads") or {}

    @property
    def environment(self) -> Mapping[str, Any]:
        """The machine and code the numbers were measured on (CPU, flags, fingerprint, versions, commit)."""
        return self.config.get("environment") or {}

    @property
    def rescorer_dtype(self) -> str | None:
        """The dtype neural rescorers ran in (replays); None in files written before it was recorded."""
        return self.config.get("rescorer_dtype")

    def read(self, file: str) -> pd.DataFrame:
        """A CSV of this folder, its `method` column in current labels."""
        return _relabel(read_csv(self.path / file))[0]

    def examples(self, file: str) -> list[dict]:
        """A JSONL of this folder (store.read_examples: each id once), each record's per-method entries (the dict
        values: replay.jsonl keeps one counters dict per method, under the spelling it was written with) keyed by
        current labels; plain fields (id, new_tokens) stay as they are."""
        return [{label(k) if isinstance(v, dict) else k: v for k, v in r.items()}
                for r in read_examples(self.path / file)]


# the columns a table cannot do without, per result file name (a file may lack any other: older ones do, and the
# readers fill those); without them a table would be rewritten with blank cells
REQUIRED = {"speed.csv": ("method", "speedup_vs_ar")}
REWRITE = "restore it (git checkout) or rerun the command that wrote it with --resume, which rewrites it"


def read_csv(path: Path) -> pd.DataFrame:
    """A result CSV (store.read_table: the `null` method label kept as written). A file that is empty, cut short
    (a row with fewer fields than its header: pandas reads them as blanks) or without a column in
    REQUIRED is refused in one line naming it, so no table is rendered from it."""
    try:
        df = read_table(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is empty or not a readable CSV ({str(e).strip().splitlines()[0]}); "
                         f"{REWRITE}") from None
    missing = [c for c in REQUIRED.get(Path(path).name, ()) if c not in df.columns]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)} column; {REWRITE}")
    with open(path, newline="", encoding="utf-8") as f:
        short = next((i for i, row in enumerate(csv.reader(f), 1) if row and len(row) < len(df.columns)), None)
    if short:
        raise ValueError(f"{path}:{short} has fewer fields than its header (the file was cut short); {REWRITE}")
    return df


def read_folder(path: Path, area: str, root: Path | None = None) -> ResultFolder:
    """`path`'s config.json read into a ResultFolder (`root`: the area's folder, for the task of a folder without
    config.json; by default `path`'s parent)."""
    file = path / CONFIG
    try:
        raw: dict = json.loads(file.read_text()) if file.exists() else {}
    except ValueError as e:
        raise ValueError(f"{file} is not valid JSON ({e}); restore it (git checkout) or move the folder out of "
                         f"the results") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{file} holds no JSON object; restore it (git checkout) or move the folder out of the "
                         f"results")
    run, env, res = raw.get("config") or {}, raw.get("environment") or {}, raw.get("resolved") or {}
    asked = raw.get("methods") or ([run["method"]] if run.get("method") else [])
    first = path.relative_to(root).parts[0] if root is not None else path.name
    return ResultFolder(
        path=path, area=area, task=run.get("task") or first, model=run.get("model"),
        dtype=env.get("dtype") or run.get("dtype"), threads=env.get("threads") or run.get("threads"),
        max_new_tokens=res.get("max_new_tokens") or run.get("max_new_tokens"), heads=run.get("heads"),
        heads_path=run.get("heads_path"), heads_profile=run.get("heads_profile"), repeats=raw.get("repeats"),
        config=raw, methods=methods(asked if isinstance(asked, list) else [asked]), has_config=file.exists())


def folders(results: Path, area: str, file: str | None = None, depth: int = 1) -> list[ResultFolder]:
    """The folders `depth` levels under `results/<area>` (sampling: `<task>/<method>-T<t>`, 2), those holding
    `file` when it is given, in path order (the order every table has always listed them in)."""
    root = Path(results) / area
    pattern = "/".join(["*"] * depth)
    found = [p.parent for p in root.glob(f"{pattern}/{file}")] if file else [p for p in root.glob(pattern)
                                                                             if p.is_dir()]
    ignored = paths.git_ignored(root, found) if root.is_dir() else set()
    return [read_folder(p, area, root) for p in sorted(found) if p not in ignored]


def areas(results: Path, prefix: str) -> list[str]:
    """The areas under `results` named `prefix` or `prefix-<variant>` (speed, speed-auto, speed-field, ...), in name
    order: grids file one experiment's variants beside each other, and every table of that experiment reads all."""
    root = Path(results)
    return sorted(p.name for p in root.glob(f"{prefix}*") if p.is_dir() and (p.name == prefix
                                                                           or p.name.startswith(prefix + "-")))


def summed_acceptance(records: Iterable[Mapping[str, Any]]) -> tuple[int, list[int]] | None:
    """(verify steps, steps that accepted draft position j+1) summed over counter records (`steps`,
    `accepted_per_head`); None when any record lacks them, since a partial sum would overstate acceptance."""
    steps, acc = 0, []
    for rec in records:
        per, n = rec.get("accepted_per_head"), rec.get("steps")
        if per is None or n is None or n != n:
            return None
        acc = [sum(x) for x in zip_longest(acc, per, fillvalue=0)]
        steps += int(n)
    return (steps, acc) if steps else None


def acceptance(folder: ResultFolder) -> dict[str, tuple[int, list[int]]]:
    """Per method label, summed_acceptance over the folder's examples: from replay.jsonl (a counters dict per
    method) or a run's examples.jsonl (its one method); {} when neither file holds the counters. Why here: the
    leaderboard falls back to these when a speed run predates per-position counts, and they must be read with the
    same labels as every other table."""
    per: dict[str, list[Mapping[str, Any]]] = {}
    if (folder.path / "replay.jsonl").exists():
        for r in folder.examples("replay.jsonl"):
            for lab, rec in r.items():
                if isinstance(rec, dict):
                    per.setdefault(lab, []).append(rec)
    elif (folder.path / "examples.jsonl").exists() and len(folder.methods) == 1:
        per[folder.methods[0].label] = folder.examples("examples.jsonl")
    return {lab: got for lab, recs in per.items() if (got := summed_acceptance(recs))}


class StandIns:
    """Replay and run folders that stand in for a speed run's per-position acceptance when its speed.jsonl predates
    the counts: same task, model, dtype, heads profile and drafting settings; those with the same heads (recipe,
    greedy positions) and machine first, since acceptance follows the heads and, through bf16 rounding, the CPU."""
    AREAS = (("replay", "replay.jsonl"), ("replay-field", "replay.jsonl"), ("replay-dynamic", "replay.jsonl"),
             ("medusa", "replay.jsonl"), ("drafters/replay", "replay.jsonl"), ("runs", "examples.jsonl"),
             ("drafters/runs", "examples.jsonl"))

    def __init__(self, results: Path):
        self.results = Path(results)
        self._folders: list[ResultFolder] | None = None
        self._read: dict[Path, dict] = {}

    def folders(self) -> list[ResultFolder]:
        if self._folders is None:
            self._folders = [f for k, file in self.AREAS for f in folders(self.results, k, file) if f.has_config]
        return self._folders

    def find(self, speed: ResultFolder, label: str) -> tuple[int, list[int], str] | None:
        """(verify steps, per-position accepted steps, the folder relative to the results root) or None."""
        cfg = speed.config.get("config") or {}

        def same(f: ResultFolder) -> bool:
            theirs = f.config.get("config") or {}
            return ((f.task, f.model, f.dtype) == (speed.task, speed.model, speed.dtype)
                    and f.heads_profile in (None, speed.heads_profile)
                    and all(theirs.get(k) == cfg.get(k) for k in ("temperature", "draft_threshold", "k")
                            if k in theirs and k in cfg)
                    and label in {m.label for m in f.methods})
        heads = speed.heads_info.get("recipe"), speed.heads_info.get("greedy_positions")
        order = sorted((f for f in self.folders() if same(f)), key=lambda f: (
            (f.heads_info.get("recipe"), f.heads_info.get("greedy_positions")) != heads,
            f.environment.get("fingerprint") != speed.environment.get("fingerprint")))
        for f in order:
            if f.path not in self._read:
                self._read[f.path] = acceptance(f)
            steps, acc = self._read[f.path].get(label, (0, []))
            if steps:
                return steps, acc, str(f.path.relative_to(self.results))
        return None


def reports(results: Path, area: str) -> list[dict]:
    """The JSON reports filed directly under `results/<area>` (training reports of `bpdbench train-network`), in
    name order."""
    return [json.loads(p.read_text()) for p in sorted((Path(results) / area).glob("*.json"))]


@dataclass(frozen=True)
class Rows:
    """Every folder's rows of one CSV, concatenated in folder order, with the Method behind each label."""
    frame: pd.DataFrame                 # `method`: current labels; empty (no columns) when no folder has the file
    methods: Mapping[str, Method]       # label -> Method for every label in `method` that names one
    folders: tuple[ResultFolder, ...]

    @property
    def empty(self) -> bool:
        return self.frame.empty

    def where(self, keep: Callable[[Method], bool]) -> pd.Series:
        """A row mask: rows whose method satisfies `keep` (rows whose label names no method: False)."""
        if "method" not in self.frame:
            return pd.Series(False, index=self.frame.index)
        ok = {lab: keep(m) for lab, m in self.methods.items()}
        return self.frame["method"].map(lambda lab: ok.get(lab, False)).astype(bool)

    def subset(self, mask: pd.Series) -> "Rows":
        """The rows under `mask`, with the same Methods (readers filter, then pivot)."""
        return Rows(self.frame[mask], self.methods, self.folders)


def rows(results: Path, area: str, file: str, depth: int = 1,
         per_folder: Callable[[ResultFolder, pd.DataFrame], pd.DataFrame] | None = None) -> Rows:
    """`file` of every folder of a area. `per_folder` adds what a table takes from each folder's record (the speed
    table its model and settings, the drafter tables the heads profile) before the folders are concatenated."""
    found = folders(results, area, file, depth)
    frames, labelled = [], {}
    for f in found:
        df, ms = _relabel(read_csv(f.path / file))
        labelled.update(ms)
        frames.append(per_folder(f, df) if per_folder else df)
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return Rows(frame, labelled, tuple(found))


def table(results: Path, area: str, file: str, depth: int = 1) -> pd.DataFrame:
    """`rows(...).frame`: for the tables that only select and pivot on labels."""
    return rows(results, area, file, depth).frame


def _relabel(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Method]]:
    """`df` with its `method` spellings replaced by current labels, and the Methods of those labels (each distinct
    spelling parsed once)."""
    if "method" not in df:
        return df, {}
    found: dict[str, Method] = {}
    new: dict[Any, Any] = {}
    for s in df["method"].unique():
        m = method(s) if isinstance(s, str) else None
        new[s] = m.label if m is not None else s
        if m is not None:
            found.setdefault(m.label, m)
    df["method"] = df["method"].map(new)
    return df, found
