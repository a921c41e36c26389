"""PNG figures for `bpdbench tables`, drawn from the same DataFrames as the CSV tables (never from stdout).

One line per task on shared axes, so the paper's per-task figures can be compared at a glance; Agg backend so it
works on headless machines.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd


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


def caption(cfg, n: int) -> str:
    """What every figure states: model, dtype, heads and how many examples."""
    heads = f"{cfg.heads} heads ({cfg.heads_profile})"
    return f"{cfg.model}, {cfg.dtype}, {heads}, n = {n}"


def plot_oracle(df: pd.DataFrame, path: Path, task: str, cfg) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.6))
    ax[0].plot(df.k, df.block_efficiency, "o-")
    ax[0].set(xscale="log", xlabel="k (top-k per head)", ylabel="oracle block efficiency", title=task)
    ax[1].plot(df.k, df.relative_gain_pct, "o-", color="C1")
    ax[1].set(xscale="log", xlabel="k", ylabel="gain vs k=1 (%)")
    for a in ax:
        a.set_xticks(list(df.k), [str(k) for k in df.k])
        a.grid(alpha=0.3)
    fig.suptitle(caption(cfg, int(df.n_examples.iloc[0])), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_entropy(ent, path: Path, task: str, hmax: int, cfg, n: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.boxplot([ent[:, i].numpy() for i in range(ent.shape[1])], showfliers=False)
    ax.plot(range(1, ent.shape[1] + 1), ent.mean(0).numpy(), "o-", label="mean")
    ax.axvline(hmax, ls="--", color="gray", label=f"h_max = {hmax}")
    ax.set(xlabel="head", ylabel="entropy (nats)", title=f"{task}: per-head entropy")
    fig.suptitle(caption(cfg, n), fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
