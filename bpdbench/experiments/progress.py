"""`bpdbench run` with a live progress bar (tokens per second, block efficiency so far)."""
from __future__ import annotations

import pandas as pd
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..config import RunConfig
from .summary import to_markdown
from .run import run
from ..store import OutputLock, precheck_run
from .session import out_dir, preflight, resolve_method


def run_with_progress(cfg: RunConfig, console) -> dict:
    cfg = cfg.validate()
    method = resolve_method(cfg)             # a bad method, selection, file or --out fails here, before the bar
    label = method.label
    total = len(preflight(cfg, methods=[method], log=lambda m: None))   # warnings: once, from the session
    with OutputLock(out_dir(cfg)):
        precheck_run(out_dir(cfg), cfg.to_dict(), cfg.resume)
        return _run_with_bar(cfg, console, label, total)


def _run_with_bar(cfg: RunConfig, console, label: str, total: int) -> dict:
    totals = {"tokens": 0, "calls": 0, "seconds": 0.0}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[stats]}"), console=console, transient=False) as bar:
        job = bar.add_task(f"{cfg.task} {label}", total=total, stats="")

        def progress(rec: dict) -> None:
            totals["tokens"] += rec["new_tokens"]
            totals["calls"] += rec["serial_calls"]
            totals["seconds"] += rec["seconds"]
            bar.update(job, advance=1, stats=f"{totals['tokens'] / totals['seconds']:.1f} tok/s  block eff "
                       f"{totals['tokens'] / totals['calls']:.2f}")

        row = run(cfg, log=lambda m: bar.console.print(m, highlight=False, soft_wrap=True), progress=progress)
    print(to_markdown(pd.DataFrame([row]).drop(columns=["accepted_per_head"])))
    console.print(f"results in {out_dir(cfg)}")
    return row
