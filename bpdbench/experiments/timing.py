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
    """Every function `repeats` times, interleaved so drifts in machine load hit all alike, in an order that rotates
    by 1/repeats of the list each round; `before(name)` runs, untimed, before each call. Why rotate: in a fixed
    order ar ran first in every round, right after the last method (the peers load another model), and the `auto`
    rows that draft nothing, which decode exactly as ar does, read 1.00-1.10x of it on the leaderboard's first
    prompts."""
    names = list(fns)
    runs: dict[str, list[tuple[float, Any]]] = {name: [] for name in names}
    for r in range(repeats):
        shift = (r * len(names)) // repeats
        for name in names[shift:] + names[:shift]:
            if before is not None:
                before(name)
            runs[name].append(timed(fns[name], device))
    return runs
