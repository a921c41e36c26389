"""What every generation of training data shares: the dtype it runs in, its size in greedy positions, the time it is
expected to take (said before it starts), a wall-clock safety cap, and the quality floor of what it produces.

Why data and not seconds: a profile defined by seconds gives different artefacts on different machines. On a CPU
that emulates bfloat16, 370 s of bf16 generation made one batch (401 greedy positions) and the quick heads trained on
it were useless (held-out top-1 ~0.0), silently. So a profile names how much data it holds, generation runs in the
machine's fast dtype (`--dtype auto`), the expected time is printed first (from the hardware calibration when one
is cached, else from the first batch), and time only ever stops generation as a loud failure: past `SAFETY` times
the prediction it stops, says `WARNING:` and the artefact records `truncated_by_time: true` and a quality warning.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import torch

Log = Callable[[str], None]

# Held-out head-1 (depth-1) top-1 agreement below which an artefact is flagged. Working heads on the 0.5B model
# reach 0.18 (quick) to 0.24 (full); 8k greedy positions gave 0.20. Below 0.10 a drafter accepts so little that a
# run with it measures the training data's size, not the method, so every run that uses it says so.
QUALITY_FLOOR = 0.10
SAFETY = 3.0            # generation past SAFETY x the predicted time stops (a warning, never the definition)
FILL = 0.65             # greedy positions per row over its length cap (EOS ends summaries and answers early): the
                        # shipped quick heads' 240 prompts (caps 24,360) gave ~16.1k, the full heads' 672 ~41.4k


def resolve_dtype(dtype: str, log: Log = print, device: str = "cpu") -> tuple[str, str]:
    """(concrete dtype, why): `auto` becomes the device's fast dtype (hardware/dtype.py), said once."""
    if dtype != "auto":
        return dtype, "fixed by the profile"
    from ..hardware import dtype as dtype_lib
    threads = torch.get_num_threads()
    resolved = dtype_lib.resolve("auto", device, threads, log)
    try:
        reason = dtype_lib.choose(device, threads).reason
    except Exception:  # noqa: BLE001 - the reason is only said, never needed
        reason = "this machine's fast dtype"
    return resolved, f"auto: {reason}"


def predict_seconds(model_name: str, dtype: str, positions: int, batch: int, prompts: list[tuple[list[int], int]],
                    device: str = "cpu") -> float | None:
    """Expected generation time from the hardware calibration (None when none is cached): per batch, a prefill of
    its prompt tokens plus one B-row decode step per generated token of its longest row."""
    try:
        from ..hardware.calibration import cached
    except ImportError:
        return None
    try:
        cal = cached(model_name, dtype, device, torch.get_num_threads())
        if cal is None or not prompts:
            return None
        mean_cap = sum(g for _, g in prompts) / len(prompts)
        mean_prompt = sum(len(p) for p, _ in prompts) / len(prompts)
        n_batches = math.ceil(positions / max(1.0, batch * mean_cap * FILL))
        per_batch = (mean_cap * cal.step_ms * cal.cost(batch) / 1000
                     + batch * mean_prompt / max(cal.prefill_tok_per_s, 1e-9))
        return float(n_batches * per_batch)
    except Exception:  # noqa: BLE001 - a calibration of another version: fall back to timing the first batch
        return None


def predict_from_batch(clock: dict, positions: int, batch: int, prompts: list[tuple[list[int], int]]) -> float | None:
    """Expected generation time from the first batch's own rates (no calibration cached): its prefill seconds per
    prompt token and its seconds per decode step, applied to the pool's mean prompt length and length cap, as
    `predict_seconds` applies the calibrated ones. Why not the first batch's positions per second: batches are sorted
    by length cap, so the first one holds the shortest answers and its rate misleads by several times."""
    if not prompts or not clock.get("prompt_tokens") or not clock.get("steps"):
        return None
    mean_cap = sum(g for _, g in prompts) / len(prompts)
    mean_prompt = sum(len(p) for p, _ in prompts) / len(prompts)
    n_batches = math.ceil(positions / max(1.0, batch * mean_cap * FILL))
    per_batch = (batch * mean_prompt * clock["prefill_s"] / clock["prompt_tokens"]
                 + mean_cap * clock["decode_s"] / clock["steps"])
    return float(n_batches * per_batch)


