"""What `run` and `replay` print when they finish: the few numbers a reader acts on, as one compact table.

Why: the whole summary row (24 columns and more) printed as Markdown wrapped into an unreadable block on a terminal,
and its `lossless_rate` (the share of outputs identical to greedy) read 0.000 for a bfloat16 run whose 3 outputs
were all certified near-ties, 0 lost: a reader took a correct run for a broken one. The terminal shows method,
examples, block efficiency, certified (exact + near-tie), lost and tokens per second; summary.csv (replay.csv) keeps
every column.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
from rich.console import Console
from rich.table import Table


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _num(v: Any, fmt: str) -> str:
    """A number as `fmt`, "n/a" where the row has none (older files, T > 0 runs without a reference)."""
    return "n/a" if _missing(v) else format(v, fmt)


def _count(row: Mapping[str, Any], key: str) -> int:
    return 0 if _missing(row.get(key)) else int(row[key])


def certified(row: Mapping[str, Any]) -> tuple[str, str]:
    """The certified and lost cells of one summary row. Greedy: exact + near-tie (outputs the verifier proves
    greedy's up to bfloat16 rounding) and lost; T > 0: outputs are draws, certified by `bpdbench certify`, so
    "statistical" and no lost count."""
    if "n_exact" not in row or (row.get("temperature") or 0) > 0:
        return "statistical", "n/a"
    exact, near, lost = (_count(row, k) for k in ("n_exact", "n_near_tie", "n_lost"))
    cell = f"{exact + near} ({exact} exact + {near} near-tie)"
    if _count(row, "n_uncertified"):
        cell += f", {_count(row, 'n_uncertified')} uncertified"
    return cell, str(lost)


def run_table(rows: Iterable[Mapping[str, Any]]) -> Table:
    """One line per run summary row (summary.csv's columns, experiments/summary.py)."""
    rows = list(rows)
    speedup = any(not _missing(r.get("speedup_vs_ar")) for r in rows)
    table = Table(show_edge=False, pad_edge=False)
    for name in ("method", "examples", "block efficiency", "certified (exact + near-tie)", "lost", "tokens/s",
                 *(["speedup vs AR"] if speedup else [])):
        table.add_column(name, justify="left" if name in ("method", "certified (exact + near-tie)") else "right",
                         no_wrap=True)
    for r in rows:
        cert, lost = certified(r)
        table.add_row(str(r["method"]), str(r["n_examples"]), _num(r.get("block_efficiency"), ".3f"), cert, lost,
                      _num(r.get("tokens_per_s"), ".1f"),
                      *([_num(r.get("speedup_vs_ar"), ".2f")] if speedup else []))
    return table


def replay_table(df: pd.DataFrame) -> Table:
    """One line per replayed method (replay.csv): replays score drafts on stored greedy trajectories, so every
    output is greedy's by construction and nothing is timed; the change is against the first method."""
    table = Table(show_edge=False, pad_edge=False)
    first = df.method.iloc[0] if not df.empty else ""
    for name in ("method", "examples", "block efficiency", "acceptance rate", f"vs {first} (%)"):
        table.add_column(name, justify="left" if name == "method" else "right", no_wrap=True)
    for r in df.to_dict("records"):
        table.add_row(str(r["method"]), str(r["n_examples"]), _num(r.get("block_efficiency"), ".3f"),
                      _num(r.get("acceptance_rate"), ".3f"), _num(r.get("relative_change_pct"), "+.1f"))
    return table


def run_verdict(row: Mapping[str, Any], out: Path) -> str:
    """The line under the run table: how many outputs are certified and lost, and where every column is."""
    where = f"every column in {out / 'summary.csv'}"
    if "n_exact" not in row or (row.get("temperature") or 0) > 0:
        return f"sampled at T > 0: outputs are draws, certified by `bpdbench certify`; {where}"
    n, lost = int(row["n_examples"]), _count(row, "n_lost")
    ok = _count(row, "n_exact") + _count(row, "n_near_tie")
    return f"{ok} of {n} outputs certified, {lost} lost; {where}"


def show(table: Table, *lines: str) -> None:
    """On stdout (so a command's result can be piped; progress goes to stderr), wide enough not to wrap cells."""
    console = Console(highlight=False, markup=False, width=max(120, Console().width))
    console.print(table)
    for line in lines:
        console.print(line, soft_wrap=True)
