"""One entry from a prepared Plan to its result files, for the CLI and the sweep alike.

Why: each command used to take its folder's lock and open its session itself (seven copies), and the CLI and a grid
cell reached them by two routes, so a setting could mean one thing in a flag and another in a grid. Both now call
`execute(plan)`, which does the same steps for every command (experiments/commands.py COMMANDS): the check inside
the lock, the session, the command's body, then what it prints or the error its result means.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

from .. import store
from ..store import OutputLock
from .command import Log, Plan
from .commands import result_files, spec
from .examples import prompt_sha256
from .session import open_session


def execute(plan: Plan, log: Log = print, progress: Callable[[dict], None] | None = None) -> Any:
    """The command's own result: run's summary row, speed's folder, certify's families, alpha-law's folder,
    tune's alpha record, replay's and oracle's tables, analyze's tables."""
    command = spec(plan.command)
    # one writer per folder, taken before the model loads (tune writes the alpha table, no folder)
    with (OutputLock(plan.out) if plan.out is not None else contextlib.nullcontext()) as lock:
        if plan.out is not None:      # another command's folder, an edited prompt: refused before the model loads
            store.check_command(plan.out, plan.command, result_files())
            if plan.resume and command.result_file:
                store.check_prompts(plan.out / command.result_file, {ex.id: prompt_sha256(ex) for ex in plan.examples})
        command.precheck(plan)
        result = command.body(open_session(plan, log), plan, lock, log, progress)
    command.finish(plan, result, log)
    return result
