"""How much CPU other processes took while we timed something, in cores.

Why: on a 2-core machine one other busy process halves a 2-thread forward's speed, and it does not do so evenly: a
1-token step slows more than a 64-token forward, so a calibration measured beside other work has a slower step and
a flatter curve (measured on an AVX512-BF16 EPYC, float32: 52 ms and 16 tokens = 1.41 steps beside one busy core,
36 ms and 1.98 steps idle). Every prediction, every `auto` draft size and the speed regression read that curve, so
a busy measurement must be seen, not silently kept. The load average cannot tell: it counts our own threads and
lags a minute. This meter reads the busy CPU time of the cores this process may run on (/proc/stat) and subtracts
this process's own (`os.times`), over the measured interval. Inside a container with a CPU quota /proc/stat counts
the whole host's tenants, so there it gives no verdict (NaN) rather than a false alarm.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

BUSY_CORES = 0.25      # more than a quarter of a core used by others: timings are not this machine's own
MIN_SECONDS = 1.0      # shorter intervals are a few clock ticks (10 ms): no verdict (NaN) rather than noise


def _quota_limited() -> bool:
    """A cgroup CPU quota: a container sharing a larger host, whose /proc/stat counts the host's other tenants."""
    for path, unlimited in (("/sys/fs/cgroup/cpu.max", "max"), ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1")):
        try:
            with open(path) as f:
                return f.read().split()[0] != unlimited
        except (OSError, IndexError):
            continue
    return False


def _machine_busy_seconds() -> float | None:
    """CPU-seconds spent busy since boot on the cores this process may run on, or None where that cannot be read
    as this machine's own (no /proc/stat, or a CPU quota: then no verdict rather than a false alarm)."""
    if _quota_limited():
        return None
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3:4].isdigit()]
        mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    except OSError:
        return None
    busy = 0
    for fields in lines:
        if mine is not None and int(fields[0][3:]) not in mine:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
        busy += user + nice + system + irq + softirq + steal
    return busy / os.sysconf("SC_CLK_TCK") if lines else None


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class Meter:
    """`with Meter() as m: ...` then `m.others_cores`: the average number of cores other processes kept busy
    (NaN where the machine's counters cannot be read, or over less than MIN_SECONDS)."""
    others_cores: float = math.nan

    def __enter__(self) -> "Meter":
        self._start = (_machine_busy_seconds(), _own_seconds(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        busy0, own0, t0 = self._start
        busy1, own1, t1 = _machine_busy_seconds(), _own_seconds(), time.perf_counter()
        if busy0 is None or busy1 is None or t1 - t0 < MIN_SECONDS:
            return
        self.others_cores = round(max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0), 3)


def is_busy(others_cores: float | None) -> bool:
    return others_cores is not None and not math.isnan(others_cores) and others_cores > BUSY_CORES


def describe(others_cores: float) -> str:
    return f"other processes kept {others_cores:.2f} cores busy (more than {BUSY_CORES} is not an idle machine)"
