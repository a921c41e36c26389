"""Which kernel the base model's linear layers run on this machine: torch's default, or oneDNN with packed weights.

Why: on CPUs without AVX-512, torch's float32 `linear` over 2..64 rows (what a verify forward multiplies) goes to a
general GEMM that is several times slower per row than its 1-row path, and the vocabulary projection (896 x 151,936
for the 0.5B model) is the worst of it. oneDNN's linear with the weight reordered once into its blocked layout
("packed", as torch's own compiler does for CPU inference) costs half as much there, for every size from 1 to 64
rows. So the same model verifies 16 tokens for fewer decode steps, which decides whether drafting can pay at all.

Why packed for 64 rows: with that layout hint each output row is computed the same way whatever the number of rows,
so a verify forward's rows equal the 1-token decode step's bit for bit in the linear layers (greedy verification
compares exactly those). Measured, not assumed: `choose` times both kernels on the model's shapes once per machine
fingerprint and dtype, keeps oneDNN only where it is clearly faster and numerically equal, and caches the choice
(written when a model loads, as the dtype choice is). `BPDBENCH_LINEAR=torch|onednn|auto` overrides it. Every result
records the kernel (`environment.linear`), and the calibration and greedy-reference caches are keyed by it.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

import torch

from .. import paths
from .fingerprint import Fingerprint, current

ENV = "BPDBENCH_LINEAR"
BACKENDS = ("torch", "onednn")
PACK_ROWS = 64                       # the layout hint: batch-invariant rows, fast from 1 to 64 rows
PROBE = ((896, 4864, 16), (896, 4864, 1), (896, 32768, 16), (896, 32768, 1))   # (in, out, rows): MLP and vocab
GAIN = 0.9                           # oneDNN must take < 90% of torch's time over the probe


@dataclass(frozen=True)
class LinearChoice:
    backend: str
    reason: str
    onednn_over_torch: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class PackedLinear(torch.nn.Module):
    """An nn.Linear whose inference forward runs oneDNN on a packed copy of the weight.

    `weight` and `bias` stay the original parameters, so code that reads them (tied embeddings, drafters initialised
    from the base, `model.dtype`) sees what it saw before; a forward that needs gradients (a drafter trained through
    the frozen vocabulary projection) falls back to torch's linear, which oneDNN's inference op does not provide."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_ROWS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return torch.nn.functional.linear(x, self.weight, self.bias)
        shape = x.shape
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), self.packed, self.bias, "none", [], "")
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel=onednn-packed"


def probe(dtype: torch.dtype = torch.float32, repeats: int = 9) -> tuple[float, float]:
    """(oneDNN time / torch time summed over the probe shapes, largest absolute difference of the outputs)."""
    def median(f) -> float:
        f()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2]

    torch_s = onednn_s = diff = 0.0
    gen = torch.Generator().manual_seed(0)
    for d_in, d_out, rows in PROBE:
        lin = torch.nn.Linear(d_in, d_out).to(dtype).requires_grad_(False)
        x = torch.randn(rows, d_in, generator=gen).to(dtype)
        fast = PackedLinear(lin)
        with torch.inference_mode():
            torch_s += median(lambda: lin(x))
            onednn_s += median(lambda: fast(x))
            diff = max(diff, float((lin(x) - fast(x)).abs().max()))
    return onednn_s / torch_s, diff


def decide(fp: Fingerprint, dtype: str, measured: tuple[float, float] | None) -> LinearChoice:
    if fp.gpu:
        return LinearChoice("torch", "a CUDA device: torch's kernels")
    if measured is None:
        return LinearChoice("torch", "oneDNN's packed linear is not available in this torch build")
    ratio, diff = measured
    tol = 1e-3 if dtype == "float32" else 5e-2
    if diff > tol:
        return LinearChoice("torch", f"oneDNN differs from torch by {diff:.1e} on the probe", round(ratio, 3))
    if ratio < GAIN:
        return LinearChoice("onednn", f"packed oneDNN linear takes {ratio:.2f}x torch's time over 1-16 rows",
                            round(ratio, 3))
    return LinearChoice("torch", f"packed oneDNN linear is not faster here ({ratio:.2f}x torch's time)",
                        round(ratio, 3))


def _cache_file(fp: Fingerprint, dtype: str):
    return paths.machine_file("calibration", fp.key(), f"linear-{dtype}.json")


_PENDING: dict = {}


def choose(dtype: str, device: str = "cpu", threads: int | None = None) -> LinearChoice:
    """The kernel for `dtype` on this machine: the override, else the cached probe, else a probe now."""
    forced = os.environ.get(ENV, "auto").strip().lower()
    if forced not in BACKENDS + ("auto",):
        raise ValueError(f"{ENV}={forced!r}: use one of torch, onednn, auto")
    if forced != "auto":
        return LinearChoice(forced, f"{ENV}={forced}")
    fp = current(threads, device)
    if fp.gpu or not str(device).startswith("cpu"):
        return decide(fp, dtype, None) if fp.gpu else LinearChoice("torch", f"device {device}")
    path = _cache_file(fp, dtype)
    if path in _PENDING:
        return _PENDING[path]
    try:
        return LinearChoice(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    try:
        measured = probe(getattr(torch, dtype))
    except (RuntimeError, AttributeError):
        measured = None
    _PENDING[path] = decide(fp, dtype, measured)
    return _PENDING[path]


def persist() -> None:
    """Write the probed choices (called once a model loads), so every later process keeps the same kernel."""
    while _PENDING:
        path, choice = _PENDING.popitem()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(choice.to_dict(), indent=2))
        tmp.replace(path)


def apply(model: torch.nn.Module, backend: str) -> torch.nn.Module:
    """Swap every nn.Linear of `model` for a PackedLinear when `backend` is onednn; mark the model either way."""
    if backend == "onednn":
        for module in list(model.modules()):
            for name, child in list(module.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(module, name, PackedLinear(child))
    model.bpdbench_linear = backend
    return model


def backend_of(model) -> str:
    """The kernel a loaded model runs (`torch` for models not loaded through bpdbench)."""
    return getattr(model, "bpdbench_linear", "torch")


def tag(backend: str) -> str:
    """The suffix cache files carry for a non-default kernel (empty for torch: older caches stay valid)."""
    return "" if backend == "torch" else f"-{backend}"
