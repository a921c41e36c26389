"""Whether a board may rank at all: its noise floor (the `null` row, AR timed as a method), its repeat spread and
load, and whether it still follows today's leaderboard grid.

Why: a speedup is only as good as the timing under it. A board whose AR-against-AR row reads 1.08x ranks noise, so
it is refused (no ranking, no verdict) with the load and spread that explain it; a board made before every board
carried a null row says its noise floor is unchecked. A board of an older grid (other rows, repeats or tokens) is
not today's answer, and the index says which boards follow today's grid.
"""
from __future__ import annotations

import re
import tomllib
from functools import lru_cache

import pandas as pd

from .. import paths
from . import load

NULL = "null"                       # the empty drafter timed as a method: every board's noise-floor row
TOLERANCE = 0.03                    # the null row's speedup must lie within 1.00 ± 3%
GRIDS = ("grids/leaderboard.toml", "grids/leaderboard-full.toml")


def is_grid(path: str | None) -> bool:
    """Whether a recorded sweep grid is the leaderboard's (repo-relative, or an absolute path ending in it)."""
    return bool(path) and any(str(path) == g or str(path).endswith("/" + g) for g in GRIDS)


def conditions(rows: pd.DataFrame) -> str:
    """The board's repeat spread and load, as one clause every board prints."""
    def most(col: str) -> str:
        return f"{rows[col].max():.2f}" if col in rows and rows[col].notna().any() else "—"
    spread = rows.median_spread if "median_spread" in rows else pd.Series(dtype=float)
    ar = rows[rows.method == "ar"].median_spread if "median_spread" in rows else pd.Series(dtype=float)
    shown = (f"repeat spread (max - min) / median: {spread.median():.1%} median over rows, AR's "
             f"{ar.iloc[0]:.1%}" if spread.notna().any() and len(ar) and pd.notna(ar.iloc[0]) else
             "repeat spread —")
    return f"{shown}; load average ≤ {most('load_average_max')}, others' cores ≤ {most('others_cores_max')}"


def noise_floor(rows: pd.DataFrame, today: bool) -> tuple[str, str]:
    """(refusal, line): refusal is "" when the board may rank. The null row must read 1.00 ± 3% with an interval
    containing 1; a grid board of today's protocol without one is refused; an older board or a study without one
    says "unchecked" (a study ranks its own rows and never answers "which drafter" for the machine)."""
    null = rows[rows.method == NULL]
    if null.empty:
        if today:
            return (f"REFUSED: no `{NULL}` row (AR timed as a method), so the noise floor is unknown; "
                    f"{conditions(rows)}", "")
        return "", f"noise floor unchecked (no `{NULL}` row timed beside the methods); {conditions(rows)}"
    s = null.iloc[0]
    v, lo, hi = s.speedup_vs_ar, s.get("speedup_ci_low"), s.get("speedup_ci_high")
    band = abs(v - 1) <= TOLERANCE
    spans = pd.isna(lo) or pd.isna(hi) or lo <= 1 <= hi
    shown = f"{v:.3f}" + ("" if pd.isna(lo) or pd.isna(hi) else f" [{lo:.3f}, {hi:.3f}]")
    if band and spans:
        return "", f"noise floor: `{NULL}` reads {shown}, within 1.00 ± {TOLERANCE:.0%}; {conditions(rows)}"
    why = f"outside 1.00 ± {TOLERANCE:.0%}" if not band else "its interval excludes 1"
    return f"REFUSED: the noise-floor row `{NULL}` reads {shown}, {why}; {conditions(rows)}", ""


def today_protocol(records: pd.DataFrame) -> bool:
    """Whether a folder was made under today's speed protocol: its records name their question (`speed` writes it
    since the board's protocol; speed.csv columns alone are recomputed for old folders too, so they cannot tell)."""
    return "question" in records


@lru_cache(maxsize=None)
def _blocks(grid: str) -> tuple[dict, ...]:
    path = paths.REPO / grid
    if not path.is_file():
        return ()
    doc = tomllib.loads(path.read_text())
    defaults = doc.get("defaults") or {}
    return tuple({**defaults, **b} for b in doc.get("speed") or [])


def follows_today(folder: load.ResultFolder, rel: str) -> str:
    """"" when the folder is a cell of today's leaderboard grid with the same methods and protocol; else what
    differs (the board follows an older grid)."""
    sweep = folder.config.get("sweep") or {}
    grid = next((g for g in GRIDS if is_grid(sweep.get("grid")) and str(sweep["grid"]).endswith(g)), GRIDS[0])
    blocks = _blocks(grid)
    if not blocks:
        return f"{grid} not found here"
    asked = [m.label for m in folder.methods]
    cfg = folder.config.get("config") or {}
    why = "no cell of today's grid writes this folder"
    for b in blocks:
        out = str(b.get("out", "")).replace("{task}", folder.task)
        pattern = re.escape(out).replace(re.escape("{machine}"), "[0-9a-f]+")
        if folder.task not in (b.get("tasks") or [b.get("task")]) or not re.fullmatch(pattern, rel):
            continue
        want = [m.label for m in load.methods(b.get("methods") or [])]
        diff = [k for k, mine, theirs in (
            ("methods", set(asked), set(want)), ("repeats", folder.repeats, b.get("repeats")),
            ("new tokens", folder.max_new_tokens, b.get("max_new_tokens")),
            ("prompts per category", folder.config.get("per_category"), b.get("per_category")),
            ("limit", cfg.get("limit"), b.get("limit"))) if theirs is not None and mine != theirs]
        if not diff:
            return ""
        why = "today's cell differs in " + ", ".join(diff)
    return why
