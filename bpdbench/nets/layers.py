"""The pieces draft models are built from: RMSNorm, rotary positions, and one small decoder layer whose attention
takes explicit key/value blocks, so the same weights serve training (causal over a window, or over earlier passes'
keys), a KV cache of the base's features, and tree drafting (each node sees the cache and its own ancestors).

Our own layer rather than transformers' Qwen2DecoderLayer: drafting needs attention over [cache | ancestors | self]
with a different ancestor set per tree node, batched per depth, which is three small matmuls here and a 4D mask and
cache juggling there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float = 1e6) -> torch.Tensor:
    """Rotary embedding of x [..., n, heads, hd] at absolute positions pos [..., n] (the base's positions, so a
    row's angle is the same in training windows, the drafting cache and tree nodes)."""
    hd = x.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    ang = pos.to(torch.float32)[..., None] * inv                      # [..., n, hd/2]
    cos, sin = ang.cos()[..., None, :].to(x.dtype), ang.sin()[..., None, :].to(x.dtype)   # broadcast over heads
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class DecoderLayer(nn.Module):
    """Pre-norm attention (grouped key/value heads) + SwiGLU MLP, as one Qwen2/Llama layer, with a smaller MLP."""

    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int, dropout: float = 0.0):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, heads * self.hd)
        self.k = nn.Linear(d, kv_heads * self.hd)
        self.v = nn.Linear(d, kv_heads * self.hd)
        self.o = nn.Linear(heads * self.hd, d, bias=False)
        self.gate = nn.Linear(d, ffn, bias=False)
        self.up = nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)
        self.drop = nn.Dropout(dropout)

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        """x [..., n, d] -> q [..., n, H, hd], k/v [..., n, Hkv, hd] (rotated)."""
        h = self.norm1(x)
        shp = x.shape[:-1]
        q = rope(self.q(h).view(*shp, self.heads, self.hd), pos)
        k = rope(self.k(h).view(*shp, self.kv_heads, self.hd), pos)
        return q, k, self.v(h).view(*shp, self.kv_heads, self.hd)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + output projection of the attention result [..., n, H, hd], then the MLP."""
        x = x + self.drop(self.o(attn.flatten(-2)))
        h = self.norm2(x)
        return x + self.drop(self.down(F.silu(self.gate(h)) * self.up(h)))

    def attend(self, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
               masks: list[torch.Tensor | None]) -> torch.Tensor:
        """q [B, n, H, hd] over key blocks [B, m_i, Hkv, hd] each with a mask broadcastable to [B, n, m_i] (True:
        may attend; None: all) -> [B, n, H, hd]. One softmax across the blocks (one fused attention call)."""
        b, n = q.shape[:2]
        full = [torch.ones(1, 1, k.shape[1], dtype=torch.bool, device=q.device) if m is None else m
                for k, m in zip(keys, masks)]
        mask = torch.cat([m.expand(b, n, k.shape[1]) for m, k in zip(full, keys)], -1)[:, None]
        k = torch.cat(keys, 1).to(q.dtype).transpose(1, 2)
        v = torch.cat(values, 1).to(q.dtype).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask,
                                             enable_gqa=self.heads != self.kv_heads)
        return out.transpose(1, 2)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Plain self-attention over x [B, n, d] with mask [B, n, n] (training windows)."""
        q, k, v = self.qkv(x, pos)
        return self.finish(x, self.attend(q, [k], [v], [mask]))


def causal_mask(valid: torch.Tensor) -> torch.Tensor:
    """[B, n] bool (real rows) -> [B, n, n]: row i attends to real rows j <= i (itself always, so no empty row)."""
    n = valid.shape[1]
    tri = torch.ones(n, n, dtype=torch.bool, device=valid.device).tril()
    return (tri[None] & valid[:, None, :]) | torch.eye(n, dtype=torch.bool, device=valid.device)[None]


class ResBlock(nn.Module):
    """Medusa/Hydra's block `x + SiLU(W x + b)`; with in_dim != d, Hydra's first block: `P x + SiLU(W x + b)` (P a
    linear residual projection from the concatenated inputs)."""

    def __init__(self, d: int, in_dim: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.linear = nn.Linear(in_dim or d, d)
        self.res = nn.Linear(in_dim, d, bias=False) if in_dim and in_dim != d else None
        self.drop = nn.Dropout(dropout)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = x if self.res is None else self.res(x)
        return base + self.drop(F.silu(self.linear(x)))
