"""Weight-only quantized linear layers (int8 per channel, int4 per group) on torch's CPU kernels.

Why these kernels: decoding a 0.5B model on a CPU is bound by reading its weights, so a copy of the target whose
linear layers read 2x (int8) or 4x (int4) fewer bytes drafts for a fraction of a step. torch ships the kernels
(`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`); they are fast with bfloat16 activations and slow with float32
ones (measured on an AVX2-only AMD EPYC, 2 threads, all linear layers of one 0.5B decode step at one row: float32
dense 191 ms, bfloat16 dense 83 ms, int8 69 ms, int4 group 64 47 ms; with float32 activations int8 404 ms, int4
622 ms), so a quantized copy always runs in bfloat16, whatever the target's dtype.

Int4 is asymmetric per group of `group` input columns, in the layout the kernel takes: value = (q - 8) * scale + zero
with q in 0..15, scale = (max - min) / 15 and zero = min + 8 * scale (so q = 0 gives the group's minimum). An input width
that the group does not divide takes the largest power-of-two fraction of it that does; a layer whose shapes the int4
kernel does not take keeps the same rounding as a dense bfloat16 matrix (`kernel: dense`), so tiny test models
quantize exactly like real ones, only slower.
"""
from __future__ import annotations

import torch

ACT = torch.bfloat16
BITS = (4, 8)
# From this many rows (a prompt's prefill) a layer multiplies in float32 by its rounded weight, dequantized once and
# kept: the weight-only kernels are matrix-vector kernels, and where bfloat16 is emulated (AVX2) each extra row
# costs about 0.15 ms for a 4864 x 896 layer (int8, all layers of a 0.5B step: 69 ms at 1 row, 175 ms at 8), so a
# 500-token prompt took the draft ~7 s against the float32 target's prefill of well under one. The price is memory:
# a float32 copy of the rounded weights (2 GB for the 0.5B model) beside the packed ones. Same rounding, so the
# draft is the same model either way (up to float32 vs bfloat16 accumulation).
DENSE_ROWS = 64


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], scales [N]) with w ~= q * scale per output row (symmetric)."""
    w = w.detach().float()
    scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


def int4_group(width: int, group: int) -> int:
    """The group an input width takes: the largest power-of-two share of the requested one that divides it."""
    group = min(group, width)
    while width % group:
        group //= 2
    return group


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q int32 [N, K] in 0..15, scale [N, K/group], zero [N, K/group]) with w ~= (q - 8) * scale + zero."""
    w = w.detach().float()
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
    return q.reshape(n, k), scale, lo + 8 * scale


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int) -> torch.Tensor:
    n, k = q.shape
    g = (q.reshape(n, k // group, group).float() - 8) * scale[..., None] + zero[..., None]
    return g.reshape(n, k)


def _pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Levels q [N, K] (0..15) and their per-group scale and zero [N, K/group] in the int4 kernel's layout."""
    return (torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1),
            torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(ACT))


class QuantLinear(torch.nn.Module):
    """A frozen nn.Linear replacement with int8 or int4 weights; takes and returns bfloat16 activations."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bits: int, group: int = 64,
                 in_scale: torch.Tensor | None = None, parts: tuple | None = None):
        """`in_scale` (nets/awq.py): the weight's input columns are multiplied by it before rounding and the inputs
        divided by it in `forward`, so the layer computes x W^T with its rounding error moved off the columns whose
        inputs are large. `parts`: int4 (q, scale, zero) of that weight rounded elsewhere (nets/gptq.py), at
        `int4_group(in_features, group)`, instead of each weight to its nearest level."""
        super().__init__()
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits}")
        self.out_features, self.in_features = weight.shape
        self.inv_scale = None if in_scale is None else (1.0 / in_scale.float()).to(ACT)
        if in_scale is not None:
            weight = weight.detach().float() * in_scale.float()
        self.bits, self.group = bits, group
        self.bias = None if bias is None else bias.detach().to(ACT).clone()
        self.kernel = "dense"
        self.dense: torch.Tensor | None = None     # the float32 rounded weight, made at the first prefill
        if bits == 8:
            q, scale = quantize_int8(weight)
            self.q, self.scale = q, scale.to(ACT)
            self.kernel = "int8"
            return
        self.group = group = int4_group(self.in_features, group)
        q, scale, zero = parts if parts is not None else quantize_int4(weight, group)
        self.q4, self.scale4, self.zero4 = q.to(torch.uint8), scale, zero     # for DENSE_ROWS+ rows (prefill)
        try:
            self.q, self.scale_zero = _pack_int4(q, scale, zero)
            self.kernel = "int4"
            probe = torch.zeros(1, self.in_features, dtype=ACT)
            torch.ops.aten._weight_int4pack_mm_for_cpu(probe, self.q, self.group, self.scale_zero)
        except (RuntimeError, NotImplementedError):
            self.q, self.kernel = dequantize_int4(q, scale, zero, group).to(ACT), "dense"

    def dequantized(self) -> torch.Tensor:
        """The rounded weight as a float32 matrix (what every kernel multiplies by)."""
        if self.bits == 8:
            return self.q.float() * self.scale.float()[:, None]
        return dequantize_int4(self.q4, self.scale4, self.zero4, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        if self.inv_scale is not None:
            x = x * self.inv_scale.to(x.dtype)
        if x.numel() // shape[-1] >= DENSE_ROWS:     # a prompt's prefill: float32 GEMM on the rounded weight
            if self.dense is None:
                self.dense = self.dequantized()
            y = torch.nn.functional.linear(x.reshape(-1, shape[-1]).float(), self.dense)
            y = (y if self.bias is None else y + self.bias.float()).to(x.dtype)
            return y.reshape(*shape[:-1], self.out_features)
        x2 = x.reshape(-1, shape[-1]).to(ACT)
        if self.kernel == "int8":
            y = torch.ops.aten._weight_int8pack_mm(x2, self.q, self.scale)
        elif self.kernel == "int4":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.q, self.group, self.scale_zero)
        else:
            y = torch.nn.functional.linear(x2, self.q)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, " \
               f"group={self.group}, kernel={self.kernel}, in_scale={self.inv_scale is not None}"


def joined(layers: list[QuantLinear]) -> QuantLinear | None:
    """One QuantLinear computing `layers` side by side (q, k and v of one attention; gate and up of one MLP) from
    their very rounded weights: one kernel call where there were several. None where they cannot share one (other
    bits, groups, kernels, input widths or input scales)."""
    first = layers[0]
    same = all((l.bits, l.group, l.kernel, l.in_features) == (first.bits, first.group, first.kernel,
                                                               first.in_features) for l in layers)
    scales = [l.inv_scale for l in layers]
    if not same or not (all(s is None for s in scales) or
                        all(s is not None and torch.equal(s, scales[0]) for s in scales)):
        return None
    out = QuantLinear.__new__(QuantLinear)
    torch.nn.Module.__init__(out)
    out.in_features, out.out_features = first.in_features, sum(l.out_features for l in layers)
    out.inv_scale, out.bits, out.group, out.kernel, out.dense = first.inv_scale, first.bits, first.group, \
        first.kernel, None
    out.bias = None if all(l.bias is None for l in layers) else torch.cat(
        [l.bias if l.bias is not None else torch.zeros(l.out_features, dtype=ACT) for l in layers])
    cat = lambda name: torch.cat([getattr(l, name) for l in layers])    # noqa: E731
    if first.bits == 8:
        out.q, out.scale = cat("q"), cat("scale")
        return out
    out.q4, out.scale4, out.zero4 = cat("q4"), cat("scale4"), cat("zero4")
    if first.kernel == "int4":
        out.q, out.scale_zero = _pack_int4(out.q4, out.scale4, out.zero4)
    else:
        out.q = cat("q")
    return out


def quantized_copy(model: torch.nn.Module, bits: int, group: int, is_linear,
                   scales: dict[str, torch.Tensor] | None = None, parts: dict[str, tuple] | None = None
                   ) -> torch.nn.Module:
    """A bfloat16 copy of `model` whose linear layers (`is_linear(module)`) are QuantLinear, each with its input
    scale from `scales` and its int4 rounding from `parts` by module name where given (nets/awq.py, nets/gptq.py);
    the target's own linear modules are never copied (deepcopy's memo maps them to placeholders), so the peak memory
    is the target plus the quantized copy."""
    import copy
    linears = {name: m for name, m in model.named_modules() if is_linear(m)}
    memo = {id(m): torch.nn.Identity() for m in linears.values()}
    draft = copy.deepcopy(model, memo)
    for name, m in linears.items():
        draft.set_submodule(name, QuantLinear(m.weight, getattr(m, "bias", None), bits, group,
                                              (scales or {}).get(name), (parts or {}).get(name)))
    for p in draft.parameters():
        p.data = p.data.to(ACT)
    return draft.eval().requires_grad_(False)


def kernels(model: torch.nn.Module) -> dict[str, int]:
    """How many QuantLinear layers run on each kernel (a shape the int4 kernel refused runs dense)."""
    out: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, QuantLinear):
            out[m.kernel] = out.get(m.kernel, 0) + 1
    return out


def bench(threads: int = 2, repeats: int = 7) -> dict[str, float]:
    """Milliseconds for all linear layers of one Qwen2.5-0.5B decode step at one row (24 layers of q, k, v, o, gate,
    up, down, and the output projection; random weights of the real shapes), per kernel and activation dtype:
    the measurement the self-drafts were designed from (`python -m bpdbench.nets.quant`); and the int4 output
    projection alone over the full and two smaller vocabularies (a draft's head is a fifth of its weight bytes)."""
    import time
    torch.set_num_threads(threads)
    d, ff, kv, vocab, layers = 896, 4864, 128, 151936, 24
    shapes = [(d, d), (d, kv), (d, kv), (d, d), (d, ff), (d, ff), (ff, d)] * layers + [(d, vocab)]

    def median(f) -> float:
        f()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return 1000 * sorted(ts)[repeats // 2]

    fused = [(d, d + 2 * kv), (d, d), (d, 2 * ff), (ff, d)] * layers + [(d, vocab)]    # nets/lean.py's matmuls
    out = {}
    weights = [torch.randn(o, i) * 0.02 for i, o in shapes]
    for dtype in (torch.float32, ACT):
        xs = {i: torch.randn(1, i, dtype=dtype) for i in (d, ff)}
        ws = [w.to(dtype) for w in weights]
        out[f"dense {dtype}"] = median(lambda: [torch.nn.functional.linear(xs[i], w) for (i, _), w in zip(shapes, ws)])
        del ws
        for bits, group in ((8, 0), (4, 64), (4, 32)):
            qs = [QuantLinear(w, None, bits, group or 64) for w in weights]
            if dtype == torch.float32:       # the kernels on float32 activations (what the draft avoids)
                for q in qs:
                    if bits == 8:
                        q.scale = q.scale.float()
                    else:
                        q.scale_zero = q.scale_zero.float()
                act = lambda q, x: (torch.ops.aten._weight_int8pack_mm(x, q.q, q.scale) if bits == 8 else
                                    torch.ops.aten._weight_int4pack_mm_for_cpu(x, q.q, q.group, q.scale_zero))
                out[f"int{bits}{f' g{group}' if group else ''} {dtype}"] = median(
                    lambda: [act(q, xs[i]) for (i, _), q in zip(shapes, qs)])
            else:
                out[f"int{bits}{f' g{group}' if group else ''} {dtype}"] = median(
                    lambda: [q(xs[i]) for (i, _), q in zip(shapes, qs)])
            del qs
    xs = {i: torch.randn(1, i, dtype=ACT) for i in (d, ff)}
    for bits, group in ((8, 64), (4, 32)):       # q/k/v and gate/up each one matmul (nets/lean.py)
        qs = [QuantLinear(torch.randn(o, i) * 0.02, None, bits, group) for i, o in fused]
        out[f"int{bits}{' g32' if bits == 4 else ''} fused {ACT}"] = median(
            lambda: [q(xs[i]) for (i, _), q in zip(fused, qs)])
        del qs
    for rows in (vocab, 65536, 32768):          # the output projection alone: what a smaller draft vocabulary saves
        q = QuantLinear(torch.randn(rows, d) * 0.02, None, 4, 32)
        out[f"int4 g32 head {rows} {ACT}"] = median(lambda: q(xs[d]))
    return out


if __name__ == "__main__":
    import platform
    import re
    info = open("/proc/cpuinfo").read() if platform.system() == "Linux" else ""
    name = re.search(r"model name\s*:\s*(.*)", info)
    flags = sorted(set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_bf16)\b", info)))
    print(f"{name.group(1) if name else platform.processor()} ({' '.join(flags)}), torch {torch.__version__}")
    for name, ms in bench().items():
        print(f"{name:28s} {ms:7.1f} ms")
