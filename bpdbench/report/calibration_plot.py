"""The calibration curve as a PNG: what one forward over n tokens costs here, in decode steps.

One line per context length, chain solid and tree dashed in the same colour, and y = 1 (a plain decode step): a
drafter pays off when its block efficiency exceeds the curve at its draft size. The title names what the curve
depends on (model, dtype, CPU and its ISA flags, threads, the step time) so a figure is never read for the wrong
machine. Agg backend, like every figure of bpdbench.
"""
from __future__ import annotations

from pathlib import Path


def title(cal) -> str:
    fp = cal.fingerprint
    where = fp.get("gpu") or fp.get("cpu", "?")
    flags = " ".join(fp.get("flags", [])) or "no ISA flags"
    return (f"{cal.model}, {cal.dtype}, {cal.threads} threads, step {cal.step_ms:.1f} ms\n"
            f"{where} [{flags}] ({fp.get('key', '')})")


def plot_calibration(cal, path: Path) -> Path:
    """Cost in decode steps against tokens scored per forward; returns the PNG path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, ctx in enumerate(cal.contexts):
        colour = f"C{i}"
        chain = sorted(cal.chain[ctx].items())
        ax.plot([n for n, _ in chain], [c for _, c in chain], "o-", color=colour, label=f"chain, context {ctx}")
        tree = sorted(cal.tree[ctx].items())
        if tree:
            ax.plot([n for n, _ in tree], [c for _, c in tree], "s--", color=colour, label=f"tree, context {ctx}")
    ax.axhline(1.0, color="grey", lw=1, ls=":", label="one decode step")
    ns = sorted({n for row in cal.chain.values() for n in row} | {n for row in cal.tree.values() for n in row})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns], fontsize=7)
    ax.set(xlabel="tokens scored in one forward (n)", ylabel="cost (decode steps)")
    ax.set_title(title(cal), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def show_table(cal, console=None) -> None:
    """The curve as a rich table (n against chain / tree cost per context), then step times, prefill and machine."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"cost of one forward over n tokens, in decode steps ({cal.model}, {cal.dtype})")
    table.add_column("n", justify="right")
    for ctx in cal.contexts:
        table.add_column(f"chain @{ctx}", justify="right")
        table.add_column(f"tree @{ctx}", justify="right")
    ns = sorted({n for row in cal.chain.values() for n in row} | {n for row in cal.tree.values() for n in row})
    for n in ns:
        cells = []
        for ctx in cal.contexts:
            for row in (cal.chain[ctx], cal.tree[ctx]):
                cells.append(f"{row[n]:.2f}" if n in row else "")
        table.add_row(str(n), *cells)
    console.print(table)
    steps = ", ".join(f"{ms:.1f} ms @{c}" for c, ms in sorted(cal.step_ms_by_context.items()))
    fp = cal.fingerprint
    load = f"; load average {cal.load_average[0]:.2f} when measured" if cal.load_average else ""
    if cal.others_cores is not None:
        load += f"; other processes {cal.others_cores:.2f} cores" + (" (BUSY: not this machine's own)" if cal.busy
                                                                      else "")
    console.print(f"decode step {cal.step_ms:.1f} ms (context {cal.middle}; {steps}); prefill "
                  f"{cal.prefill_tok_per_s:.0f} tok/s; measured in {cal.seconds:.0f} s at {cal.measured_at}{load}",
                  highlight=False)
    console.print(f"machine {fp.get('key')}: {fp.get('gpu') or fp.get('cpu')}, {fp.get('cores')} cores, flags "
                  f"{' '.join(fp.get('flags', [])) or 'none'}, {cal.threads} threads, torch {fp.get('torch')}, "
                  f"transformers {fp.get('transformers')}; linear kernel {cal.linear}", highlight=False)
    if cal.drafting_ms:
        console.print("drafting per step, measured by `bpdbench speed`: " + ", ".join(
            f"{label} {ms:.1f} ms ({ms / cal.step_ms:.2f} steps)" for label, ms in sorted(cal.drafting_ms.items())),
            highlight=False)
