"""PNG figures for `bpdbench tables`, drawn from the same DataFrames as the CSV tables (never from stdout).

One line per task on shared axes, so the paper's per-task figures can be compared at a glance; Agg backend so it
works on headless machines.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd


def lines_by_task(df: pd.DataFrame, x: str, y: str, path: Path, xlabel: str, ylabel: str, title: str,
                  log2_x: bool = False, task_order: list[str] | None = None) -> Path | None:
    """Plot y against x, one line per task; returns the PNG path, or None when there is nothing to draw."""
    if df.empty or not {"task", x, y} <= set(df.columns):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = task_order or []
    tasks = sorted(df.task.unique(), key=lambda t: (order.index(t) if t in order else len(order), t))
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for task in tasks:
        g = df[df.task == task].sort_values(x)
        ax.plot(g[x], g[y], "o-", label=task)
    if log2_x:
        ax.set_xscale("log", base=2)
    xs = sorted(df[x].unique())
    ax.set_xticks(xs, [str(v) for v in xs])
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
