"""Another engine's verify cost curve: what one forward over n tokens, every row's logits returned (as a verify needs
them), costs llama.cpp on this machine, in llama.cpp's own 1-token decode steps.

Why: a drafter pays where its block efficiency exceeds its engine's verify cost, and engines price a batched forward
differently: bpdbench's bfloat16 verify of 4 tokens can cost less than its 1-token step (packed oneDNN kernels),
while llama.cpp's quantized kernels are made for one row (on an AVX512-BF16 EPYC, 2 threads: 1.7 steps for 4 tokens,
4.7 for 16). The board shows both curves side by side, so a reader sees why a drafter that pays here may not pay
inside llama.cpp.

Measured the way calibration.py measures bpdbench's own curve: a random context of CONTEXT tokens (the calibration's
middle context) in the KV cache, then rounds that time the 1-token step at the start, middle and end and every other
n once, the cache cropped back untimed after each forward; a cost is the median of its samples each divided by its
own round's step (forward_timing.costs), and readers take the monotone fit (calibration.monotone). Cached beside the
calibration: the machine's fingerprint folder, one file per model, GGUF file (sha256 prefix) and engine version.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .. import paths
from ..store import seal
from . import contention
from .calibration import monotone
from .fingerprint import current
from .forward_timing import ONE, costs

Log = Callable[[str], None]
NS = (1, 2, 4, 8, 16, 32)
CONTEXT = 512
TARGET_SECONDS = 30.0       # a tenth of the calibration's budget: six shapes, not forty, at one context
MIN_ROUNDS, MAX_ROUNDS = 5, 60
VERSION = 1


@dataclass
class EngineCurve:
    engine: str                  # "llama.cpp"
    version: str                 # llama-cpp-python's version (its llama.cpp and kernels)
    model: str
    file: str                    # the GGUF file's name
    sha256: str                  # its sha256 prefix
    threads: int
    fingerprint: dict
    context: int
    step_ms: float               # median 1-token step at `context`
    cost: dict[int, float]       # n -> median cost in steps (raw samples' median; `fitted` is what readers use)
    rounds: int
    seconds: float
    measured_at: str
    others_cores: float | None = None
    load_average: list[float] | None = None
    format: int = VERSION

    def fitted(self) -> dict[int, float]:
        """The monotone fit: a forward over more tokens never costs less (calibration.monotone)."""
        return monotone({1: 1.0, **self.cost})

    @property
    def busy(self) -> bool:
        return contention.is_busy(self.others_cores)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cost"] = {str(n): v for n, v in self.cost.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "EngineCurve":
        d = dict(d)
        d["cost"] = {int(n): float(v) for n, v in d["cost"].items()}
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def time_curve(forward: Callable[[list[int]], object], crop: Callable[[int], None], vocab: int,
               ns=NS, context: int = CONTEXT, rounds: int | None = None, target_s: float = TARGET_SECONDS
               ) -> tuple[float, dict[int, float], int]:
    """(1-token step in seconds, cost per n in steps, rounds timed). `forward(ids)` feeds ids after the cached
    positions and computes every row's logits; `crop(length)` drops the cache past `length`, untimed. One warm-up of
    every shape, one round to size the rest (`rounds` None: about `target_s` in all), then the rounds."""
    import random

    from .timing import timed
    rng = random.Random(0)
    ids = [rng.randrange(vocab) for _ in range(context + max(ns))]
    crop(0)
    forward(ids[:context])
    shapes = sorted({int(n) for n in ns} | {1})

    def run(n: int) -> float:
        secs, _ = timed(lambda: forward(ids[context:context + n]))
        crop(context)
        return secs

    def one_round() -> dict[tuple[str, int], list[float]]:
        times = {ONE: [run(1)]}
        others = [n for n in shapes if n != 1]
        for j, n in enumerate(others):
            if j == len(others) // 2:
                times[ONE].append(run(1))
            times[("chain", n)] = [run(n)]
        times[ONE].append(run(1))
        return times

    for n in shapes:
        run(n)
    t0 = time.perf_counter()
    timed_rounds = [one_round()]
    if rounds is None:
        per_round = max(time.perf_counter() - t0, 1e-3)
        rounds = int(min(MAX_ROUNDS, max(MIN_ROUNDS, target_s / per_round)))
    while len(timed_rounds) < rounds:
        timed_rounds.append(one_round())
    step, cost = costs(timed_rounds)
    return step, {n: c for (_, n), c in sorted(cost.items())}, len(timed_rounds)


def cache_path(model: str, sha256: str, version: str, threads: int) -> Path:
    """<cache>/calibration/<fingerprint key>/<model>-llamacpp<version>-<sha256 prefix>-e<VERSION>.json: the folder of
    the machine's own calibration, so one fingerprint (threads, CPU flags, library versions) holds both curves."""
    safe = str(model).strip("/").replace("/", "_")
    return paths.machine_file("calibration", current(threads, "cpu").key(),
                              f"{safe}-llamacpp{version}-{sha256[:12]}-e{VERSION}.json")


def cached(model: str, sha256: str, version: str, threads: int) -> EngineCurve | None:
    path = cache_path(model, sha256, version, threads)
    curve = seal.readable(path, lambda p: EngineCurve.from_dict(json.loads(p.read_text())))
    return curve if curve is not None and curve.format >= VERSION else None


def save(curve: EngineCurve) -> Path:
    path = cache_path(curve.model, curve.sha256, curve.version, curve.threads)
    with seal.building(path) as tmp:
        tmp.write_text(json.dumps(curve.to_dict(), indent=2))
    return path


def ensure(model: str, file: str, sha256: str, version: str, threads: int,
           opened: Callable[[], tuple[Callable, Callable, int]], log: Log = print, force: bool = False,
           rounds: int | None = None) -> EngineCurve:
    """The cached curve, or (missing, measured busy, or `force`) measured now with the engine `opened()` gives:
    (forward, crop, vocab), and cached."""
    curve = None if force else cached(model, sha256, version, threads)
    if curve is not None and not curve.busy:
        return curve
    log(f"measuring llama.cpp's verify cost curve ({file}, {threads} threads; about {TARGET_SECONDS:.0f} s, once "
        f"per machine)")
    forward, crop, vocab = opened()
    t0 = time.perf_counter()
    with contention.Meter() as meter:
        step, cost, n_rounds = time_curve(forward, crop, vocab, rounds=rounds)
    from .calibration import _load_average
    curve = EngineCurve(engine="llama.cpp", version=version, model=model, file=file, sha256=sha256[:16],
                        threads=threads, fingerprint=json.loads(json.dumps(current(threads, "cpu").to_dict())),
                        context=CONTEXT, step_ms=step * 1000, cost=cost, rounds=n_rounds,
                        seconds=time.perf_counter() - t0,
                        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        others_cores=None if meter.others_cores != meter.others_cores else meter.others_cores,
                        load_average=_load_average())
    path = save(curve)
    fit = curve.fitted()
    log(f"llama.cpp: one step {curve.step_ms:.1f} ms; " + ", ".join(f"{n}: {fit[n]:.2f}" for n in (4, 16) if n in fit)
        + f" steps; {path}")
    if curve.busy:
        log(f"WARNING: while measuring llama.cpp's curve, {contention.describe(curve.others_cores)}; kept for now "
            f"and measured again on its next use")
    return curve
