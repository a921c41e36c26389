"""What a leaderboard table says in words: the two fastest drafters with their intervals, whether those intervals
separate, numbers as the tables print them, and wide tables split to the page's column limit.

Why its own module: these rules decide what a reader is told is "the drafter to use" (report/leaderboard.py builds
the boards, this words them), and they take nothing but rows, so they are read and tested apart from the folders.
"""
from __future__ import annotations

import math

import pandas as pd

from ..stats import bootstrap_ratio
from . import load

MAX_COLUMNS = 12
NOT_DRAFTERS = ("ar", "null", "hf-greedy")  # plain decoding loops: never "the drafter to use"


def is_drafter(label: str) -> bool:
    m = load.method(label)
    return label not in NOT_DRAFTERS and (m is None or m.name not in NOT_DRAFTERS)


def ci(v: float, lo: float, hi: float) -> str:
    if pd.isna(v):
        return "n/a"
    return f"{v:.2f}" if pd.isna(lo) or pd.isna(hi) else f"{v:.2f} [{lo:.2f}, {hi:.2f}]"


def num(v, digits: int = 2) -> str:
    return "n/a" if pd.isna(v) else f"{v:.{digits}f}"


def fit(frame: pd.DataFrame, keep: int = 1, limit: int = MAX_COLUMNS) -> list[pd.DataFrame]:
    """`frame` split into tables of at most `limit` columns, each repeating its first `keep` (the row labels)."""
    rest = list(frame.columns[keep:])
    if len(frame.columns) <= limit:
        return [frame]
    parts = math.ceil(len(rest) / (limit - keep))
    size = math.ceil(len(rest) / parts)
    return [frame[list(frame.columns[:keep]) + rest[i:i + size]] for i in range(0, len(rest), size)]


def best_two(df: pd.DataFrame) -> list[dict]:
    """The two fastest drafters of rows with method and speedup, with their interval (lo, hi: given, else
    bootstrapped from the rows' num/den)."""
    d = df[df.method.map(is_drafter) & df.speedup.notna()].sort_values("speedup", ascending=False, kind="stable")
    top = d.head(2).to_dict("records")
    for t in top:
        if "lo" not in t:
            t["lo"], t["hi"] = bootstrap_ratio(t["num"], t["den"])
    return top


def separated(top: list[dict]) -> str:
    if len(top) < 2:
        return "no second drafter"
    a, b = top
    if any(pd.isna(x) for x in (a["lo"], b["hi"])):
        return "no interval (fewer than 2 prompts)"
    return "no (intervals overlap)" if a["lo"] <= b["hi"] else "yes (best's interval lies above)"


def pick(top: list[dict], i: int) -> tuple[str, str]:
    """(method, "speedup [interval]") of the i-th of best_two, or n/a."""
    return (top[i]["method"], ci(top[i]["speedup"], top[i]["lo"], top[i]["hi"])) if len(top) > i else ("n/a",) * 2
