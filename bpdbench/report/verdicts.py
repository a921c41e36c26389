"""What a leaderboard board says in words: the fastest drafter against each runner-up by a paired bootstrap on the
same prompts ("separated" or "not separated"), numbers as the tables print them, and wide tables split to the page's
column limit.

Why its own module: these rules decide what a reader is told is "the drafter to use" (report/leaderboard.py builds
the boards, this words them), and they take nothing but rows and per-prompt seconds, so they are read and tested
apart from the folders. Why paired: two rows timed on the same prompts share each prompt's length and difficulty;
intervals drawn apart overlap even where one row is faster on every prompt, so the comparison resamples the prompts
once for both (stats.paired_bootstrap_ratio).
"""
from __future__ import annotations

import math

import pandas as pd

from ..stats import paired_bootstrap_ratio
from . import load

MAX_COLUMNS = 12
NOT_DRAFTERS = ("ar", "hf-greedy", "null")  # plain decoding loops: never "the drafter to use"
SHOWN = 4                                   # runner-ups named in a verdict line (the table lists them all)


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


def against_best(rows: pd.DataFrame, units: dict[str, pd.Series]) -> list[dict]:
    """The fastest drafter of `rows` (method, speedup, ranked or not) and every other drafter against it: per
    runner-up, sum of its seconds / the best's over the units (questions) both counted, a paired bootstrap interval
    (stratified by subtask where the units carry one) and whether that interval excludes 1. `units[method]`: seconds
    per unit, indexed by (stratum, unit). The best's entry has ratio 1.0; [] when no drafter has a speedup."""
    d = rows[rows.method.map(is_drafter) & rows.speedup.notna()].sort_values("speedup", ascending=False,
                                                                               kind="stable")
    if d.empty:
        return []
    best = d.iloc[0].method
    out = [{"method": best, "speedup": d.iloc[0].speedup, "lo": d.iloc[0].get("lo"), "hi": d.iloc[0].get("hi"),
            "ratio": 1.0, "ratio_lo": float("nan"), "ratio_hi": float("nan"), "n": len(units.get(best, ())),
            "separated": "best"}]
    mine = units.get(best, pd.Series(dtype=float))
    for row in d.iloc[1:].itertuples():
        theirs = units.get(row.method, pd.Series(dtype=float))
        both = mine.index.intersection(theirs.index)
        strata = [k[0] for k in both] if any(k[0] for k in both) else None
        r, lo, hi = paired_bootstrap_ratio(mine[both].tolist(), theirs[both].tolist(), strata)
        sep = ("n/a (fewer than 2 shared prompts)" if pd.isna(lo) else
               "separated" if lo > 1 or hi < 1 else "not separated")
        out.append({"method": row.method, "speedup": row.speedup, "lo": getattr(row, "lo", float("nan")),
                    "hi": getattr(row, "hi", float("nan")), "ratio": r, "ratio_lo": lo, "ratio_hi": hi,
                    "n": len(both), "separated": sep})
    return out


def verdict(top: list[dict]) -> str:
    """One line: the best drafter with its interval, then the runner-ups it is not separated from (the paired
    test), or that it is separated from all of them."""
    if not top:
        return "no drafter measured"
    best = top[0]
    text = f"{best['method']} {ci(best['speedup'], best['lo'], best['hi'])}"
    rest = top[1:]
    if not rest:
        return text + "; no runner-up"
    close = [t for t in rest if t["separated"] != "separated"]
    if not close:
        text += f"; separated from all {len(rest)} runner-ups (paired bootstrap over prompts)"
    else:
        named = ", ".join(f"{t['method']} ({ci(t['ratio'], t['ratio_lo'], t['ratio_hi'])})" for t in close[:SHOWN])
        more = f" and {len(close) - SHOWN} more" if len(close) > SHOWN else ""
        apart = len(rest) - len(close)
        text += (f"; not separated from {named}{more} (runner-up's seconds / best's, paired bootstrap over "
                 f"prompts)" + (f"; separated from the other {apart}" if apart else ""))
    if best["speedup"] < 1:
        text += "; no drafter is faster than AR here"
    return text


def which_table(top: list[dict]) -> pd.DataFrame:
    """The verdict's rows: the best, then every runner-up with its paired ratio and verdict."""
    return pd.DataFrame([{"method": t["method"], "speedup [95% CI]": ci(t["speedup"], t["lo"], t["hi"]),
                          "seconds / best's [95% CI]": ci(t["ratio"], t["ratio_lo"], t["ratio_hi"]) if i else "—",
                          "paired prompts": t["n"], "against the best": t["separated"]}
                         for i, t in enumerate(top)])
