"""Activation-aware scales for the int4 copy (AWQ: Lin et al., MLSys 2024), so the 4 bits go where the inputs are.

Why: with min/max scales per group of 32 the int4 copy of the 0.5B target agrees with it on 0.836 of the tune
split's positions (AMX Xeon, bfloat16), and that agreement caps what the draft is worth: a chain's tokens per step
are at most 1 / (1 - a). A few input channels carry much larger activations than the rest, and the rounding error of
their weights is multiplied by them. AWQ scales those columns up before rounding and the inputs down by the same
factor at run time, so the product is unchanged and those weights are rounded more finely. Per linear layer it picks
s = mean|x|^alpha, alpha on a grid from 0 (plain min/max: never worse on the calibration rows) to 1, by the error of
the layer's output on calibration rows. The inputs are divided by s in the layer itself (nets/quant.QuantLinear's
`in_scale`), not folded into the norm before it, so every layer keeps its own s and any model works.

The calibration rows come from the train split (methods/qdraft.py records which examples), never from the tune
split that measures the draft's agreement or the eval split that runs are timed on.
"""
from __future__ import annotations

from typing import Callable

import torch

ALPHAS = tuple(i / 10 for i in range(11))
ROWS = 256                      # calibration rows per layer (a seeded sample of all the prompts' positions)


@torch.inference_mode()
def layer_inputs(model: torch.nn.Module, prompts: list[list[int]], is_linear: Callable[[torch.nn.Module], bool],
                 rows: int = ROWS, seed: int = 0) -> dict[str, torch.Tensor]:
    """Each linear layer's input rows (float32 [rows, in_features]) over teacher-forced `prompts`."""
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, m in model.named_modules():
        if is_linear(m):
            def keep(mod, args, name=name):
                seen.setdefault(name, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).float())
            hooks.append(m.register_forward_pre_hook(keep))
    try:
        for ids in prompts:
            model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, parts in seen.items():
        x = torch.cat(parts)
        out[name] = x[torch.randperm(x.shape[0], generator=gen)[:rows]] if x.shape[0] > rows else x
    return out


def search(weight: torch.Tensor, x: torch.Tensor, group: int, quantize, dequantize) -> tuple[torch.Tensor, dict]:
    """The per-input-column scale s (float32 [in_features]) whose rounding of W diag(s), applied to x diag(s)^-1,
    is nearest x W^T on the rows `x`; and a record: the alpha chosen, the relative output error at alpha = 0 (min/max)
    and at the choice. `quantize(w, group) -> parts`, `dequantize(*parts, group) -> w` are the int4 rounding."""
    w = weight.detach().float()
    ref = x @ w.T
    norm = ref.pow(2).mean().clamp(min=1e-20)
    mag = x.abs().mean(0).clamp(min=1e-6)
    best: tuple[float, float, torch.Tensor] | None = None
    plain = 0.0
    for alpha in ALPHAS:
        s = mag.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()             # centred in log space: the scaled weights stay in range
        rounded = dequantize(*quantize(w * s, group), group) / s
        err = float(((x @ rounded.T - ref).pow(2).mean() / norm))
        if alpha == 0:
            plain = err
        if best is None or err < best[1]:
            best = (alpha, err, s)
    alpha, err, s = best
    return s, {"alpha": alpha, "error_minmax": plain, "error": err}
