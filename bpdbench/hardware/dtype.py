"""`--dtype auto`: bfloat16 where this machine multiplies it natively, float32 where bfloat16 is emulated.

Why measured and not only read from the flags: what matters is what torch's kernels do here. On an AVX2 CPU a
bfloat16 matmul over one row is fast (memory-bound, half the bytes) but over 16 rows it costs about 7x float32's,
so verifying a block in bfloat16 costs 7.8 decode steps. The probe times exactly that case, a [rows, d] x [d, 4d]
matmul in both dtypes, in well under a second, and is cached per machine fingerprint. The flags decide when the
probe cannot run (a CUDA device: capability >= 8.0 means bfloat16).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from .. import paths
from ..store import seal
from .fingerprint import Fingerprint, current

PROBE_ROWS = 16            # a typical verify size; where bf16 emulation hurts and where drafting lives
PROBE_SHAPE = (896, 4864)  # the 0.5B model's MLP up-projection (hidden x intermediate)


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str
    reason: str
    bf16_over_fp32: float | None = None   # measured time ratio at PROBE_ROWS rows (None: decided from flags)

    def to_dict(self) -> dict:
        return asdict(self)


def probe(rows: int = PROBE_ROWS, shape: tuple[int, int] = PROBE_SHAPE, repeats: int = 40) -> float:
    """Median over laps of the time ratio bfloat16 / float32 of a [rows, d] x [d, f] matmul on the CPU (> 1: bf16
    is slower). Why each lap times both, in alternating order: timed one dtype after the other, a neighbour's load
    that came or went between them set the ratio (four probes on one AVX2 machine beside a job: 2.77, 0.66, 0.82,
    1.76), and the first probe's choice is kept for the machine."""
    import torch

    d, f = shape
    g = torch.Generator().manual_seed(0)
    pairs = {dt: (torch.randn(rows, d, generator=g).to(dt), torch.randn(f, d, generator=g).to(dt))
             for dt in (torch.float32, torch.bfloat16)}
    for x, w in pairs.values():
        for _ in range(3):
            torch.nn.functional.linear(x, w)
    ratios = []
    for lap in range(repeats):
        took = {}
        for dt in (list(pairs) if lap % 2 else list(pairs)[::-1]):
            x, w = pairs[dt]
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w)
            took[dt] = time.perf_counter() - t0
        ratios.append(took[torch.bfloat16] / took[torch.float32])
    return sorted(ratios)[len(ratios) // 2]


def decide(fp: Fingerprint, ratio: float | None) -> DtypeChoice:
    """The rule, separate from measuring so tests can fake either machine. bfloat16 wins where it is native; where
    the probe shows it slower than float32 at verify sizes, float32 (it is also exact)."""
    flags = " ".join(f for f in fp.flags if f.startswith(("avx512_bf16", "amx", "bf16"))) or "no avx512_bf16/amx"
    if fp.gpu:
        if fp.bf16_native:
            return DtypeChoice("bfloat16", f"{fp.gpu} (sm {fp.gpu_capability}) has bfloat16 tensor cores")
        return DtypeChoice("float32", f"{fp.gpu} (sm {fp.gpu_capability}) has no native bfloat16")
    if ratio is None:
        return DtypeChoice("bfloat16" if fp.bf16_native else "float32",
                           f"CPU flags: {flags} (no probe)")
    if ratio < 0.8 or (fp.bf16_native and ratio <= 1.5):   # emulated bf16 must be clearly faster to be chosen
        how = "native" if fp.bf16_native else "emulated but faster"
        return DtypeChoice("bfloat16", f"bfloat16 is {how} here ({flags}): a {PROBE_ROWS}-row matmul costs "
                                       f"{ratio:.2f}x float32's", ratio)
    return DtypeChoice("float32", f"bfloat16 is emulated here ({flags}): a {PROBE_ROWS}-row matmul costs "
                                  f"{ratio:.1f}x float32's, so verifying a block in bfloat16 would cost several "
                                  f"decode steps", ratio)


def _cache_file(fp: Fingerprint):
    return paths.machine_file("calibration", fp.key(), "dtype.json")


_PENDING: dict = {}


def choose(device: str = "cpu", threads: int | None = None, fp: Fingerprint | None = None) -> DtypeChoice:
    """The auto dtype for this machine, probed once per fingerprint. The decision is written to the cache only
    when a model loads (`persist`), so a command refused for bad input leaves nothing behind."""
    fp = fp or current(threads, device)
    if fp.gpu:
        return decide(fp, None)
    path = _cache_file(fp)
    if path in _PENDING:
        return _PENDING[path]
    if path.exists() and not seal.problem(path):     # a damaged decision is probed again
        try:
            return DtypeChoice(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            pass
    _PENDING[path] = decide(fp, probe())
    return _PENDING[path]


def persist() -> None:
    """Write the decisions probed in this process (called once a model loads): every later process on this machine
    then reads the same choice instead of re-probing a noisy ratio."""
    while _PENDING:
        path, choice = _PENDING.popitem()
        with seal.building(path) as tmp:              # sealed, whole, under a name of this process's own
            tmp.write_text(json.dumps(choice.to_dict(), indent=2))


_SAID: set[tuple[str, str]] = set()


def resolve(dtype: str, device: str = "cpu", threads: int | None = None, log=print) -> str:
    """A concrete dtype for a flag value: `auto` becomes this machine's choice, said once per process with its
    reason; any other value is returned as it is."""
    if dtype != "auto":
        return dtype
    choice = choose(device, threads)
    if (device, choice.dtype) not in _SAID:
        _SAID.add((device, choice.dtype))
        log(f"dtype auto -> {choice.dtype}: {choice.reason}")
    return choice.dtype
