"""The `bpdbench` command line: a thin layer that turns flags into a RunConfig and calls one library function.

Errors a user can fix are one line, exit code 2, printed before any model loads (the plan validates first). The
commands live by concept: decode.py (the commands that decode), catalog.py (the listings), results.py (result
folders, grids, calibration), train.py (the artefact builders); the flags they share are the named types of
options.py. This package is the top layer: nothing in bpdbench imports it (tests/unit/test_layers.py).
"""
from __future__ import annotations

from typing import Callable

import typer

from . import catalog, decode, results, train

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Benchmark blockwise parallel decoding and the "
                  "drafting methods around it.")

# Registered here, in the order `bpdbench --help` has always listed them, rather than by decorators in each module:
# the listing's order stays one visible list, and the command modules need not import the app (no import circle).
COMMANDS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("train-heads", train.train_heads), ("build-history", train.build_history),
    ("distill-data", train.distill_data), ("train-network", train.train_network),
    ("train-rescorer", train.train_rescorer),
    ("run", decode.run),
    ("methods", catalog.methods), ("models", catalog.models), ("tasks", catalog.tasks),
    ("rescorers", catalog.rescorers), ("cache", catalog.cache),
    ("oracle", decode.oracle), ("analyze", decode.analyze), ("replay", decode.replay), ("tune", decode.tune),
    ("regress", results.regress), ("tables", results.tables),
    ("speed", decode.speed),
    ("sweep", results.sweep),
    ("certify", decode.certify),
    ("calibrate", results.calibrate),
    ("alpha-law", decode.alpha_law),
    ("audit", results.audit),
    ("draw", results.draw),
)
for _name, _command in COMMANDS:
    app.command(_name)(_command)

# Commands renamed when the vocabulary was fixed (docs/architecture.md, Glossary): the old name is one line naming
# the new one, not typer's "No such command".
RENAMED = {"train-drafter": "train-network"}   # retired-word-ok


def main() -> None:
    """The console entry point (`bpdbench`, pyproject.toml)."""
    import sys
    if len(sys.argv) > 1 and sys.argv[1] in RENAMED:
        print(f"error: `bpdbench {sys.argv[1]}` is now `bpdbench {RENAMED[sys.argv[1]]}` (same options)",
              file=sys.stderr)
        raise SystemExit(2)
    app()
