"""The board's "engines a CPU user would pick instead" section: both engines' verify cost curves, from the committed
speed folders alone.

A speed run with llama.cpp rows records in its config.json (`verify_curves`, experiments/engines.py) what one forward
over n tokens costs bpdbench (its calibration) and llama.cpp (hardware/engine_curve.py) on that machine, each in its
own engine's 1-token decode steps, at one context. This module reads it back as a table (n, bpdbench steps, llama.cpp
steps) and draws both curves; folders without it (older runs, runs without llama.cpp rows) give an empty table.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import pandas as pd

from ..store import CONFIG

COLUMNS = ("n", "bpdbench_steps", "llamacpp_steps")


def _curves(folder: Path | object) -> dict | None:
    """A folder's `verify_curves`, from a path or a report.load ResultFolder."""
    config = getattr(folder, "config", None)
    if config is None:
        file = Path(folder) / CONFIG
        config = json.loads(file.read_text()) if file.exists() else {}
    return config.get("verify_curves") or None


def verify_curves(folders: Iterable[Path | object], png: Path | None = None) -> pd.DataFrame:
    """(n, bpdbench_steps, llamacpp_steps) from the first of a board's folders that recorded both curves, its
    settings in `.attrs` (context, step ms of each engine, dtype, llama.cpp's file and version, the folder); with
    `png`, both curves drawn there. Why the first: one board is one machine and one commit, so its folders share one
    cached curve of each engine; which folder is read is said in `.attrs["folder"]`."""
    for folder in folders:
        curves = _curves(folder)
        if not curves or not curves.get("bpdbench") or not curves.get("llamacpp"):
            continue
        ns = sorted({int(n) for n in curves["bpdbench"]} | {int(n) for n in curves["llamacpp"]})
        table = pd.DataFrame({"n": ns,
                              "bpdbench_steps": [curves["bpdbench"].get(str(n), float("nan")) for n in ns],
                              "llamacpp_steps": [curves["llamacpp"].get(str(n), float("nan")) for n in ns]})
        path = getattr(folder, "path", folder)
        table.attrs = {"folder": Path(path).name, **{k: v for k, v in curves.items()
                                                     if k not in ("bpdbench", "llamacpp", "llamacpp_raw", "ns")}}
        if png is not None:
            plot(table, png)
        return table
    return pd.DataFrame(columns=list(COLUMNS))


def plot(table: pd.DataFrame, path: Path) -> Path:
    """Both curves against n (log 2), y = 1 for one decode step; the legend names each engine's own step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = table.attrs
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ours = f"bpdbench {a.get('bpdbench_dtype', '')} (step {a.get('bpdbench_step_ms', float('nan')):.1f} ms)"
    theirs = (f"llama.cpp {a.get('llamacpp_file', '')} (step {a.get('llamacpp_step_ms', float('nan')):.1f} ms, "
              f"llama-cpp-python {a.get('llamacpp_version', '?')})")
    ax.plot(table.n, table.bpdbench_steps, "o-", color="C0", label=ours)
    ax.plot(table.n, table.llamacpp_steps, "s-", color="C3", label=theirs)
    ax.axhline(1.0, color="grey", lw=1, ls=":", label="one decode step (each engine's own)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(table.n), [str(int(n)) for n in table.n], fontsize=7)
    ax.set(xlabel="tokens scored in one forward, every row's logits (n)", ylabel="cost (own decode steps)")
    ax.set_title(f"verify cost per engine, context {a.get('context', '?')} ({a.get('folder', '')})", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def show(curve, cal, console=None) -> None:
    """`bpdbench calibrate --show`: this machine's cached llama.cpp curve beside the calibration's chain at the same
    context, each in its own engine's steps."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    fit = curve.fitted()
    table = Table(title=f"one forward over n tokens, every row's logits, context {curve.context}: decode steps of "
                        f"each engine")
    for name in ("n", f"bpdbench {cal.dtype}", f"llama.cpp {curve.file}"):
        table.add_column(name, justify="right")
    for n in sorted(fit):
        table.add_row(str(n), f"{cal.cost(n, context=curve.context):.2f}", f"{fit[n]:.2f}")
    console.print(table)
    busy = (f"; other processes {curve.others_cores:.2f} cores" + (" (BUSY: not this machine's own)" if curve.busy
                                                                   else "")) if curve.others_cores is not None else ""
    console.print(f"steps: bpdbench {cal.step_ms_at(curve.context):.1f} ms, llama.cpp {curve.step_ms:.1f} ms "
                  f"(llama-cpp-python {curve.version}, {curve.threads} threads, {curve.rounds} rounds, measured "
                  f"{curve.measured_at}{busy})", highlight=False)
