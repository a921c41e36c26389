"""The clock lives with the machine (hardware/timing.py) so that calibration and every experiment share it without
the hardware layer importing experiments; this module keeps the old import path and adds the one thing experiments
need beyond it: an untimed hook before every timed call (`speed` puts a drafter's cross-example state back there,
so each repeat does the same work and the restore itself is never on the clock)."""
from __future__ import annotations

from typing import Any, Callable

from ..hardware.timing import median, synchronize, timed

__all__ = ["interleaved", "median", "synchronize", "timed"]


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, device="cpu",
                before: Callable[[str], None] | None = None) -> dict[str, list[tuple[float, Any]]]:
    """Every function `repeats` times, in a fixed order per round, so drifts in machine load hit all alike;
    `before(name)` runs, untimed, before each call."""
    runs: dict[str, list[tuple[float, Any]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if before is not None:
                before(name)
            runs[name].append(timed(fn, device))
    return runs
