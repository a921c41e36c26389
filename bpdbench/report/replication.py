"""The board's best rows measured again on a second, disjoint draw of prompts (grids/leaderboard.toml's replication
cell, `<task>-replication` beside `<task>-board`).

Why: a board's interval says how much its number would move with other prompts of the same kind; the replication
checks that claim once, on prompts drawn apart from the board's, instead of trusting the bootstrap. A row whose
replicated speedup falls outside its board interval says the board's number depends on its draw.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .load import read_csv

BOARD, REPLICATION = "-board", "-replication"


def partner(board: Path) -> Path | None:
    """The replication folder beside a board folder (`spec_bench-board` -> `spec_bench-replication`), if any."""
    if not board.name.endswith(BOARD):
        return None
    other = board.with_name(board.name[: -len(BOARD)] + REPLICATION)
    return other if (other / "speed.csv").is_file() else None


def partner_of(again: Path) -> Path | None:
    """The board folder a replication folder belongs to, if that board exists beside it."""
    if not again.name.endswith(REPLICATION):
        return None
    board = again.with_name(again.name[: -len(REPLICATION)] + BOARD)
    return board if (board / "speed.csv").is_file() else None


def compare(board: pd.DataFrame, again: pd.DataFrame) -> pd.DataFrame:
    """Per method in both speed.csv frames (AR left out): the board's speedup and 95% interval, the replication's
    speedup and interval, and whether the replicated speedup lies inside the board's interval."""
    rows = []
    mine = board.set_index("method")
    for r in again.itertuples():
        if r.method == "ar" or r.method not in mine.index:
            continue
        b = mine.loc[r.method]
        lo, hi = float(b.speedup_ci_low), float(b.speedup_ci_high)
        known = all(math.isfinite(v) for v in (lo, hi, float(r.speedup_vs_ar)))
        rows.append({"method": r.method, "board": float(b.speedup_vs_ar), "board_ci_low": lo, "board_ci_high": hi,
                     "replication": float(r.speedup_vs_ar), "replication_ci_low": float(r.speedup_ci_low),
                     "replication_ci_high": float(r.speedup_ci_high), "n_prompts": int(r.n_prompts),
                     "verdict": ("within" if lo <= float(r.speedup_vs_ar) <= hi else "outside") if known else "n/a"})
    return pd.DataFrame(rows, columns=["method", "board", "board_ci_low", "board_ci_high", "replication",
                                       "replication_ci_low", "replication_ci_high", "n_prompts", "verdict"])


def table(board: Path) -> pd.DataFrame | None:
    """`compare` for a board folder and its replication, display-ready; None without a replication folder."""
    again = partner(board)
    if again is None:
        return None
    out = compare(read_csv(board / "speed.csv"), read_csv(again / "speed.csv"))
    fmt = lambda v, lo, hi: f"{v:.2f} [{lo:.2f}, {hi:.2f}]"  # noqa: E731
    return pd.DataFrame({
        "method": out.method,
        "board speedup [95% CI]": [fmt(*x) for x in zip(out.board, out.board_ci_low, out.board_ci_high)],
        "replication [95% CI]": [fmt(*x) for x in zip(out.replication, out.replication_ci_low,
                                                        out.replication_ci_high)],
        "prompts": out.n_prompts, "replicated": out.verdict})
