"""`bpdbench run` with a live progress bar (tokens per second, block efficiency so far)."""
from __future__ import annotations

import pandas as pd
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .certificate import LostExamples
from .command import Plan
from .summary import SUMMARY_CSV
from .execute import execute
from .terminal import run_table, run_verdict, show


def run_with_progress(plan: Plan, console) -> dict:
    """The plan was checked before this (prepare); `run` takes the folder's lock, once."""
    cfg, label, total = plan.cfg, plan.method.label, len(plan.examples)
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

        try:
            row = execute(plan, lambda m: bar.console.print(m, highlight=False, soft_wrap=True), progress)
        except LostExamples:        # every record and the summary are written: show them before the error line
            if (plan.out / SUMMARY_CSV).exists():
                lost = pd.read_csv(plan.out / SUMMARY_CSV).iloc[0].to_dict()
                show(run_table([lost]), run_verdict(lost, plan.out))
            raise
    show(run_table([row]), run_verdict(row, plan.out))
    return row
