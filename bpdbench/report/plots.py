"""PNG figures for `bpdbench tables`, drawn from the same DataFrames as the CSV tables (never from stdout).

One line per task on shared axes, so the paper's per-task figures can be compared at a glance; Agg backend so it
works on headless machines.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .load import ResultFolder


def lines_by_task(df: pd.DataFrame, x: str, y: str, path: Path, xlabel: str, ylabel: str, title: str,
                  log2_x: bool = False, task_order: list[str] | None = None, subtitle: str = "") -> Path | None:
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
    if subtitle:
        fig.suptitle(subtitle, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_speed_by_category(df: pd.DataFrame, path: Path, subtitle: str) -> Path | None:
    """Speedup over AR per category (rows) and method (columns) of one `bpdbench speed` run, as an annotated
    heatmap: with 10+ methods and 13 categories, bars would be unreadable. Blank = the method never reproduced AR
    on that category's prompts (excluded, not zero)."""
    if df.empty or not {"category", "method", "speedup_vs_ar"} <= set(df.columns):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = df.pivot_table(index="category", columns="method", values="speedup_vs_ar", sort=False)
    grid = grid[[m for m in df.method.unique() if m in grid.columns]]      # the run's method order
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * grid.shape[1], 1.2 + 0.38 * grid.shape[0]))
    values = grid.to_numpy(dtype=float)
    span = max(abs(np.nanmax(values) - 1), abs(1 - np.nanmin(values)), 0.1) if np.isfinite(values).any() else 1
    im = ax.imshow(values, cmap="RdYlGn", vmin=1 - span, vmax=1 + span, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(grid.shape[1]), grid.columns, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(grid.shape[0]), grid.index, fontsize=8)
    ax.set_title("Wall-clock speedup over AR per category", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.suptitle(subtitle, fontsize=7, y=0.995)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def speed_caption(folder: ResultFolder, n_prompts: int) -> str:
    """Model, dtype, heads, threads, tokens, repeats and n of a speed run, from its config.json (the profile of the
    heads it read, which --heads-path can make differ from --heads-profile)."""
    profile = folder.heads_info.get("profile", folder.heads_profile)
    return (f"{folder.model}, {folder.dtype}, {folder.heads} heads ({profile}), {folder.threads} threads, "
            f"{folder.max_new_tokens} new tokens, median of {folder.repeats}, n = {n_prompts} prompts")


def speedup_bars(rows: pd.DataFrame, title: str, subtitle: str) -> bytes | None:
    """A board's speedups as horizontal bars in rank order with their 95% interval as whiskers and AR's 1.0 as a
    line, returned as PNG bytes (the leaderboard writes them beside its Markdown and embeds them in its HTML page).
    Bars rather than a heatmap: one benchmark, one value per method, and the whiskers are what tells a lead from
    noise."""
    df = rows[rows.speedup_vs_ar.notna()] if "speedup_vs_ar" in rows else rows.iloc[:0]
    if df.empty:
        return None
    import io
    import textwrap

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    v = df.speedup_vs_ar.to_numpy(dtype=float)
    lo = np.where(np.isfinite(df.speedup_ci_low.to_numpy(dtype=float)), df.speedup_ci_low.to_numpy(dtype=float), v)
    hi = np.where(np.isfinite(df.speedup_ci_high.to_numpy(dtype=float)), df.speedup_ci_high.to_numpy(dtype=float),
                  v)
    y = np.arange(len(df))
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.3 * len(df)))
    ax.barh(y, v, xerr=[np.clip(v - lo, 0, None), np.clip(hi - v, 0, None)], capsize=3,
            color=["#4c9a5f" if x > 1 else "#c0504d" if x < 1 else "#888888" for x in v], alpha=0.85)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(y, df.method.tolist(), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over AR (95% bootstrap interval over prompts)", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.suptitle("\n".join(textwrap.wrap(subtitle, 150)), fontsize=6, y=0.998)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def learning_curves(df: pd.DataFrame, path: Path, subtitle: str) -> Path | None:
    """Held-out top-1 at depth 1 against positions seen (log x), one colour per network: a solid line through one
    training's checkpoints, a dashed one through the weights kept at each budget (quick, full, bench). Where a line
    still climbs, the network's row on the board measures its budget, not its method."""
    df = df.dropna(subset=["positions_seen", "top1_d1"]) if not df.empty else df
    if df.empty:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    colours = plt.get_cmap("tab20")
    for i, (net, g) in enumerate(df.groupby("network", sort=True)):
        colour = colours(i % 20)
        for _, run in g[g.point == "checkpoint"].groupby("profile"):       # within one training
            ax.plot(run.positions_seen, run.top1_d1, "-", color=colour, alpha=0.6)
        kept = g[g.point == "kept"].sort_values("positions_seen")         # across budgets (quick, full, bench)
        ax.plot(kept.positions_seen, kept.top1_d1, "o--", color=colour, label=net)
    ax.set_xscale("log")
    ax.set(xlabel="positions seen by the fit", ylabel="held-out top-1 at depth 1", ylim=(0, 1),
           title="Draft networks: held-out top-1 vs training positions")
    fig.suptitle(subtitle, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
