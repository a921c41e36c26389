"""The calibrated cost of a verify forward over n tokens on this machine, in decode steps.

Why: whether a drafter pays off is block efficiency against the cost of the forward that verifies its draft, and
that cost is a property of the machine (ISA, threads, dtype), not a constant: a 16-token chain costs ~1.5 decode
steps on one CPU and ~8 on another. So the curve is measured once per (fingerprint, model, dtype, device) by
timing the engine's own `verify` (loop.py: build_tree -> model_inputs -> model.model -> lm_head -> targets) over a
real KV cache, and cached; every prediction (`cost`, `seconds_for`, `break_even`) reads it.

Shapes measured (forward_timing.py): a chain of n tokens (the root + n - 1 draft tokens: plain causal attention)
and a Medusa-like tree of n nodes, verified through the 4D tree mask.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .. import paths
from ..store import seal
from ..store import write_atomic
from .fingerprint import current
from . import contention, kernels
from .forward_timing import HEAD_ROWS, costs as _costs, crop_to, head_costs, shapes as _shapes
from .forward_timing import time_shapes as _time_shapes
from .forward_timing import tree_drafts, tree_parents  # noqa: F401  (the shapes, for readers of a curve)

Log = Callable[[str], None]
# 16 and 17 both: on a CPU whose matmul kernels block rows by 16 (oneDNN with AMX), a forward over 17 to 64 tokens
# costs about the same and a third more than one over 16 (Intel Xeon with AMX, bfloat16, 2 threads, context 512:
# 1.13 steps at 16 tree nodes, 1.50 at 17, 1.6-1.8 from 20 to 64). Interpolated from 16 to 32 without the edge, a
# 20-node tree was predicted 25% too cheap, and `auto` chose trees of 17-31 nodes for it.
NS = (1, 2, 3, 4, 6, 8, 12, 16, 17, 20, 24, 32, 48, 64)
CONTEXTS = (128, 512, 1024)
# 65 and 80 too: Token Recycling's and SAM's published trees verify up to 81 nodes (a third of their Spec-Bench steps
# over 64), REST's 65, and a curve that stopped at 64 extrapolated those from 48 and 64 across the next row block
TREE_NS = (4, 8, 12, 16, 17, 20, 24, 32, 48, 64, 65, 80)
REPEATS = 3
# a fast machine spends what a slow one needs anyway on more rounds (less noise). 150, not 45: in 3 rounds (42 s) a
# shared host put an 8-token chain at 1.32 steps and a 16-token one at 1.03, and an 8-node tree at 1.72 against 1.30
# at 12 nodes (Intel Xeon with AMX, bfloat16, context 128); the monotone fit spread that spike over 8-20 nodes and
# tree methods' predictions ran up to 18% low
TARGET_SECONDS = 150.0
MAX_REPEATS = 12
LONG_ROUNDS_MIN = 2
VERSION = 4               # 2: the long shapes in two rounds at least, the projection in interleaved rounds;
                          # 3: the row-blocking edge (16, 17) and 12-24 nodes measured (NS, TREE_NS);
                          # 4: rounds for about 150 s, not 45 (TARGET_SECONDS), trees of 65 and 80 nodes


def monotone(points: dict[int, float], floor: float = 1.0) -> dict[int, float]:
    """The least-squares non-decreasing fit (pool adjacent violators) of a cost curve, floored at one step: a forward
    over more tokens never costs less, so a dip (c(2) = 0.77 steps, seen under load) or a lone spike is timing noise,
    and an optimiser reading it raw would chase it. The raw samples stay in the file and the figure."""
    xs = sorted(points)
    blocks: list[list[float]] = []          # [sum, count]
    for x in xs:
        blocks.append([max(points[x], floor), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out, i = {}, 0
    for total, count in blocks:
        for _ in range(int(count)):
            out[xs[i]] = total / count
            i += 1
    return out


def plan_repeats(seconds_at_default: float) -> tuple[int, int]:
    """(rounds, rounds that also time the long shapes) for about TARGET_SECONDS: 3 and 2 on a machine that needs
    that long for them, 5 and 2 for 0.5B float32 on 2 AVX2 cores (a minute and a half for 3), up to 12 and 4 where
    one round takes a few seconds. Never one round for the long shapes: a 64-node tree timed once per context is
    what a tree method's prediction rests on, and one sample of it varied by 15% between two calibrations of one
    idle machine."""
    scale = TARGET_SECONDS / max(seconds_at_default, 1e-3)
    repeats = int(min(MAX_REPEATS, max(REPEATS, REPEATS * scale)))
    return repeats, max(LONG_ROUNDS_MIN, repeats // 3)


def _interp(points: dict[int, float], x: float) -> float:
    """Linear in x between measured points; flat below the first; extrapolated from the last two above the last."""
    xs = sorted(points)
    if x <= xs[0] or len(xs) == 1:
        return points[xs[0]]
    for a, b in zip(xs, xs[1:]):
        if x <= b:
            return points[a] + (points[b] - points[a]) * (x - a) / (b - a)
    a, b = xs[-2], xs[-1]
    return points[b] + (points[b] - points[a]) * (x - b) / (b - a)


def _blend(by_context: dict[int, float], context: float) -> float:
    """Linear in the context length between measured contexts, clamped outside them."""
    cs = sorted(by_context)
    context = min(max(context, cs[0]), cs[-1])
    return _interp(by_context, context)


@dataclass
class Calibration:
    model: str
    dtype: str
    device: str
    threads: int
    fingerprint: dict                    # Fingerprint.to_dict()
    step_ms: float                       # median 1-token decode step (verify of a root only) at the middle context
    contexts: list[int]                  # cache lengths measured
    chain: dict[int, dict[int, float]]   # context -> {n: cost of one forward scoring n tokens, in decode steps}
    tree: dict[int, dict[int, float]]    # same, with the Medusa-like tree mask
    prefill_tok_per_s: float
    drafting_ms: dict[str, float] = field(default_factory=dict)   # method label -> ms per step (filled by speed)
    seconds: float = 0.0                 # how long the measurement took
    measured_at: str = ""
    step_ms_by_context: dict[int, float] = field(default_factory=dict)   # the 1-token step at each context
    load_average: list[float] | None = None   # when measured: a busy machine's curve says so
    linear: str = "torch"                # the linear-layer kernel measured (hardware/kernels.py)
    # rows -> decode steps of the output projection (and argmax) over that many rows: a wide tree's greedy verify
    # projects only its inner nodes (engine.loop.LazyArgmax), so its cost is the full tree's less the rows skipped
    head: dict[int, float] = field(default_factory=dict)
    version: int = VERSION               # what an older file says it is: read back from its "version" key
    others_cores: float | None = None    # cores other processes kept busy meanwhile (hardware/contention.py)

    @property
    def busy(self) -> bool:
        """Measured beside other work: its step is slower and its curve flatter than this machine's."""
        return contention.is_busy(self.others_cores)

    @property
    def middle(self) -> int:
        return sorted(self.contexts)[len(self.contexts) // 2]

    def cost(self, n: int, tree: bool = False, context: int | None = None, rows: int | None = None) -> float:
        """Decode steps for one forward over n scored tokens (n = 1 is exactly 1.0), from the monotone fit of each
        context's samples. A tree shape below the smallest measured tree interpolates from the 1-token step (a root
        alone is a chain). `rows` < n: only that many rows were projected onto the vocabulary (a lazily projected
        tree), which saves the projection of the others where the calibration measured the projection's cost."""
        context = self.middle if context is None else context
        per_context = {}
        for c in self.contexts:
            points = dict(self.tree[c]) if tree else dict(self.chain[c])
            points.setdefault(1, 1.0)
            per_context[c] = _interp(monotone(points), n)
        full = _blend(per_context, context)
        if rows is None or rows >= n or not self.head:
            return full
        head = monotone(dict(self.head), floor=0.0)     # a fraction of a step
        return max(full - _interp(head, n) + _interp(head, max(rows, 1)), 1.0)

    def unfitted(self, n: int) -> float:
        """c(n) of a chain as measured, averaged over the contexts: a padded decode step's cost (methods/ar.py). The
        monotone fit reads a dip below one step as noise; a kernel faster over a few rows than over one makes one
        (AMD EPYC, AVX512-BF16, oneDNN bfloat16: 4 rows 0.88 at context 1024, 0.94 at 512, 1.02 at 128)."""
        return sum(_interp({1: 1.0, **self.chain[c]}, n) for c in self.contexts) / len(self.contexts)

    def step_ms_at(self, context: int | None = None) -> float:
        if context is None or not self.step_ms_by_context:
            return self.step_ms
        return _blend(self.step_ms_by_context, context)

    def seconds_for(self, n: int, tree: bool = False, context: int | None = None, rows: int | None = None
                    ) -> float:
        """Predicted wall-clock seconds of one verify forward over n tokens."""
        return self.step_ms_at(context) / 1000 * self.cost(n, tree, context, rows)

    def break_even(self, n: int, draft_ms: float = 0.0, tree: bool = False) -> float:
        """The block efficiency (tokens per step) at which verifying n tokens plus drafting `draft_ms` per step
        matches autoregressive decoding (1 token per decode step)."""
        return self.cost(n, tree) + draft_ms / self.step_ms

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("chain", "tree"):
            d[name] = {str(c): {str(n): v for n, v in row.items()} for c, row in d[name].items()}
        d["step_ms_by_context"] = {str(c): v for c, v in self.step_ms_by_context.items()}
        d["head"] = {str(r): v for r, v in self.head.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        d = dict(d)
        for name in ("chain", "tree"):
            d[name] = {int(c): {int(n): float(v) for n, v in row.items()} for c, row in d[name].items()}
        d["step_ms_by_context"] = {int(c): float(v) for c, v in d.get("step_ms_by_context", {}).items()}
        d["contexts"] = [int(c) for c in d["contexts"]]
        d["head"] = {int(r): float(v) for r, v in d.get("head", {}).items()}
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


def measure(model, model_name: str, dtype: str, device: str, threads: int,
            ns=NS, contexts=CONTEXTS, tree_ns=TREE_NS, repeats: int = REPEATS, long_repeats: int = LONG_ROUNDS_MIN,
            log: Log = print) -> Calibration:
    """Time the engine's verify over chains and trees on top of a random context, per context length.

    One prefill of the largest context (timed: the prefill throughput), then contexts from the largest down, the
    cache cropped to each (a causal cache's first c entries are the c-token cache). Each round times every shape
    once in a fixed order (drift hits all alike), the 1-token step three times, shapes over 16 tokens in the first
    `long_repeats` rounds only; after each forward the cache is cropped back. Shapes are warmed up once, at the first context. A
    cost is the median of its samples each divided by its own round's 1-token step (forward_timing.costs). 0.5B
    float32 on 2 AVX2 cores: about a minute on an idle machine."""
    import torch
    from ..engine.cache import new_cache

    from .timing import timed

    t_start = time.perf_counter()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    contexts = sorted({int(c) for c in contexts}, reverse=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (contexts[0] + 1,), generator=g).tolist()
    shapes = _shapes(model.config.vocab_size, ns, tree_ns, g)
    chain: dict[int, dict[int, float]] = {}
    tree: dict[int, dict[int, float]] = {}
    steps: dict[int, float] = {}
    meter = contention.Meter()
    try:
        with torch.inference_mode(), meter:
            cache = new_cache(model.device, contexts[0] + 1024)    # the kind decoding uses there
            x = torch.tensor([ids[:-1]], device=model.device)
            secs, out = timed(lambda: model.model(input_ids=x, past_key_values=cache, use_cache=True), device)
            prefill, hidden = contexts[0] / secs, out.last_hidden_state[0, -1]
            for i, ctx in enumerate(contexts):
                crop_to(cache, ctx)
                rounds = _time_shapes(model, cache, hidden, ids[: ctx + 1], shapes, repeats, i == 0, device,
                                      long_repeats=long_repeats)
                step, cost = _costs(rounds)
                steps[ctx] = step * 1000
                chain[ctx] = {n: c for (k, n), c in cost.items() if k == "chain"}
                tree[ctx] = {n: c for (k, n), c in cost.items() if k == "tree"}
                log(f"  context {ctx}: step {step * 1000:.1f} ms; chain " +
                    ", ".join(f"{n}: {chain[ctx][n]:.2f}" for n in (8, 16, 64) if n in chain[ctx]) + " steps")
            head = head_costs(model, out.last_hidden_state[0, -max(HEAD_ROWS):], device)
    finally:
        torch.set_num_threads(old_threads)
    contexts = sorted(contexts)
    step_ms = steps[contexts[len(contexts) // 2]]
    fp = json.loads(json.dumps(current(threads, device).to_dict()))      # tuples as lists, as read back
    return Calibration(model=model_name, dtype=dtype, device=device, threads=threads, fingerprint=fp,
                       step_ms=step_ms, contexts=contexts,
                       chain={c: chain[c] for c in contexts}, tree={c: tree[c] for c in contexts},
                       prefill_tok_per_s=prefill, seconds=time.perf_counter() - t_start,
                       measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       step_ms_by_context={c: steps[c] for c in contexts}, load_average=_load_average(),
                       linear=kernels.backend_of(model),
                       head={r: secs * 1000 / step_ms for r, secs in head.items()},
                       others_cores=None if meter.others_cores != meter.others_cores else meter.others_cores)


def _load_average() -> list[float] | None:
    import os
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _device_tag(device: str) -> str:
    """One spelling per device, so `cuda`, `cuda:0` and a model's `cuda:0` share a cache file."""
    from .fingerprint import resolve_device
    device = resolve_device(str(device))
    return "cuda:0" if device == "cuda" else device


def cache_path(model_name: str, dtype: str, device: str, threads: int | None, linear: str | None = None) -> Path:
    """<cache>/calibration/<fingerprint key>/<model>-<dtype>-<device>[-kernel]-v<VERSION>.json; the key
    holds the threads, the CPU flags and the library versions, so a changed machine or torch never reads a stale
    curve. The version in the name: a checkout of an older recipe (a long benchmark pinned to its commit) keeps
    reading and updating its own curve while a newer one measures another beside it."""
    from .dtype import resolve
    device = _device_tag(device)
    dtype = resolve(dtype, device, threads, log=lambda _: None)
    fp = current(threads, device)
    safe = str(model_name).strip("/").replace("/", "_")
    kernel = kernels.tag(linear or kernels.choose(dtype, device, threads).backend)
    name = f"{safe}-{dtype}-{device.replace(':', '')}{kernel}-v{VERSION}.json"
    return paths.machine_file("calibration", fp.key(), name)


def cached(model_name: str, dtype: str, device: str, threads: int | None) -> Calibration | None:
    """The stored calibration for this machine, or None (missing, unreadable, or older than VERSION: a curve from
    before the projection's cost was measured in interleaved rounds mispredicts lazily projected trees)."""
    path = cache_path(model_name, dtype, device, threads)
    if seal.problem(path):             # changed since it was measured: a valid JSON can still hold other numbers
        return None
    try:
        cal = Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return cal if cal.head and cal.version >= VERSION else None


def meta(model_name: str, dtype: str, device: str, threads: int | None) -> dict | None:
    """What a result's config.json records: the cached calibration its costs read against, or None. Never
    measures (a result must not wait a minute for it)."""
    cal = cached(model_name, dtype, device, threads)
    if cal is None:
        return None
    return {"file": str(cache_path(model_name, dtype, device, threads)), "key": cal.fingerprint.get("key"),
            "step_ms": cal.step_ms, "cost16": cal.cost(16), "measured_at": cal.measured_at,
            "others_cores": cal.others_cores}


def save(cal: Calibration, path: Path | None = None) -> Path:
    """Atomic write (tmp + replace): a killed run never leaves half a JSON where the next one reads. The cached copy
    is sealed (store/seal.py), so one changed since it was measured is measured again; a copy elsewhere (the
    results' `calibrate --show`) is a plain file."""
    text = json.dumps(cal.to_dict(), indent=2)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        return path
    path = cache_path(cal.model, cal.dtype, cal.device, cal.threads, cal.linear)
    with seal.building(path) as tmp:
        tmp.write_text(text)
    return path


def record_drafting(cal: Calibration, label: str, ms: float) -> Path:
    """Store a method's measured drafting time per step and rewrite the cached calibration."""
    cal.drafting_ms[label] = float(ms)
    return save(cal)


def estimate_seconds(model, device: str, threads: int, ns, contexts, tree_ns, repeats: int,
                     long_repeats: int = LONG_ROUNDS_MIN) -> float:
    """A rough duration for `measure`, said before it starts: a 1-token and a 16-token forward timed, a forward
    over n tokens taken as linear between them, summed over the forwards the plan runs."""
    import torch

    from .timing import timed
    from .forward_timing import LONG_N
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            t = {}
            for n in (1, 16, 1, 16):
                t[n], _ = timed(lambda: model(input_ids=torch.zeros(1, n, dtype=torch.long, device=model.device)),
                                device)
    finally:
        torch.set_num_threads(old)
    per_token = max(t[16] - t[1], 0.0) / 15

    def secs(n: int) -> float:
        return t[1] + per_token * (n - 1)
    shapes = list(ns) + list(tree_ns)
    rounds = {n: repeats if n <= LONG_N else min(long_repeats, repeats) for n in shapes}
    per_context = sum(secs(n) * rounds[n] for n in shapes) + 2 * repeats * secs(1)
    return secs(max(contexts)) + sum(secs(n) for n in shapes) + len(contexts) * per_context


def results_dir(cal: Calibration) -> Path:
    """Where `calibrate --show` writes the figure and a copy of the JSON: <results>/calibration/<fingerprint key>/."""
    return paths.results_root() / "calibration" / cal.fingerprint["key"]


def ensure(model_name: str, dtype: str, device: str, threads: int | None, model=None, log: Log = print,
           force: bool = False, loader: Callable[[str, str], object] | None = None) -> Calibration:
    """The cached calibration, or (missing, or `force`) measured now, said before it starts with its expected
    duration, and cached. Without a `model`, `loader(dtype, device)` loads it, only when it must be measured (the
    hardware layer sits below the model registry, so the caller says how)."""
    import torch

    from .dtype import resolve
    device = _device_tag(device)
    dtype = resolve(dtype, device, threads, log)
    threads = threads or torch.get_num_threads()
    cal = None if force else cached(model_name, dtype, device, threads)
    if cal is not None and (not cal.busy or (model is None and loader is None)):
        return cal             # a busy curve with nothing to measure it again with: kept (`--show` says it was busy)
    if cal is None and not force and (path := cache_path(model_name, dtype, device, threads)).exists():
        log(f"warning: the cached calibration {path} is unreadable, damaged or from an older version: measuring "
            f"it again")
    if cal is not None:
        log(f"the cached calibration was measured while {contention.describe(cal.others_cores)}: measuring again")
    if model is None:
        if loader is None:
            raise ValueError(f"no calibration of {model_name} {dtype} is cached here and no model was given to "
                             f"measure it with")
        model = loader(dtype, device)
    plan = {"ns": NS, "contexts": CONTEXTS, "tree_ns": TREE_NS, "repeats": REPEATS}
    at_default = estimate_seconds(model, device, threads, **plan)
    repeats, long_repeats = plan_repeats(at_default)
    plan["repeats"] = repeats
    about = at_default * repeats / REPEATS          # the long shapes' rounds grow in proportion (repeats // 3)
    log(f"calibrating {model_name} {dtype} on {current(threads, device).describe()} (about {about:.0f} s, once "
        f"per machine)")
    cal = measure(model, model_name, dtype, device, threads, log=log, long_repeats=long_repeats, **plan)
    path = save(cal)
    log(f"calibrated in {cal.seconds:.0f} s: one step {cal.step_ms:.1f} ms, 16 tokens {cal.cost(16):.2f} steps; "
        f"{path}")
    if cal.busy:
        log(f"WARNING: while calibrating, {contention.describe(cal.others_cores)}; this curve is kept for now and "
            f"measured again on its next use (or `bpdbench calibrate --force` on an idle machine)")
    return cal
