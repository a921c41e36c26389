"""EAGLE-3-style draft model (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
via Training-Time Test"; SafeAILab/EAGLE `eagle/traineagle3/cnets.py`): EAGLE's one autoregressive draft layer, with
the three changes the paper makes, as its reference code makes them.

- Fused features: the input feature of a decided position is fc(concat(low, middle, high)), the base's hidden
  states of three layers (engine.Layers.low_mid_high: 2, n/2, n-3) projected to d (a 3d -> d linear map, no bias),
  instead of the final state alone. The draft layer's later passes read its own previous output instead.
- The layer's attention reads concat(RMSNorm(token embedding), RMSNorm(feature)), 2d wide, and its residual stream
  is the feature (the reference's `LlamaDecoderLayeremb`); the output goes through a final RMSNorm before the
  vocabulary projection. Nothing asks the output to equal the base's next hidden state: EAGLE-3 drops EAGLE's
  feature regression, so the fed-back state is free to be whatever drafts best.
- Training-time test: the layer is trained on its own earlier drafts, `unroll` = 7 passes (the reference's
  `length = 7`), each attending as drafting does; that is the `unrolled` objective EAGLE already trains with
  (Eagle.unrolled), here with each pass's loss weighted 0.8^(p-1) (the reference's `ploss_weight`).

The draft vocabulary is the frequency-ranked shortlist every bpdbench draft network drafts over (the training data's
most frequent token ids, `rank.pt`; drafted ids map back to the full vocabulary through it), projected by the
base's frozen head rows. EAGLE-3 trains a head of its own over its 32k most frequent ids; a frozen head keeps the
trainable parameters to one layer, which is what a CPU fit of minutes to hours can move (docs/methods.md).

Drafting reuses EAGLE's session and tree code unchanged: the session's cache holds the rows of the decided
positions (here their fused layers, from DraftContext.accepted_layers), tree nodes of one depth run in one batched
call, and `tree=dynamic` is EAGLE-2's dynamic tree (methods/dynamic.py).
"""
from __future__ import annotations

import torch
from torch import nn

from ..engine.types import Layers
from .base import DraftModel, new_rows
from .eagle import Eagle, EagleSession
from .layers import DecoderLayer, RMSNorm, rope
from .registry import FitDefaults, NetworkSpec, attention_sizes, register


class FusedInputLayer(DecoderLayer):
    """EAGLE-3's draft layer: its input row is concat(token embedding, feature) [.., 2d]; attention reads both
    halves, each under its own RMSNorm; the residual stream (and the MLP after it) is the feature's."""

    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int, dropout: float = 0.0):
        super().__init__(d, heads, kv_heads, ffn, dropout)
        self.d = d
        del self.norm1
        self.emb_norm, self.feat_norm = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(2 * d, heads * self.hd, bias=False)
        self.k = nn.Linear(2 * d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(2 * d, kv_heads * self.hd, bias=False)

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        h = torch.cat([self.emb_norm(x[..., : self.d]), self.feat_norm(x[..., self.d:])], -1)
        shp = x.shape[:-1]
        q = rope(self.q(h).view(*shp, self.heads, self.hd), pos)
        k = rope(self.k(h).view(*shp, self.kv_heads, self.hd), pos)
        return q, k, self.v(h).view(*shp, self.kv_heads, self.hd)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        return super().finish(x[..., self.d:], attn)


class Eagle3(Eagle):
    type_name = "eagle3"

    def __init__(self, d: int, depth: int, layers: tuple[int, ...] = (0, 1, 2), heads: int = 14, kv_heads: int = 2,
                 ffn: int = 2048, window: int = 256, dropout: float = 0.0):
        DraftModel.__init__(self, d, depth)       # not Eagle's: its fc and identity start are EAGLE-1's
        self.heads, self.kv_heads, self.ffn, self.window, self.dropout = heads, kv_heads, ffn, window, dropout
        self.hidden_layers = Layers(tuple(layers))
        self.fc = nn.Linear(len(self.hidden_layers.indices) * d, d, bias=False)
        self.layer = FusedInputLayer(d, heads, kv_heads, ffn, dropout)
        self.norm = RMSNorm(d)

    def dims(self) -> dict:
        return {"layers": list(self.hidden_layers.indices), **super().dims()}

    def inputs(self, feat: torch.Tensor, tok_emb: torch.Tensor) -> torch.Tensor:
        """Rows [.., 2d] = concat(embedding, feature). `feat` is the base's declared layers [.., k, d] at a decided
        position (fused by fc) or the layer's own previous output [.., d] at a draft position."""
        if feat.dim() == tok_emb.dim() + 1:
            feat = self.fc(feat.flatten(-2).to(self.fc.weight.dtype))
        return torch.cat([tok_emb, feat.to(tok_emb.dtype)], -1)

    def project(self, z: torch.Tensor) -> torch.Tensor:
        """Drafting: the layer's output through the final norm, then the shortlist's rows of the base's head."""
        return super().project(self.norm(z.to(self.norm.weight.dtype)))

    def unrolled(self, feat: torch.Tensor, tok_emb: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor,
                 passes: int) -> list[torch.Tensor]:
        """EAGLE's training-time passes (each pass feeds the previous pass's raw output back, attending as drafting
        does), returned through the final norm: the states the fit projects with the base's head."""
        return [self.norm(o) for o in super().unrolled(feat, tok_emb, pos, valid, passes)]

    def session(self) -> "Eagle3Session":
        return Eagle3Session(self)


class Eagle3Session(EagleSession):
    """EAGLE's cache, pushed with the declared layers' states of the decided positions instead of the final ones."""

    def sync(self, ctx) -> None:
        fresh, tokens = new_rows(self.rows, ctx)       # checks that the session is in step with the context
        layers = ctx.accepted_layers
        if layers is None or layers.shape[0] != fresh.shape[0]:
            got = "none" if layers is None else f"{layers.shape[0]} rows for {fresh.shape[0]}"
            raise ValueError(f"eagle3 needs the base's states of layers {list(self.m.hidden_layers.indices)} at every "
                             f"decided position (DraftContext.accepted_layers); got {got}")
        self.push(layers, tokens)


register(NetworkSpec("eagle3", Eagle3,
                     lambda d, depth, n_layers: Eagle3(d, depth, Layers.low_mid_high(n_layers).indices,
                                                       **attention_sizes(d)),
                     "unrolled", layers=Layers.low_mid_high,
                     defaults=FitDefaults(lr=2e-3, batch=8, unroll=7, decay=0.8, ramp=True)))
