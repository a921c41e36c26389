"""The one timing helper: device synchronised around a perf_counter, medians of repeats, methods interleaved.

Every wall-clock number in bpdbench (speed, the step-cost benchmark, run's seconds) comes from `timed`, so a CUDA
device is synchronised before the clock is read everywhere, not in some places only.
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable

import torch

from . import contention


def synchronize(device) -> None:
    if torch.cuda.is_available() and str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device="cpu") -> tuple[float, Any]:
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - t0, out


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, device="cpu",
                before: Callable[[str], None] | None = None, retimes: int = 0, pause_s: float = 5.0,
                log: Callable[[str], None] | None = None, order_seed: int | None = None
                ) -> dict[str, list[tuple[float, Any]]]:
    """Every function `repeats` times, interleaved so drifts in machine load hit all alike, in an order that rotates
    by 1/repeats of the list each round; `before(name)` runs, untimed, before each call (`speed` puts a drafter's
    cross-example state back there, so each repeat does the same work and the restore is never on the clock). Why
    rotate: in a fixed order ar ran first in every round, right after the last method (the peers load another
    model), and the `auto` rows that draft nothing, which decode exactly as ar does, read 1.00-1.10x of it on the
    leaderboard's first prompts. `order_seed` (speed gives each prompt its own): each round in its own seeded random
    order instead. Why: rotating by half a list of 10 for 2 repeats still put ar right after the peers in every round,
    and first after the previous prompt's certificates and files; the null row (ar timed as a method) then read 1.04x
    ar over a board's first 10 prompts (AMD EPYC, 2 cores). A random order gives every method every place alike, so
    what a place costs is noise spread over all of them, and the null row can check it.

    `retimes`: a call during which other processes kept the CPU busy (hardware/contention.py) is timed again, from
    the same state, at most `retimes` times, `pause_s` apart. Why per call: a meter over a whole prompt averages a
    busy minute into half an hour of idle ones; on the leaderboard a test run beside the first round made ar's
    first repeat 54.5 s against 13.5 s and 18.7 s, while the prompt's meter read 0.21 cores, under its threshold."""
    names = list(fns)
    runs: dict[str, list[tuple[float, Any]]] = {name: [] for name in names}
    for r in range(repeats):
        shift = (r * len(names)) // repeats
        order = (names[shift:] + names[:shift] if order_seed is None
                 else random.Random(order_seed * 1_000_003 + r).sample(names, len(names)))
        for name in order:
            for attempt in range(1 + retimes):
                if attempt:
                    time.sleep(pause_s)
                if before is not None:
                    before(name)
                with contention.Meter() as others:
                    took = timed(fns[name], device)
                if attempt == retimes or not contention.is_busy(others.others_cores):
                    break
                if log is not None:
                    log(f"{name}: timed while {contention.describe(others.others_cores)}; timing it again "
                        f"({attempt + 1}/{retimes})")
            runs[name].append(took)
    return runs


class StepClock:
    """The model's one-token decode step after a `context`-token prefill, timed in batches of `tick`s: the unit a
    draft's cost is priced in. One timer for every such price (a self-draft's cost, `auto`'s drafting), because the
    step must be timed beside what it prices: a shared host ran this VM's step at 63 ms when the cost curve was
    measured and at 69-110 ms later, minute to minute, so a draft timed then looked up to half again as dear in the
    curve's steps as it was."""

    def __init__(self, model: Any, context: int = 64):
        from transformers import DynamicCache
        self.model, self.times = model, []
        self.cache = model.new_cache() if hasattr(model, "new_cache") else DynamicCache()   # as its drafter's
        with torch.inference_mode():
            model(input_ids=torch.zeros(1, context, dtype=torch.long), past_key_values=self.cache, use_cache=True,
                  logits_to_keep=1)

    def tick(self, n: int = 4, warm: int = 1) -> "StepClock":
        """`n` timed forwards after `warm` untimed ones (the first after other work refills the CPU's caches)."""
        with torch.inference_mode():
            for i in range(warm + n):
                t = time.perf_counter()
                self.model(input_ids=torch.tensor([[i + 1]]), past_key_values=self.cache, use_cache=True,
                           logits_to_keep=1)
                if i >= warm:
                    self.times.append(time.perf_counter() - t)
        return self

    def ms(self) -> float:
        """Median milliseconds of every step timed so far."""
        return 1000 * statistics.median(self.times) if self.times else 0.0


def median(times: list[float]) -> float:
    return statistics.median(times)
