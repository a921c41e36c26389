"""State a drafter keeps across examples, taken and put back from outside (the optional half of `Drafter`).

Most drafters forget everything in `reset`, so decoding one prompt never depends on the prompts before it. A few
learn across examples on purpose (Token Recycling's successor matrix with `persist=1`, as its authors run it). For
them the order of examples is part of the measurement: timing one prompt `repeats` times lets the second repeat
draft from what the first one taught it, and a resumed replay that starts from a cold matrix is not the
uninterrupted run. Such a drafter implements `snapshot() -> state` and `restore(state)`; these helpers call them
where present and do nothing otherwise, so callers (speed, replay) need not know which drafters learn.

The state must survive a JSON round trip (replay and speed save it beside their results to resume exactly), and
what the drafter learns after `restore` must never reach it: one snapshot is restored before every repeat of a
prompt.
"""
from __future__ import annotations

from typing import Any


def snapshot(drafter: Any) -> Any:
    """The drafter's cross-example state, or None when it keeps none (no `snapshot` method, or it returns None)."""
    take = getattr(drafter, "snapshot", None)
    return take() if callable(take) else None


def restore(drafter: Any, state: Any) -> None:
    """Put back what `snapshot` returned; a None state (nothing kept) is a no-op."""
    if state is None:
        return
    put = getattr(drafter, "restore", None)
    if callable(put):
        put(state)


def keeps_state(drafter: Any) -> bool:
    """Whether decoding with this drafter depends on the examples decoded before (its snapshot is not None)."""
    return snapshot(drafter) is not None
