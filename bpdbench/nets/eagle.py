"""EAGLE-style draft model (Li et al. 2024, SafeAILab/EAGLE `cnets1.py`): one decoder layer over
fc(concat(feature, token embedding)), run autoregressively over its own predicted features, ending in the base's
frozen vocabulary projection (here cut to the drafting shortlist).

Row j of the draft layer takes the base's hidden state f_j and the embedding of the token it produced, x_{j+1}, and
predicts f_{j+1}, whose projection drafts x_{j+2}. At drafting time the rows of every decided position use the base's
real hidden states (kept in the layer's own KV cache, a sliding window of `window` rows, positions as the base's);
draft positions use the layer's own outputs. Tree nodes attend to the cache, their ancestors and themselves, and all
nodes of one depth run in one batched call.
"""
from __future__ import annotations

import torch
from torch import nn

from .base import DraftModel, new_rows
from .layers import DecoderLayer
from .registry import FitDefaults, NetworkSpec, attention_sizes, register


class Eagle(DraftModel):
    type_name = "eagle"

    def __init__(self, d: int, depth: int, heads: int = 14, kv_heads: int = 2, ffn: int = 2048, window: int = 256,
                 dropout: float = 0.0):
        super().__init__(d, depth)
        self.heads, self.kv_heads, self.ffn, self.window, self.dropout = heads, kv_heads, ffn, window, dropout
        self.fc = nn.Linear(2 * d, d)
        self.layer = DecoderLayer(d, heads, kv_heads, ffn, dropout)
        # Start as the identity on the feature (fc = [I 0], zero attention output and MLP down projection): the
        # first prediction of f_{t+1} is f_t, already in the base's hidden space, and training learns the
        # correction, as Medusa's zero-initialised blocks do. With a few tens of thousands of training tokens a
        # random start spent most of its steps finding that space and generalised worse (measured).
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, :d].copy_(torch.eye(d))
            self.fc.bias.zero_()
        nn.init.zeros_(self.layer.o.weight)
        nn.init.zeros_(self.layer.down.weight)

    def dims(self) -> dict:
        return {"heads": self.heads, "kv_heads": self.kv_heads, "ffn": self.ffn, "window": self.window}

    def inputs(self, feat: torch.Tensor, tok_emb: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([feat.to(tok_emb.dtype), tok_emb], -1))

    def forward(self, feat: torch.Tensor, tok_emb: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor
                ) -> torch.Tensor:
        """Training: rows [B, n] of (feature, embedding of the token it produced) -> predicted next features."""
        return self.layer(self.inputs(feat, tok_emb), pos, mask)

    def unrolled(self, feat: torch.Tensor, tok_emb: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor,
                 passes: int) -> list[torch.Tensor]:
        """Training-time drafting (as EAGLE-3's training-time test): pass 1 is the layer over real features (row j
        predicts f_{j+1}); pass p feeds pass p-1's prediction at row j-1 as row j's feature, and attends exactly as
        depth p does when drafting: to pass 1's keys of rows <= j-p+1 (the decided context) and to the keys of
        passes 2..p at rows j-p+2..j (its draft ancestors and itself). Returns every pass's outputs [B, n, d]."""
        from .layers import causal_mask
        layer = self.layer
        x1 = self.inputs(feat, tok_emb)
        q1, k1, v1 = layer.qkv(x1, pos)
        outs = [layer.finish(x1, layer.attend(q1, [k1], [v1], [causal_mask(valid)]))]
        n = x1.shape[1]
        ar = torch.arange(n, device=x1.device)
        eye = torch.eye(n, dtype=torch.bool, device=x1.device)[None]
        ks, vs = [], []
        for p in range(2, passes + 1):
            x = self.inputs(_shift(outs[-1], 1), tok_emb)
            q, k, v = layer.qkv(x, pos)
            ks.append(k)
            vs.append(v)
            ctx = (ar[None, :] <= ar[:, None] - p + 1)[None] & valid[:, None, :]
            keys, values, masks = [k1], [v1], [ctx]
            for i, (kq, vq) in enumerate(zip(ks, vs), start=2):
                keys.append(_shift(kq, p - i))
                values.append(_shift(vq, p - i))
                masks.append(eye)
            outs.append(layer.finish(x, layer.attend(q, keys, values, masks)))
        return outs

    def session(self) -> "EagleSession":
        return EagleSession(self)


