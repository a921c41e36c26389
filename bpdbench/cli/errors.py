"""The console every command writes its progress to, and the wrapper that turns a user's mistake into one line.

Progress and errors go to stderr (`console`, `log`) so that what a command prints on stdout (tables, paths, the
certificate's verdicts) can be piped. Kept apart from the options and the commands: every command module needs it,
and it must import nothing heavy (the error types are imported when an error happens, not when `--help` runs).
"""
from __future__ import annotations

import errno
from functools import wraps
from typing import Callable, ParamSpec, TypeVar

import typer
from rich.console import Console

console = Console(stderr=True)

P = ParamSpec("P")
R = TypeVar("R")


def log(message: str) -> None:
    """One progress line on stderr, as written (no markup highlighting, no wrapping of long paths)."""
    console.print(message, highlight=False, soft_wrap=True)


def _error(e: BaseException) -> None:
    from rich.markup import escape      # a message may quote [brackets] (TOML tables, lists): print them as is
    console.print(f"[red]error:[/red] {escape(str(e).splitlines()[0])}", highlight=False, soft_wrap=True)


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Known user errors become one line naming what is wrong and how to fix it (exit 2; a lost example, whose
    records and summary are written, exits 1; an interrupt says how to continue and exits 130). A write the system
    refused (disk full, file-size limit, read-only folder: `store.WriteError`, or such an OSError from a writer that
    does not wrap it) is one line naming the file and the fix (exit 2): what a user fixes, not a bug. Anything else
    is a bug and keeps its traceback."""
    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from tasks import DataError
        from ..config import ConfigError
        from ..experiments.certificate import LostExamples
        from ..models import ModelError
        from ..store import WRITE_ERRNOS, WriteError, write_failed
        try:
            return fn(*args, **kwargs)
        except LostExamples as e:      # a real loss: records and summary are written, the exit status says it
            _error(e)
            raise typer.Exit(1)
        except (ConfigError, DataError, ModelError, FileExistsError, FileNotFoundError, ValueError,
                WriteError) as e:
            _error(e)
            raise typer.Exit(2)
        except OSError as e:            # only errnos a read never gives: a denied read is not called a write
            if e.errno not in WRITE_ERRNOS - {errno.EACCES, errno.EPERM}:
                raise
            _error(write_failed(e, e.filename or "a result or cache file"))
            raise typer.Exit(2)
        except KeyboardInterrupt:
            console.print("interrupted: finished examples are saved; rerun with --resume to continue")
            raise typer.Exit(130)
    return wrapper
