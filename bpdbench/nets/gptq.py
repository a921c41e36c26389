"""GPTQ rounding for the int4 copy (Frantar et al., ICLR 2023): each weight column rounded in turn, the error it
leaves spread over the columns not yet rounded, weighted by the inputs' second moments.

Why: rounding every weight to its nearest level (min/max, or AWQ's scaled min/max) minimises each weight's error,
not the layer's output error. Inputs are correlated, so the error of one column can be cancelled by nudging the
columns that share its inputs. GPTQ does that with the inverse of H = X^T X over calibration rows, at about the cost
of one Cholesky factorisation per layer. Here the rows are the full-precision model's own inputs to each layer (as
nets/awq.py collects them; GPTQ proper feeds each layer the already rounded layers' outputs), from the train split.
The levels are nets/quant.py's (asymmetric, per group, value = (q - 8) * scale + zero with q in 0..15), each
group's scale and zero taken from its columns as the rounding reaches them, so the kernel runs the result unchanged.
"""
from __future__ import annotations

import torch

BLOCK = 128             # columns updated together (the reference implementation's lazy batch)
DAMP = 0.01             # added to H's diagonal, as a share of its mean: H of few rows is singular


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2 X^T X / rows (float32 [in, in]) of a layer's input rows."""
    x = x.float()
    return 2.0 * (x.T @ x) / max(x.shape[0], 1)


def _levels(cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) per row of one group's columns, as nets/quant.quantize_int4 sets them."""
    lo, hi = cols.amin(1), cols.amax(1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    return scale, lo + 8 * scale


@torch.no_grad()
def round_int4(weight: torch.Tensor, h: torch.Tensor, group: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q int32 [out, in] in 0..15, scale [out, in/group], zero [out, in/group]) for `weight` [out, in], H [in, in]."""
    w = weight.detach().float().clone()
    out, width = w.shape
    h = h.float().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += DAMP * torch.diag(h).mean() * torch.eye(width)
    inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.zeros(out, width, dtype=torch.int32)
    scales = torch.zeros(out, width // group)
    zeros = torch.zeros(out, width // group)
    for i1 in range(0, width, BLOCK):
        i2 = min(i1 + BLOCK, width)
        block, errors, inv1 = w[:, i1:i2].clone(), torch.zeros(out, i2 - i1), inv[i1:i2, i1:i2]
        for j in range(i2 - i1):
            col = i1 + j
            if col % group == 0:
                cols = torch.cat([block[:, j:], w[:, i2:]], 1)[:, :group]     # this group's columns, as updated
                scale, zero = _levels(cols)
                scales[:, col // group], zeros[:, col // group] = scale, zero
            level = ((block[:, j] - zero) / scale).round().add(8).clamp(0, 15)
            q[:, col] = level.to(torch.int32)
            err = (block[:, j] - ((level - 8) * scale + zero)) / inv1[j, j]
            block[:, j:] -= err[:, None] * inv1[j, j:][None]
            errors[:, j] = err
        w[:, i2:] -= errors @ inv[i1:i2, i2:]
    return q, scales, zeros
