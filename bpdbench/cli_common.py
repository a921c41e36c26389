"""What every command shares: the Typer app, the one-line error wrapper and the common options.

Split from cli.py so each command group stays a short file; importing it has no side effects beyond building the app.
"""
from __future__ import annotations

from functools import wraps
from typing import Optional

import typer
from rich.console import Console

from .config import RunConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Benchmark blockwise parallel decoding and the "
                  "drafting methods around it.")
console = Console(stderr=True)


def _log(message: str) -> None:
    console.print(message, highlight=False, soft_wrap=True)


def one_line_errors(fn):
    """Known user errors become one line naming what is wrong and how to fix it."""
    @wraps(fn)
    def wrapper(*args, **kwargs):
        from tasks import DataError
        from .config import ConfigError
        from .experiments.certificate import LostExamples
        from .models import ModelError
        from rich.markup import escape      # a message may quote [brackets] (TOML tables, lists): print them as is
        try:
            return fn(*args, **kwargs)
        except LostExamples as e:      # a real loss: records and summary are written, the exit status says it
            console.print(f"[red]error:[/red] {escape(str(e).splitlines()[0])}", highlight=False, soft_wrap=True)
            raise typer.Exit(1)
        except (ConfigError, DataError, ModelError, FileExistsError, FileNotFoundError, ValueError) as e:
            console.print(f"[red]error:[/red] {escape(str(e).splitlines()[0])}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except KeyboardInterrupt:
            console.print("interrupted: finished examples are saved; rerun with --resume to continue")
            raise typer.Exit(130)
    return wrapper


_T = typer.Option("xsum", help="task (see `bpdbench tasks`)")
_M = typer.Option("qwen2.5-coder-0.5b", help="registered name, local HF dir or Hub id")
_H = typer.Option(8, help="use the first N heads (a method's heads= overrides it)")
_HP = typer.Option("quick", help="heads profile: quick | full | ci | init (untrained)")
_HPATH = typer.Option(None, help="heads directory (ours or a Medusa-1 checkpoint)")
_L = typer.Option(30, help="examples")
_O = typer.Option(0, help="first example (deterministic order)")
_N = typer.Option(None, help="max new tokens (default: the task's)")
_D = typer.Option("auto", help="auto (bfloat16 where this machine runs it natively, else float32; said with "
                               "its reason) | bfloat16 | float32 (exact)")
_DEV = typer.Option("cpu", help="cpu | cuda | auto")
_TH = typer.Option(None, help="torch threads")
_K = typer.Option(16, help="lattice width (top-k per head) for refined methods (a method's k= overrides it)")
_A = typer.Option(None, help="rescorer weight (a method's alpha= overrides it); default: the tuned table")
_AF = typer.Option(None, help="tuned-alpha table (default: <results>/alpha.json)")
_RES = typer.Option(False, help="keep what an earlier run with the same settings wrote to --out; do only the rest "
                                "(also extends a run to a larger --limit)")
_DD = typer.Option(None, help="data dir (default: $BPDBENCH_DATA or ../shared/data)")
_DF = typer.Option(None, help="data file (task `prompts`: JSONL with id, prompt)")
_OUT = typer.Option(None, help="result directory (default: under the checkout's results/)")
_NAT = typer.Option(False, "--no-auto-train", help="refuse to train missing heads or neural rescorers (> 1 min)")
_TEMP = typer.Option(None, "--temperature", help="sample at this temperature (transformers' warpers define p; "
                     "speculative sampling keeps it exact); unset or 0: greedy")
_TOPP = typer.Option(None, "--top-p", help="nucleus sampling (needs --temperature > 0); unset: off")
_TOPK = typer.Option(None, "--top-k", help="top-k sampling (needs --temperature > 0); unset or 0: off")
_SEED = typer.Option(None, "--seed", help="example i samples from a generator seeded seed + offset + i (default 0)")



def _threads(threads: Optional[int]) -> None:
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    if threads:
        import torch
        torch.set_num_threads(threads)


def _cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads, data_dir=None,
         data_file=None, out=None, alpha_file=None, no_auto_train=False, heads_path=None, device="cpu",
         **sampling) -> RunConfig:
    """The flags every decoding command shares, as one RunConfig (validated once, by experiments.plan.prepare)."""
    return RunConfig(task=task, model=model, heads=heads, heads_profile=heads_profile, heads_path=heads_path,
                     limit=limit, offset=offset, max_new_tokens=max_new_tokens, dtype=dtype, k=k, threads=threads,
                     data_dir=data_dir, data_file=data_file, out=out, alpha_file=alpha_file, device=device,
                     auto_train=not no_auto_train, **sampling)
