"""Hydra heads (Ankner et al. 2024, zankner/Hydra `mlp_head.py`), Hydra++'s prefix layer (`prefix_mlp_head.py`)
and KOALA's multi-layer variant of them (Zhang et al. 2024).

Head i (0-based) drafts the token i+1 places after the base's next token x_{t+1} from concat(h_t, E(x_{t+1}), E of
the i draft tokens before it): a first block mapping (i+2)·d -> d with a linear residual projection, `layers - 1`
further residual blocks (KOALA: layers > 1), then the base's frozen projection onto the shortlist. Drafting is
sequential, one head per depth, all tree nodes of a depth in one batched call, each conditioned on its own path.
Hydra++ (`prefix=True`) first runs one decoder layer over the base's hidden states of the decided positions (its own
KV cache, like EAGLE's) and feeds its output instead of h_t. Differences from the reference code: our heads share the
base's frozen projection (theirs each own one, initialised from it), and the further blocks of a head are separate
modules (theirs repeat one module).
"""
from __future__ import annotations

import torch
from torch import nn

from .base import DraftModel, new_rows
from .layers import DecoderLayer, ResBlock
from .registry import FitDefaults, NetworkSpec, attention_sizes, register


class Hydra(DraftModel):
    type_name = "hydra"

    def __init__(self, d: int, depth: int, layers: int = 1, prefix: bool = False, heads: int = 14, kv_heads: int = 2,
                 ffn: int = 2048, window: int = 256, dropout: float = 0.0):
        super().__init__(d, depth)
        self.layers, self.prefix_on, self.window, self.dropout = layers, prefix, window, dropout
        self.heads_cfg = (heads, kv_heads, ffn)
        self.blocks = nn.ModuleList(
            nn.Sequential(ResBlock(d, (i + 2) * d, dropout), *[ResBlock(d, dropout=dropout) for _ in range(layers - 1)])
            for i in range(depth))
        for i, blk in enumerate(self.blocks):       # start from h_t alone through the residual path (Medusa's start)
            with torch.no_grad():
                blk[0].res.weight.zero_()
                blk[0].res.weight[:, :d].copy_(torch.eye(d))
        self.prefix = DecoderLayer(d, heads, kv_heads, ffn, dropout) if prefix else None
        if self.prefix is not None:                 # the prefix layer starts as the identity: heads see h_t at first
            nn.init.zeros_(self.prefix.o.weight)
            nn.init.zeros_(self.prefix.down.weight)

    def dims(self) -> dict:
        heads, kv_heads, ffn = self.heads_cfg
        out = {"layers": self.layers, "prefix": self.prefix_on}
        return out | ({"heads": heads, "kv_heads": kv_heads, "ffn": ffn, "window": self.window} if self.prefix_on
                      else {})

    def head(self, i: int, base: torch.Tensor, embs: torch.Tensor) -> torch.Tensor:
        """Head i on base [..., d] and the embeddings of x_{t+1} and the i draft tokens before it [..., i+1, d]."""
        return self.blocks[i](torch.cat([base.to(embs.dtype), embs.flatten(-2)], -1))

    def teacher_states(self, hidden: torch.Tensor, embs: torch.Tensor) -> torch.Tensor:
        """Training (train/objectives.Positional): [n, D, d], head i on h_t and the true tokens' embeddings
        before its target (embs [n, D, d]: x_{t+1} and the D - 1 tokens after it)."""
        return torch.stack([self.head(i, hidden, embs[:, : i + 1]) for i in range(embs.shape[1])], 1)

    def session(self) -> "HydraSession":
        return HydraSession(self)


class HydraSession:
    """Per example: Hydra++'s prefix-layer cache over the decided positions (plain Hydra keeps nothing)."""

    def __init__(self, model: Hydra):
        self.m = model
        self.k = self.v = None
        self.rows = 0
        self.base: torch.Tensor | None = None

    def sync(self, ctx) -> None:
        """Plain Hydra drafts from h_t (ctx.hidden) alone; Hydra++ pushes the newly decided positions through its
        prefix layer first."""
        if self.m.prefix is None:
            self.base = ctx.hidden.to(self.m.proj.dtype)
            return
        self.push(new_rows(self.rows, ctx)[0])

    @torch.no_grad()
    def push(self, hidden: torch.Tensor) -> None:
        """Hidden states of the next positions through the prefix layer, into its KV cache (a sliding window)."""
        m = self.m
        start = max(0, hidden.shape[0] - m.window)
        x = hidden[start:].to(m.proj.dtype)[None]
        pos = torch.arange(self.rows + start, self.rows + start + x.shape[1], device=x.device)[None]
        q, k, v = m.prefix.qkv(x, pos)
        n = x.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()[None]
        keys, values, masks = ([k], [v], [causal]) if self.k is None else ([self.k, k], [self.v, v], [None, causal])
        out = m.prefix.finish(x, m.prefix.attend(q, keys, values, masks))
        self.k = k if self.k is None else torch.cat([self.k, k], 1)[:, -m.window:]
        self.v = v if self.v is None else torch.cat([self.v, v], 1)[:, -m.window:]
        self.rows += start + n
        self.base = out[0, -1]

    def expansion(self, bonus: int) -> "HydraTree":
        return HydraTree(self, bonus)


class HydraTree:
    def __init__(self, s: HydraSession, bonus: int):
        self.s, self.bonus = s, bonus

    @torch.no_grad()
    def logits(self, paths: list[list[int]]) -> torch.Tensor:
        m = self.s.m
        depth = len(paths[0])
        embs = m.embed([[self.bonus] + list(p) for p in paths])                  # [M, depth+1, d]
        base = self.s.base[None].expand(len(paths), -1)
        return m.project(m.head(depth, base, embs))


def _hydra(layers: int, prefix: bool = False, dropout: float = 0.0):
    def make(d: int, depth: int, n_layers: int) -> Hydra:
        return Hydra(d, depth, layers=layers, prefix=prefix, dropout=dropout, **(attention_sizes(d) if prefix else {}))
    return make


register(NetworkSpec("hydra", Hydra, _hydra(1), "positional", defaults=FitDefaults(lr=1e-3)),
         NetworkSpec("koala-hydra", Hydra, _hydra(2), "positional", defaults=FitDefaults(lr=1e-3), adversarial=True),
         NetworkSpec("hydra++", Hydra, _hydra(1, prefix=True, dropout=0.1), "prefix",
                     defaults=FitDefaults(lr=1e-3, batch=8)))
