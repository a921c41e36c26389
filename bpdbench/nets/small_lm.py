"""A small decoder-only LM over the heads' shortlist: the paper's local neural rescorer (refine/neural.py) and a draft model.

Design choices, and why:
- Vocabulary = the heads' shortlist. Lattice candidates are always shortlist ids, so the output softmax covers only
  the shortlist (S ~ 32k columns instead of 152k: 4.6x cheaper output layer, which dominates a model this small).
  Inputs outside the shortlist (prompt tokens, rare code) map to one extra <unk> row rather than a full 152k-row
  embedding: the corpus is ~1.4M tokens, far too little to learn 120k rare rows, and it keeps params ~ MACs.
- Tied input/output embeddings: same data-starvation argument (halves the parameters to fit), standard for LMs this
  size. The output uses rows [0, S) of the embedding; the <unk> row is input-only (it is never a target).
- Pre-norm (RMSNorm), RoPE, SwiGLU MLP, causal SDPA; RoPE keeps a sliding window exact in relative positions, but we
  still re-encode the window from position 0 when it overflows (see below) so decode matches training.
- Decode never normalises: the greedy choice at position i is argmax_j head_lp[i, j] + alpha * log P_LM(c_j | .),
  and log Z is the same for all k candidates, so only the k candidate logits are computed (k x d MACs instead of
  S x d). The sizing below still counts the full shortlist projection, as the paper sizes its rescorers.

Sizes (MACs/token = matmul multiply-accumulates per token, output projection over S = 32768 included, attention
score terms excluded: they add 2 x ctx x d per layer, <= 0.5M at ctx 256; the target is Qwen2.5-Coder-0.5B at
24 x 14.91M + 151936 x 896 = 493.96M MACs/token, so 2/4/6% = 9.9/19.8/29.6M):

| size | d   | layers | heads | d_ff | params (S=32768) | MACs/token | % of target |
|------|-----|--------|-------|------|------------------|------------|-------------|
| s    | 224 | 4      | 4     | 608  | 9.78M            | 9.78M      | 1.98%       |
| m    | 384 | 4      | 6     | 1024 | 19.66M           | 19.66M     | 3.98%       |
| l    | 448 | 6      | 7     | 1216 | 29.31M           | 29.30M     | 5.93%       |

Context bound: the LM attends to at most `max_len` = 256 tokens (its training window), draft tokens included. When
context + draft would overflow, the cache is rebuilt from the last 3/4 * max_len context tokens starting at
position 0 (one batched forward every ~64 decoded tokens), so decode always sees training-like positions.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn



QWEN_05B_MACS = 24 * (2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864) + 151936 * 896  # 493,961,216
SIZES: dict[str, dict[str, int]] = {
    "s": dict(d_model=224, n_layers=4, n_heads=4, d_ff=608),
    "m": dict(d_model=384, n_layers=4, n_heads=6, d_ff=1024),
    "l": dict(d_model=448, n_layers=6, n_heads=7, d_ff=1216),
    "tiny": dict(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=64),  # tests and smoke runs only
}


@dataclass(frozen=True)
class SmallLMConfig:
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    shortlist_size: int
    max_len: int = 256
    rope_theta: float = 10000.0
    eps: float = 1e-5

    def macs_per_token(self) -> int:
        d, f = self.d_model, self.d_ff
        return self.n_layers * (4 * d * d + 3 * d * f) + self.shortlist_size * d


def make_config(size: str, shortlist_size: int) -> SmallLMConfig:
    if size not in SIZES:
        raise ValueError(f"unknown rescorer size '{size}'; valid: {', '.join(SIZES)}")
    return SmallLMConfig(shortlist_size=shortlist_size, **SIZES[size])


class KVCache:
    """Preallocated per-layer K/V ([1, H, capacity, hd]); `length` is the fill, so rolling back a draft is free."""

    def __init__(self, cfg: SmallLMConfig, capacity: int, device: torch.device, dtype: torch.dtype):
        hd = cfg.d_model // cfg.n_heads
        self.k = [torch.zeros(1, cfg.n_heads, capacity, hd, device=device, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.capacity, self.length = capacity, 0


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, c: SmallLMConfig):
        super().__init__()
        self.h, self.hd = c.n_heads, c.d_model // c.n_heads
        self.n1, self.n2 = nn.RMSNorm(c.d_model, eps=c.eps), nn.RMSNorm(c.d_model, eps=c.eps)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model, bias=False)   # fused: fewer ops per decode step
        self.o = nn.Linear(c.d_model, c.d_model, bias=False)
        self.up = nn.Linear(c.d_model, 2 * c.d_ff, bias=False)       # gate and up, fused
        self.down = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x, cos, sin, kv: tuple[torch.Tensor, torch.Tensor] | None, start: int, mask):
        B, T, D = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if kv is not None:
            kv[0][:, :, start:start + T] = k
            kv[1][:, :, start:start + T] = v
            k, v = kv[0][:, :, :start + T], kv[1][:, :, :start + T]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        g, u = self.up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class SmallLM(nn.Module):
    """Decoder-only LM over shortlist columns; `cols` maps target-model token ids to columns (S = <unk>)."""

    def __init__(self, cfg: SmallLMConfig, shortlist: torch.Tensor):
        super().__init__()
        if len(shortlist) != cfg.shortlist_size:
            raise ValueError(f"shortlist has {len(shortlist)} ids, config says {cfg.shortlist_size}")
        self.cfg = cfg
        S = cfg.shortlist_size
        self.emb = nn.Embedding(S + 1, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.eps)
        shortlist = shortlist.long().cpu()
        table = torch.full((int(shortlist.max()) + 2,), S, dtype=torch.long)  # last entry: any larger id -> <unk>
        table[shortlist] = torch.arange(S)
        self.register_buffer("shortlist", shortlist, persistent=False)
        self.register_buffer("id2col", table, persistent=False)
        hd = cfg.d_model // cfg.n_heads
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd)
        ang = torch.outer(torch.arange(cfg.max_len).float(), inv).repeat(1, 2)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        self.apply(self._init)
        for b in self.blocks:  # GPT-2 style: keep the residual stream's variance independent of depth
            for w in (b.o.weight, b.down.weight):
                nn.init.normal_(w, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def cols(self, ids: torch.Tensor) -> torch.Tensor:
        return self.id2col[ids.clamp(0, len(self.id2col) - 1)]

    def targets(self, ids: torch.Tensor) -> torch.Tensor:
        """Columns for use as training targets: ids outside the shortlist are ignored (-100), never predicted."""
        c = self.cols(ids)
        return c.masked_fill(c == self.cfg.shortlist_size, -100)

    @property
    def out_weight(self) -> torch.Tensor:
        return self.emb.weight[: self.cfg.shortlist_size]

    def forward(self, cols: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """cols [B, T] -> final hidden states [B, T, d]; with a cache, appends T positions after cache.length."""
        T = cols.shape[1]
        start = cache.length if cache is not None else 0
        if start + T > (cache.capacity if cache is not None else self.cfg.max_len):
            raise ValueError(f"sequence of {start + T} tokens exceeds the LM window")
        cos, sin = self.cos[start:start + T], self.sin[start:start + T]
        mask = None
        if cache is not None and start > 0 and T > 1:  # SDPA's is_causal aligns top-left: wrong with a prefix
            mask = torch.ones(T, start + T, dtype=torch.bool, device=cols.device).tril(start)
        x = self.emb(cols)
        for i, b in enumerate(self.blocks):
            x = b(x, cos, sin, (cache.k[i], cache.v[i]) if cache is not None else None, start, mask)
        if cache is not None:
            cache.length = start + T
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.out_weight.T

    def loss(self, cols: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(self(cols))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def save_lm(lm: SmallLM, out: str | Path) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"format": "bpdbench-smalllm-1", **asdict(lm.cfg)}, indent=2) + "\n")
    save_file({k: v.detach().float().contiguous().cpu() for k, v in lm.state_dict().items()}, out / "model.safetensors")
    torch.save(lm.shortlist.cpu(), out / "shortlist.pt")
    return out


def load_lm(path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> SmallLM:
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no neural rescorer at {path}: train it first (bpdbench train-rescorer)")
    raw = json.loads((path / "config.json").read_text())
    raw.pop("format", None)
    lm = SmallLM(SmallLMConfig(**raw), torch.load(path / "shortlist.pt", weights_only=True))
    lm.load_state_dict(load_file(path / "model.safetensors"))
    return lm.to(device=device, dtype=dtype).eval().requires_grad_(False)


