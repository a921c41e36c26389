"""The one timing helper: device synchronised around a perf_counter, medians of repeats, methods interleaved.

Every wall-clock number in bpdbench (speed, the step-cost benchmark, run's seconds) comes from `timed`, so a CUDA
device is synchronised before the clock is read everywhere, not in some places only.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


def synchronize(device) -> None:
    if torch.cuda.is_available() and str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device="cpu") -> tuple[float, Any]:
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - t0, out


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, device="cpu") -> dict[str, list[tuple[float, Any]]]:
    """Every function `repeats` times, in a fixed order per round, so drifts in machine load hit all alike."""
    runs: dict[str, list[tuple[float, Any]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            runs[name].append(timed(fn, device))
    return runs


def median(times: list[float]) -> float:
    return statistics.median(times)


def median_time(fn: Callable[[], Any], device="cpu", repeats: int = 5) -> float:
    """Median seconds of `repeats` timed calls after one warm-up call."""
    fn()
    return median([timed(fn, device)[0] for _ in range(repeats)])
