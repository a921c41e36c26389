"""Medusa-1 heads (Cai et al. 2024) as a draft model, and KOALA's multi-layer variant of them (Zhang et al. 2024).

Head i maps the base's final state h_t to token t+2+i through `layers` residual blocks and the base's frozen
projection (shortlist); every depth comes from one call, independent of the others (a lattice). Trained on the cached
distillation data by the same fit loop as every other drafter, so "Medusa-1 on the same data and budget" is a fair
baseline. Saved in the Medusa-1 layout (bpdbench.heads: `medusa_lm_head.pt`, `medusa_num_heads`,
`medusa_num_layers`), so `bpd --heads-path DIR` and every heads method decode with it too.
"""
from __future__ import annotations

import torch

from .heads import Heads
from .base import DraftModel
from .registry import NetworkSpec, register


class MedusaHeads(DraftModel):
    drafting = "parallel"
    type_name = "medusa"

    def __init__(self, d: int, depth: int, layers: int = 1):
        super().__init__(d, depth)
        self.layers = layers
        self.heads = Heads(d, depth, layers)

    def dims(self) -> dict:
        return {"layers": self.layers}

    @classmethod
    def from_heads(cls, heads: Heads) -> "MedusaHeads":
        """Wrap loaded heads (ours or a published Medusa-1 checkpoint, which may carry its own projections)."""
        model = cls(heads.blocks[0][0].linear.in_features, heads.num_heads, heads.num_layers)
        model.heads = heads
        return model

    def states(self, hidden: torch.Tensor, n: int) -> torch.Tensor:
        """hidden [B, d] -> [B, n, d]: the residual-block outputs the projection turns into each depth's logits."""
        return self.heads.features(hidden, n).transpose(0, 1)

    def teacher_states(self, hidden: torch.Tensor, embs: torch.Tensor) -> torch.Tensor:
        """Training (train/objectives.Positional): [n, D, d] states of depths 1..D from rows' features [n, d]; the
        true tokens' embeddings [n, D, d] are unused (the heads see h_t only)."""
        return self.states(hidden, embs.shape[1])

    @torch.no_grad()
    def parallel_logits(self, hidden: torch.Tensor, bonus: int, n: int) -> torch.Tensor:
        """[n, S] logits of depths 1..n (the bonus token is unused: Medusa heads see h_t only)."""
        z = self.states(hidden[None].to(self.proj.dtype), n)[0]
        if self.heads.proj is not None:                        # a foreign checkpoint's own projections
            return torch.stack([self.heads.proj[i](z[i]) for i in range(n)])
        return self.project(z)


def _medusa(layers: int):
    return lambda d, depth, n_layers: MedusaHeads(d, depth, layers)


register(NetworkSpec("medusa", MedusaHeads, _medusa(1), "positional"),
         NetworkSpec("koala", MedusaHeads, _medusa(2), "positional", adversarial=True))
