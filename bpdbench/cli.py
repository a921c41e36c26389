"""Typer CLI: a thin layer that fills a RunConfig and calls the library. Errors are one line, exit code 2."""
from __future__ import annotations

import os
import sys
from functools import wraps
from pathlib import Path
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every default works offline; unset it to use the Hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", os.environ["HF_HUB_OFFLINE"])
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .config import RunConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Benchmark blockwise parallel decoding.")
console = Console(stderr=True)


def one_line_errors(fn):
    """Known user errors become one line naming what is wrong and how to fix it."""
    @wraps(fn)
    def wrapper(*args, **kwargs):
        from tasks import DataError
        from .config import ConfigError
        from .models import ModelError
        try:
            return fn(*args, **kwargs)
        except (ConfigError, DataError, ModelError, FileExistsError, FileNotFoundError, ValueError) as e:
            console.print(f"[red]error:[/red] {str(e).splitlines()[0]}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except KeyboardInterrupt:
            console.print("interrupted: finished examples are saved; rerun with --resume to continue")
            raise typer.Exit(130)
    return wrapper


@app.command()
@one_line_errors
def run(task: str = typer.Option("xsum", help="task name (see `bpdbench tasks`)"),
        model: str = typer.Option("qwen2.5-coder-0.5b", help="registered name, local HF dir or Hub id"),
        method: str = typer.Option("bpd", help="bpd | ar"),
        heads: int = typer.Option(8, help="use the first N heads"),
        heads_profile: str = typer.Option("quick", help="quick | full | init (untrained)"),
        heads_path: Optional[str] = typer.Option(None, help="heads directory (ours or Medusa-1)"),
        rescorer: str = typer.Option("none", help="draft rescorer (see `bpdbench rescorers`)"),
        limit: Optional[int] = typer.Option(10, help="number of examples"),
        offset: int = typer.Option(0, help="first example (deterministic order)"),
        max_new_tokens: Optional[int] = typer.Option(None, help="default: the task's"),
        dtype: str = typer.Option("bfloat16", help="bfloat16 (fast on CPU) | float32 (exact)"),
        device: str = typer.Option("cpu", help="cpu | cuda | auto"),
        threads: Optional[int] = typer.Option(None, help="torch threads"),
        data_dir: Optional[str] = typer.Option(None, help="default: $BPDBENCH_DATA or ../shared/data"),
        data_file: Optional[str] = typer.Option(None, help="JSONL file (task `prompts`)"),
        out: Optional[str] = typer.Option(None, help="result directory"),
        resume: bool = typer.Option(False, help="continue an interrupted run in --out")):
    """Decode a task's examples, certify losslessness against greedy, write examples.jsonl + summary."""
    from . import runner
    from .results import to_markdown
    import pandas as pd

    cfg = RunConfig(task=task, model=model, method=method, heads=heads, heads_profile=heads_profile,
                    heads_path=heads_path, rescorer=rescorer, limit=limit, offset=offset,
                    max_new_tokens=max_new_tokens, dtype=dtype, device=device, threads=threads, data_dir=data_dir,
                    data_file=data_file, out=out, resume=resume)
    from rescorers import get_rescorer
    get_rescorer(rescorer)  # fail fast on an unknown name
    totals = {"tokens": 0, "calls": 0, "seconds": 0.0}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[stats]}"), console=console, transient=False) as bar:
        job = bar.add_task(f"{task} {method}", total=limit, stats="")

        def progress(rec: dict) -> None:
            totals["tokens"] += rec["new_tokens"]
            totals["calls"] += rec["serial_calls"]
            totals["seconds"] += rec["seconds"]
            bar.update(job, advance=1, stats=f"{totals['tokens'] / totals['seconds']:.1f} tok/s  block eff "
                       f"{totals['tokens'] / totals['calls']:.2f}")

        row = runner.run(cfg, log=lambda m: bar.console.print(m, highlight=False), progress=progress)
    print(to_markdown(pd.DataFrame([row]).drop(columns=["accepted_per_head"])))
    console.print(f"results in {cfg.out_dir()}")


@app.command()
@one_line_errors
def models():
    """List registered models and their cache state."""
    from .models import MODELS, cache_state
    for spec in MODELS.values():
        print(f"{spec.name:22s} {cache_state(spec.name):22s} {spec.note}")


@app.command()
@one_line_errors
def tasks():
    """List tasks."""
    from tasks import TASKS
    for t in TASKS.values():
        print(f"{t.name:15s} {t.group:6s} {', '.join(t.metrics) or '-'}")


@app.command()
@one_line_errors
def rescorers():
    """List draft rescorers."""
    from rescorers import RESCORERS
    for r in RESCORERS.values():
        print(f"{r.name:15s} {r.description}")


@app.command("train-heads")
@one_line_errors
def train_heads_cmd(model: str = typer.Option("qwen2.5-coder-0.5b"),
                    profile: str = typer.Option("quick", help="quick (<=10 min) | full (<=60 min) | ci"),
                    out: Optional[str] = typer.Option(None, help="default: the heads cache"),
                    threads: Optional[int] = typer.Option(None)):
    """Train blockwise heads on the frozen base (self-distillation on held-out prompts)."""
    import torch
    from . import train_heads
    if profile not in train_heads.PROFILES:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join(train_heads.PROFILES)}")
    if threads:
        torch.set_num_threads(threads)
    train_heads.train(model, profile, out=Path(out) if out else None, log=lambda m: console.print(m))


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
