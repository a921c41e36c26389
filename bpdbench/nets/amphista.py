"""Amphista-style non-autoregressive heads (Li et al., NAACL 2025; no public code): every depth in one pass.

Staged adaptation: stage 1 adapts the base's hidden state h_t (a residual block), stage 2 merges it with the
embedding of the sampled token x_{t+1} ((2d -> d) block with a residual projection). K Medusa heads (one
residual block each) turn the adapted state into K head states, and the auto-embedding block, one transformer layer
with *bidirectional* attention across the K head positions (rotary positions 0..K-1), lets each head see the others
before the base's frozen projection (shortlist). The paper's staged adaptation layers are causal transformer layers
over the sequence; ours are position-wise blocks (no cache), which keeps drafting one pass with no state to carry:
an assumption, since the paper's exact layer shapes were not available.
"""
from __future__ import annotations

import torch
from torch import nn

from .base import DraftModel
from .layers import DecoderLayer, ResBlock
from .registry import FitDefaults, NetworkSpec, attention_sizes, register


class Amphista(DraftModel):
    drafting = "parallel"
    type_name = "amphista"

    def __init__(self, d: int, depth: int, heads: int = 14, kv_heads: int = 2, ffn: int = 2048, dropout: float = 0.0):
        super().__init__(d, depth)
        self.heads, self.kv_heads, self.ffn = heads, kv_heads, ffn
        self.stage1 = ResBlock(d, dropout=dropout)
        self.stage2 = ResBlock(d, 2 * d, dropout=dropout)
        with torch.no_grad():                       # start from the adapted h_t through the residual path
            self.stage2.res.weight.zero_()
            self.stage2.res.weight[:, :d].copy_(torch.eye(d))
        self.head_blocks = nn.ModuleList(ResBlock(d, dropout=dropout) for _ in range(depth))
        self.block = DecoderLayer(d, heads, kv_heads, ffn, dropout)
        nn.init.zeros_(self.block.o.weight)         # the block starts as the identity: heads = Medusa heads
        nn.init.zeros_(self.block.down.weight)

    def dims(self) -> dict:
        return {"heads": self.heads, "kv_heads": self.kv_heads, "ffn": self.ffn}

    def forward(self, hidden: torch.Tensor, tok_emb: torch.Tensor) -> torch.Tensor:
        """hidden [B, d], embedding of x_{t+1} [B, d] -> head states [B, depth, d]."""
        n = self.depth
        z = self.stage2(torch.cat([self.stage1(hidden.to(tok_emb.dtype)), tok_emb], -1))
        x = torch.stack([self.head_blocks[i](z) for i in range(n)], 1)
        pos = torch.arange(n, device=x.device)[None].expand(x.shape[0], -1)
        full = torch.ones(x.shape[0], n, n, dtype=torch.bool, device=x.device)
        return self.block(x, pos, full)

    def teacher_states(self, hidden: torch.Tensor, embs: torch.Tensor) -> torch.Tensor:
        """Training (train/objectives.Positional): [n, depth, d] from h_t and x_{t+1}'s embedding (embs[:, 0])."""
        return self(hidden, embs[:, 0])

    @torch.no_grad()
    def parallel_logits(self, hidden: torch.Tensor, bonus: int, n: int) -> torch.Tensor:
        """[n, S] logits of depths 1..n after the bonus token, from one pass (all heads run: they attend to each
        other as in training, so a shorter draft reads the first n of them)."""
        return self.project(self(hidden[None].to(self.proj.dtype), self.embed([bonus]))[0, :n])


register(NetworkSpec("amphista", Amphista, lambda d, depth, n_layers: Amphista(d, depth, **attention_sizes(d)),
                     "positional", defaults=FitDefaults(lr=1e-3)))