def _shift(x: torch.Tensor, s: int) -> torch.Tensor:
    """Rows moved s places later along dim 1 (row j gets row j - s; the first s rows are zeros)."""
    if s == 0:
        return x
    return torch.cat([torch.zeros_like(x[:, :s]), x[:, :-s]], 1)


class EagleSession:
    """The draft layer's KV cache over the decided positions' real features, in step with the decoded context.

    Invariant: rows 0..`rows`-1 have been pushed (row j = position j, paired with token j+1), the cache holds the
    last `window` of them, and `last` is the layer's output at row `rows`-1 (the predicted feature whose projection
    drafts the first token after the context)."""

    def __init__(self, model: Eagle):
        self.m = model
        self.k = self.v = None
        self.pos = torch.zeros(0, dtype=torch.long)
        self.rows = 0
        self.last: torch.Tensor | None = None

    def sync(self, ctx) -> None:
        """Push the positions decided since the last proposal (ctx.accepted_hidden), so the cache covers the
        context up to the row of its last token."""
        self.push(*new_rows(self.rows, ctx))

    @torch.no_grad()
    def push(self, hidden: torch.Tensor, tokens: list[int]) -> None:
        """Rows for the next positions: hidden [m, d] of positions rows..rows+m-1 and the tokens they produced."""
        m, layer = self.m, self.m.layer
        start = max(0, hidden.shape[0] - m.window)              # older rows would fall out of the window anyway
        hidden, tokens = hidden[start:], tokens[start:]
        pos = torch.arange(self.rows + start, self.rows + start + hidden.shape[0], device=hidden.device)
        x = m.inputs(hidden.to(m.proj.dtype), m.embed(tokens))[None]           # [1, n, d]
        q, k, v = layer.qkv(x, pos[None])
        n = x.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()[None]
        keys, values, masks = [k], [v], [causal]
        if self.k is not None:
            keys, values, masks = [self.k, k], [self.v, v], [None, causal]
        out = layer.finish(x, layer.attend(q, keys, values, masks))
        self.k = k if self.k is None else torch.cat([self.k, k], 1)[:, -m.window:]
        self.v = v if self.v is None else torch.cat([self.v, v], 1)[:, -m.window:]
        self.rows += start + n
        self.last = out[0, -1]

    def expansion(self, bonus: int) -> "EagleTree":
        """Draft rows after the context (the bonus token is the cache's last row's token already)."""
        return EagleTree(self)


class EagleTree:
    """One proposal's draft rows: path -> (output feature, key, value); the empty path is the cache's last row."""

    def __init__(self, s: EagleSession):
        self.s = s
        self.nodes: dict[tuple, tuple] = {(): (s.last, None, None)}

    @torch.no_grad()
    def logits(self, paths: list[list[int]]) -> torch.Tensor:
        m, s, layer = self.s.m, self.s, self.s.m.layer
        depth = len(paths[0])
        if depth == 0:
            return m.project(s.last[None])
        feats = torch.stack([self.nodes[tuple(p[:-1])][0] for p in paths])            # [M, d]
        x = m.inputs(feats, m.embed([p[-1] for p in paths]))[:, None]                 # [M, 1, d]
        pos = torch.full((len(paths), 1), s.rows + depth - 1, device=x.device)
        q, k, v = layer.qkv(x, pos)
        big = len(paths)
        keys, values, masks = [s.k.expand(big, -1, -1, -1)], [s.v.expand(big, -1, -1, -1)], [None]
        if depth > 1:                                         # ancestors: the proper non-empty prefixes
            anc = [[self.nodes[tuple(p[:i])] for i in range(1, depth)] for p in paths]
            keys.append(torch.stack([torch.cat([a[1] for a in row]) for row in anc]))
            values.append(torch.stack([torch.cat([a[2] for a in row]) for row in anc]))
            masks.append(None)
        keys.append(k)
        values.append(v)
        masks.append(None)
        out = layer.finish(x, layer.attend(q, keys, values, masks))[:, 0]             # [M, d]
        for i, p in enumerate(paths):
            self.nodes[tuple(p)] = (out[i], k[i], v[i])
        return m.project(out)


register(NetworkSpec("eagle", Eagle, lambda d, depth, n_layers: Eagle(d, depth, **attention_sizes(d)), "unrolled",
                     defaults=FitDefaults(lr=2e-3, batch=8, unroll=5, noise=0.02, feature_weight=0.1)))