def minutes(seconds: float) -> str:
    return f"~{seconds / 60:.0f} min" if seconds >= 90 else f"~{seconds:.0f} s"


class Pacer:
    """Stops generation at its greedy-position target; predicts its time (calibration, else the first batch) and
    stops it, loudly, past SAFETY x the prediction."""

    def __init__(self, what: str, target: int | None, log: Log, predicted: float | None = None):
        self.what, self.target, self.log, self.predicted = what, target, log, predicted
        self.source = "calibration" if predicted is not None else None
        self.truncated_by_time = self.started = False
        self.t0 = time.time()

    def header(self, batch: int, dtype: str, reason: str, size: str | None = None) -> str:
        """The line said before generation starts, e.g. `quick heads: 16,000 greedy positions in batches of 16,
        float32 (auto: ...), expected ~5 min (calibration)`."""
        size = size or (f"{self.target:,} greedy positions" if self.target else "every prompt")
        when = (f"expected {minutes(self.predicted)} (calibration)" if self.predicted is not None
                else "expected time: measured on the first batch (no calibration cached)")
        return f"{self.what}: {size} in batches of {batch}, {dtype} ({reason}), {when}"

    def done(self, positions: int, batches_left: int) -> bool:
        """Before a batch: True when no batch should start (the target is reached, or the safety cap bit)."""
        if self.target is not None and positions >= self.target:
            return True
        elapsed = time.time() - self.t0
        started, self.started = self.started, True               # the first batch always runs (and is timed)
        if started and self.predicted is not None and elapsed > SAFETY * self.predicted and batches_left:
            self.truncated_by_time = True
            self.log(f"WARNING: {self.what}: generation stopped by its safety cap after {elapsed:.0f}s, "
                     f"{SAFETY:g}x the expected {self.predicted:.0f}s ({self.source}), with {positions:,} of "
                     f"{self.target or 0:,} greedy positions: this machine is much slower than expected (busy, or an "
                     f"emulated dtype); the artefact records truncated_by_time and a quality warning")
            return True
        return False

    def batch_done(self, positions: int, total_batches: int, predicted: float | None = None) -> None:
        """After the first batch without a calibration: extrapolate (from its measured rates when given, see
        `predict_from_batch`, else from its positions) and say it."""
        if self.predicted is not None or positions <= 0:
            return
        elapsed = time.time() - self.t0
        goal = self.target if self.target is not None else None
        self.predicted = predicted if predicted is not None else elapsed * (goal / positions if goal else
                                                                             total_batches)
        self.source = "first batch"
        self.log(f"{self.what}: the first batch made {positions:,} greedy positions in {elapsed:.1f}s: expected "
                 f"{minutes(self.predicted)} in all (first batch)")


def data_warning(what: str, got: int, target: int | None, truncated: bool) -> str | None:
    """One line when the data holds fewer greedy positions than its profile names."""
    if target is None or got >= target:
        return None
    why = "stopped by the safety time cap" if truncated else "the prompt pool ran out"
    return f"{what} holds {got:,} greedy positions, fewer than the profile's {target:,} ({why})"


def quality_warning(what: str, top1: float | None, data: str | None = None) -> str | None:
    """One line when held-out depth-1 top-1 is below QUALITY_FLOOR and/or the data is short; None when fine."""
    parts = []
    if top1 is not None and top1 < QUALITY_FLOOR:
        parts.append(f"{what}: held-out head-1 top-1 {top1:.3f} is below the quality floor {QUALITY_FLOOR:.2f}")
    if data:
        parts.append(data)
    return "; ".join(parts) or None
