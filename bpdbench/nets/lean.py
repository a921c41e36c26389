"""A lean forward of a Qwen2/Llama-shaped transformers decoder for the self-drafts: the same weights and cache,
run by one function per layer, with q, k and v one matmul and gate and up another.

Why: a self-draft forwards one token at a time, so besides its weights it pays the library's per-module and per-op
host work on every token: 24 layers of module calls, mask building, rotary tables and a cache that grows by
concatenation. Where the weights are cheap to read (int4: about a third of a decode step), that host work is a
large share of a draft token. This forward keeps the arithmetic of transformers' Qwen2 layers (float32 RMSNorm,
rotary embedding, grouped-query attention by `scaled_dot_product_attention`, SiLU MLP) and the model's own modules
for every weight, so it drafts the same tokens up to the rounding of fused matmuls; what it drops is work, not
maths. A draft token (one row) of a quantized copy takes a shorter path still (`_token`): the kernels called
directly, q and k rotated in one op, the hidden state kept as one row; the same ops on the same numbers, so the same
logits bit for bit, 7% less per int4 token of the 0.5B model (`python -m bpdbench.experiments.draftcost`: 25.3
against 27.1 ms at 700 tokens of context, Intel Xeon with avx512_bf16, 2 threads; the int4 matmuls alone take 18.5).
`rescoring(weight, k)` gives a quantized draft the target's own output rows for the `k` tokens its int4 projection
ranks highest (`RescoredHead`). The draft stays a model the engine can call (`__call__` takes transformers'
arguments and returns `.logits`), so drafters, replay and the self-draft profile run it unchanged.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..engine.cache import SlotCache
from .quant import QuantLinear, joined

Row = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class _Layer:
    index: int                      # the layer's index in the full model: the cache layer it reads and writes
    norm1: Any
    norm2: Any
    qkv: Any                        # one module for q, k, v, or None (then q, k, v below)
    q: Any
    k: Any
    v: Any
    o: Any
    gate_up: Any                    # one module for gate and up, or None
    gate: Any
    up: Any
    down: Any
    rows: SimpleNamespace | None = None     # one-row kernels of qkv, o, gate_up, down (`_token`), or None


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2RMSNorm: in float32, cast back, then scaled."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def supported(model: Any) -> str | None:
    """Why `model` cannot run leanly (None: it can): the forward knows Qwen2/Llama decoders only."""
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return "not a transformers decoder with model.layers and lm_head"
    if getattr(cfg, "model_type", "") not in ("qwen2", "llama"):
        return f"model type {getattr(cfg, 'model_type', '?')!r} (the lean forward knows qwen2 and llama)"
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"rope type {rope.get('rope_type')!r}"
    if getattr(cfg, "use_sliding_window", False):
        return "a sliding-window attention"
    layer = inner.layers[0]
    if not hasattr(layer, "self_attn") or not hasattr(layer, "mlp") or not hasattr(layer.mlp, "gate_proj"):
        return "layers without self_attn and a gated mlp"
    return None


def _row(m: Any) -> Row:
    """`m` over one row [1, in]: its kernel called directly where it is a QuantLinear that would call it anyway
    (QuantLinear.forward's reshapes, casts and checks are a tenth of an int4 token), else the module."""
    if not isinstance(m, QuantLinear) or m.inv_scale is not None or m.kernel not in ("int4", "int8"):
        return m
    if m.kernel == "int4":
        q, group, sz, op4 = m.q, m.group, m.scale_zero, torch.ops.aten._weight_int4pack_mm_for_cpu
        mm: Row = lambda h: op4(h, q, group, sz)                     # noqa: E731
    else:
        q, scale, op8 = m.q, m.scale, torch.ops.aten._weight_int8pack_mm
        mm = lambda h: op8(h, q, scale)                              # noqa: E731
    bias = m.bias
    return mm if bias is None else (lambda h: mm(h) + bias)


def _fused(modules: list[Any]) -> Any:
    """One module for several same-input linear layers, where they are QuantLinear copies that can share a kernel;
    dense layers stay apart (fusing them would copy the target's own weights)."""
    if all(isinstance(m, QuantLinear) for m in modules):
        return joined(modules)
    return None


class RescoredHead(torch.nn.Module):
    """A draft's output projection whose `k` highest-scoring tokens are scored again by the target's own rows, in
    float32: the draft's choice among them is then the one the target's projection of the draft's hidden state makes.
    Why: the int4 output projection costs a self-draft agreement beyond what its 24 int4 layers cost (the 0.5B
    model's int4 copy agrees with the target on 0.791 of the Spec-Bench tune positions, and on 0.839 with the
    target's bfloat16 projection over the same hidden states), while reading the bfloat16 projection (272 MB) would
    cost about three draft tokens' worth of bytes; the target's argmax is among the int4 top 8 at every one of those
    positions, and rescoring 8 rows reads 14 KB. The idea is the paper's (rescore a draft's top-k with a better
    scorer) and SVD-softmax's (a cheap preview, then the exact scores of its few best). Every other token keeps the
    draft's own score, so the draft's distribution stays a distribution (speculative sampling stays exact for any
    q)."""

    def __init__(self, head: Any, weight: torch.Tensor, bias: torch.Tensor | None, k: int):
        super().__init__()
        self.head, self.weight, self.bias, self.k = head, weight, bias, min(k, weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(x).float()
        top = y.topk(self.k, -1).indices
        rows = self.weight.index_select(0, top.reshape(-1)).view(*top.shape, -1).float()
        exact = (rows @ x.float().unsqueeze(-1)).squeeze(-1)
        if self.bias is not None:
            exact = exact + self.bias.float()[top]
        return y.scatter_(-1, top, exact)


class LeanDecoder:
    """The kept layers (`layers`: indices; default all) of a transformers Qwen2/Llama model, run leanly. Each kept
    layer reads and writes the cache layer of its own index, as the model's own layers do, so the layer-skipped
    drafts and the drafts on the base's cache read the right keys."""

    def __init__(self, model: Any, layers: list[int] | None = None):
        why = supported(model)
        if why:
            raise ValueError(f"lean forward: {why}")
        inner, cfg = model.model, model.config
        self.model, self.config = model, cfg
        self.embed, self.norm, self.head, self.rotary = inner.embed_tokens, inner.norm, model.lm_head, inner.rotary_emb
        self.eps = cfg.rms_norm_eps
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.head_dim ** -0.5
        keep = range(len(inner.layers)) if layers is None else layers
        self.layers = [self._layer(i, inner.layers[i]) for i in keep]
        if not self.layers or self.layers[0].index != 0:
            raise ValueError("lean forward: layer 0 must be kept (the cache's length is read from its keys)")
        self.fused = sum((l.qkv is not None) + (l.gate_up is not None) for l in self.layers)
        self.one_row = all(l.rows is not None for l in self.layers)

    def keeping(self, layers: list[int]) -> "LeanDecoder":
        """The same forward over only `layers` (indices), sharing this one's fused weights (a layer search tries
        many sets: each would otherwise fuse and pack the copy again)."""
        out = copy.copy(self)
        by_index = {l.index: l for l in self.layers}
        out.layers = [by_index[i] for i in layers]
        out.one_row = all(l.rows is not None for l in out.layers)
        if not out.layers or out.layers[0].index != 0:
            raise ValueError("lean forward: layer 0 must be kept (the cache's length is read from its keys)")
        return out

    def rescoring(self, weight: torch.Tensor, bias: torch.Tensor | None, k: int) -> "LeanDecoder":
        """The same forward, its top `k` tokens scored again by `weight` (the target's output rows; RescoredHead)."""
        out = copy.copy(self)
        out.head = RescoredHead(self.head, weight, bias, k)
        return out

    def _layer(self, i: int, layer: Any) -> _Layer:
        a, m = layer.self_attn, layer.mlp
        out = _Layer(i, layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                     _fused([a.q_proj, a.k_proj, a.v_proj]), a.q_proj, a.k_proj, a.v_proj, a.o_proj,
                     _fused([m.gate_proj, m.up_proj]), m.gate_proj, m.up_proj, m.down_proj)
        if out.qkv is not None and out.gate_up is not None:
            out.rows = SimpleNamespace(qkv=_row(out.qkv), o=_row(out.o), gate_up=_row(out.gate_up),
                                       down=_row(out.down))
        return out

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def new_cache(self) -> DynamicCache:
        """A preallocated cache: a draft token writes its rows instead of copying every layer's keys."""
        return SlotCache()

    def __call__(self, input_ids: torch.Tensor, past_key_values: DynamicCache | None = None, use_cache: bool = True,
                 logits_to_keep: int = 0, **_: Any) -> SimpleNamespace:
        cache = past_key_values if past_key_values is not None else self.new_cache()
        n = input_ids.shape[1]
        if n == 1 and input_ids.shape[0] == 1 and self.one_row:
            return self._token(input_ids, cache)
        start = cache.get_seq_length()
        x = self.embed(input_ids)
        positions = torch.arange(start, start + n, device=x.device)[None]
        cos, sin = self.rotary(x, positions)
        cos, sin = cos[:, None], sin[:, None]
        mask = None
        if n > 1:       # causal over the new rows, everything cached before them visible
            mask = torch.ones(n, start + n, dtype=torch.bool, device=x.device).tril(start)
        for layer in self.layers:
            x = self._block(layer, x, cos, sin, mask, cache)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.head(_norm(x, self.norm.weight, self.eps)), past_key_values=cache)

    def _token(self, input_ids: torch.Tensor, cache: DynamicCache) -> SimpleNamespace:
        """One token of one sequence through fused quantized layers: `_block`'s ops on a [1, d] row."""
        start = cache.get_seq_length()
        x = self.embed(input_ids)[0]
        cos, sin = self.rotary(x[None], torch.arange(start, start + 1, device=x.device)[None])
        cos, sin = cos[0], sin[0]                    # [1, head_dim]: broadcast over the q and k heads
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        half, qk_width = d // 2, (h + kv) * d
        for l in self.layers:
            qkv = l.rows.qkv(_norm(x, l.norm1, self.eps))
            qk = qkv[:, :qk_width].view(h + kv, d)
            qk = qk * cos + torch.cat((-qk[:, half:], qk[:, :half]), -1) * sin        # _rotate, q and k at once
            k, v = cache.update(qk[h:].view(1, kv, 1, d), qkv[:, qk_width:].view(1, kv, 1, d), l.index)
            a = F.scaled_dot_product_attention(qk[:h].view(1, h, 1, d), k, v, scale=self.scale,
                                               enable_gqa=h != kv)
            x = x + l.rows.o(a.view(1, h * d))
            g, u = l.rows.gate_up(_norm(x, l.norm2, self.eps)).chunk(2, -1)
            x = x + l.rows.down(F.silu(g) * u)
        return SimpleNamespace(logits=self.head(_norm(x, self.norm.weight, self.eps))[None], past_key_values=cache)

    def _block(self, l: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
               cache: DynamicCache) -> torch.Tensor:
        b, n, _ = x.shape
        h = _norm(x, l.norm1, self.eps)
        hq, hk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if l.qkv is not None:
            q, k, v = l.qkv(h).split((hq, hk, hk), -1)
        else:
            q, k, v = l.q(h), l.k(h), l.v(h)
        q = _rotate(q.view(b, n, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = _rotate(k.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        k, v = cache.update(k, v, l.index)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                           enable_gqa=self.heads != self.kv_heads)
        x = x + l.o(a.transpose(1, 2).reshape(b, n, hq))
        h = _norm(x, l.norm2, self.eps)
        if l.gate_up is not None:
            g, u = l.gate_up(h).chunk(2, -1)
        else:
            g, u = l.gate(h), l.up(h)
        return x + l.down(F.silu(g) * u)
