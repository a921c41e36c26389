"""The figure each command draws into its own result folder beside the CSV it is drawn from; each states model,
dtype, heads and n. Tables across folders are drawn by report/."""
from __future__ import annotations

from pathlib import Path

import pandas as pd


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


def plot_alpha_law(df: pd.DataFrame, path: Path, subtitle: str) -> None:
    """Measured tokens per target call against the law (1 - α^(γ+1)) / (1 - α), one colour per temperature."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (t, g) in enumerate(df.groupby("temperature", sort=True)):
        c = f"C{i}"
        ax.plot(g.gamma, g.measured_tokens_per_call, "o-", color=c,
                label=f"T={t:g} measured (α_trial={g.alpha_trial.iloc[0]:.2f})")
        ax.plot(g.gamma, g.predicted_alpha_trial, "--", color=c, label=f"T={t:g} law, α_trial")
        if g.predicted_alpha_beta.notna().any():
            ax.plot(g.gamma, g.predicted_alpha_beta, ":", color=c,
                    label=f"T={t:g} law, α=E[Σmin(p,q)]={g.alpha_beta.iloc[0]:.2f}")
    ax.set(xlabel="draft length γ", ylabel="tokens per target call", title="speculative decoding: α law vs measured")
    ax.set_xticks(sorted(df.gamma.unique()))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(subtitle, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
