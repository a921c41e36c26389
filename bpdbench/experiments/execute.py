"""One entry from a prepared Plan to its result files, for the CLI and the sweep alike.

Why: each command's function takes the folder's lock, opens the session, writes through the store's writer and its
summary; the CLI and a grid cell used to reach them by two routes (the sweep with its own dispatch and untyped
settings), so a setting could mean one thing in a flag and another in a grid. Both now call `execute(plan)`, and a
command's own settings travel typed on the Plan (`plan.options`, experiments/plan.py OPTIONS).
"""
from __future__ import annotations

from typing import Any, Callable

from .plan import Plan
from .session import Log


def execute(plan: Plan, log: Log = print, progress: Callable[[dict], None] | None = None) -> Any:
    """The command's own result: run's summary row, speed's folder, certify's families, alpha-law's folder,
    tune's alpha record, replay's and oracle's tables, analyze's tables."""
    from . import commands
    o = plan.options
    if plan.kind == "run":
        from .run import run
        return run(plan, log=log, progress=progress)
    if plan.kind == "speed":
        return commands.speed(plan, o.repeats, log)
    if plan.kind == "replay":
        return commands.replay(plan, log)
    if plan.kind == "oracle":
        return commands.oracle(plan, plan.cfg.k, log)     # the lattice's largest k
    if plan.kind == "analyze":
        return commands.analyze(plan, log)
    if plan.kind == "tune":
        return commands.tune(plan, log)
    if plan.kind == "certify":
        from .sampling_certificate import certify_sampling
        return certify_sampling(plan, ",".join(o.rules), o.samples, o.positions, o.level, log)
    if plan.kind == "alpha_law":
        from . import alpha_law
        path = alpha_law.run(plan, o.gamma_max, o.temperatures, log)
        print((path / "alpha_law.md").read_text())
        log(f"results in {path}")
        return path
    raise ValueError(f"unknown command kind {plan.kind!r}")
