"""Hardware utilisation per generated token, *computed* from the model config and the replay counters.

Why: block efficiency counts serial forwards only. A BPD verify forward reads the same weights as an AR step but
scores more tokens, and multi-draft / tree methods score many more; on memory-bound hardware (batch-1 decoding)
speed follows the bytes read per token, on compute-bound hardware the FLOPs. These numbers are arithmetic on
`Counters` (ratios of sums, as everywhere) and the model's shapes, not hardware-counter measurements.

Conventions (documented once here, so the table stays comparable across methods):
- base weights = every matmul weight read by a forward, lm_head included, the input embedding excluded (a lookup),
  biases and norms excluded (< 0.1%); FLOPs = 2 x those params per scored token (the prefill counts its last
  position only: prompt processing is the same for every method).
- heads: h residual blocks (d*d + d) plus the shortlisted projection (S x d), read and run once per step.
- neural rescorers run one forward per draft position (h per step) in the run's dtype (`rescorer_dtype` in the
  replay config; replays written before it was recorded ran them in fp32); n-gram rescorers are hash lookups,
  counted as zero and flagged in `note`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pandas as pd

from .. import refine
from .. import models, paths
from ..engine.counters import Counters
from ..methods import contract
from ..methods.base import Method
from . import load

DEFAULT_METHODS = ("ar", "bpd", "neural-m", "ngram4", "16best-0gram", "16best-ngram4", "medusa")
CONTEXTS = (128, 512, 1024, 2048)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
SHORTLIST = 32768
ATTN_CONTEXT = 2048
# Used only when the model's config.json is not cached on this machine (results copied from elsewhere).
BUILTIN_CONFIGS = {"qwen2.5-coder-0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                                          "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                                          "tie_word_embeddings": True}}
MISSING_VERIFIED = "verified estimated as drafted+steps (file predates the counter): undercounts multi-draft steps"


@dataclass(frozen=True)
class ModelShape:
    """The few numbers of a decoder-only transformer that byte and FLOP counts need."""
    d: int
    layers: int
    n_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    @property
    def linear_params(self) -> int:
        """Matmul weights per forward (q, k, v, o, gated MLP, lm_head); tied or not, lm_head is read each forward."""
        attn = 2 * self.d * self.n_heads * self.head_dim + 2 * self.d * self.kv_heads * self.head_dim
        return self.layers * (attn + 3 * self.d * self.ffn) + self.vocab * self.d

    def kv_elems(self, context: int) -> int:
        """K and V elements read by one forward attending to `context` cached positions."""
        return 2 * self.layers * self.kv_heads * self.head_dim * context


def shape_from_config(cfg: dict) -> ModelShape:
    n_heads = cfg["num_attention_heads"]
    return ModelShape(cfg["hidden_size"], cfg["num_hidden_layers"], n_heads, cfg.get("num_key_value_heads", n_heads),
                 cfg.get("head_dim") or cfg["hidden_size"] // n_heads, cfg["intermediate_size"], cfg["vocab_size"])


def model_shape(name: str) -> ModelShape:
    """From the cached HF config (any dtype: shapes do not depend on it), a local HF folder, or the built-in dict."""
    candidates = [paths.dense_model_dir(name, dt) / "config.json" for dt in models.DTYPES] if name in models.MODELS \
        else [where / "config.json" for where in [paths.resolve(name)] if where is not None]   # as recorded
    for path in candidates:
        if path.exists():
            return shape_from_config(json.loads(path.read_text()))
    if name in BUILTIN_CONFIGS:
        return shape_from_config(BUILTIN_CONFIGS[name])
    raise FileNotFoundError(f"no config.json for model '{name}' (looked in {', '.join(map(str, candidates))})")


def heads_shortlist(folder: load.ResultFolder, vocab: int) -> int:
    """Draft vocabulary size from the heads' config; heads without a shortlist project onto the full vocabulary."""
    path = paths.resolve(folder.heads_path) if folder.heads_path else paths.heads_dir(folder.model,
                                                                                      folder.heads_profile)
    if path is not None and (path / "config.json").exists():     # None: heads outside the checkout and cache
        size = json.loads((path / "config.json").read_text()).get("bpdbench", {}).get("shortlist_size")
        return int(size) if size else vocab
    return min(SHORTLIST, vocab)


@lru_cache(maxsize=None)
def neural_cost(size: str, shortlist: int) -> tuple[int, int]:
    """(params, MACs per token) of a neural rescorer, counted on the real module built on the meta device."""
    import torch
    from ..nets.small_lm import SmallLM, make_config
    cfg = make_config(size, shortlist)
    with torch.device("meta"):
        lm = SmallLM(cfg, torch.arange(shortlist, device="cpu"))
    return lm.num_params(), cfg.macs_per_token()


def _rescorer(name: str, shortlist: int) -> tuple[int, int, str]:
    """(params, MACs per token, note) of the rescorer of the method registered as `name`, run h times per step."""
    spec = refine.RESCORERS.get(name)   # None for ar, oracle, pld; scorer "none" for bpd
    if spec is not None and spec.size:  # neural, or a tree re-ranked by a neural rescorer
        params, macs = neural_cost(spec.size, shortlist)
        return params, macs, f"neural-{spec.size} rescorer: one forward per draft position"
    if spec is not None and spec.scorer == "ngram":
        return 0, 0, "n-gram rescorer: hash lookups, counted as 0 FLOPs / 0 bytes"
    return 0, 0, ""


def totals(c: Counters, name: str, shape: ModelShape, bpp: int, h: int, shortlist: int, rescorer_bpp: int = 4
           ) -> dict[str, float]:
    """Absolute bytes and FLOPs over the counted examples (divide by new_tokens for per-token figures); `name`: the
    method's registry name (bpd, neural-m, ...), which says what rescorer it runs."""
    d, P = shape.d, shape.linear_params
    scored = c.verified + (c.serial_calls - c.steps)          # + the prefill's last position, once per example
    r_params, r_macs, _ = _rescorer(name, shortlist)
    out = {"param_bytes": c.serial_calls * P * bpp + c.steps * (h * (d * d + d) + (shortlist * d if h else 0)) * bpp
           + c.steps * h * r_params * rescorer_bpp,
           "flops": scored * 2 * P + 2 * c.steps * (h * d * d + h * shortlist * d) + c.steps * h * 2 * r_macs,
           "attn_flops": scored * 4 * shape.layers * shape.n_heads * shape.head_dim * ATTN_CONTEXT}
    for ctx in CONTEXTS:
        out[f"kv_bytes@{ctx}"] = c.serial_calls * shape.kv_elems(ctx) * bpp
    return out


def _heads_used(folder: load.ResultFolder, label: str, heads):
    """A method's head count; `heads=auto` reads what the run resolved it to (config.json)."""
    if heads != "auto":
        return heads
    res = folder.resolved.get("methods", {}).get(label, {})
    return res.get("n_heads", (res.get("auto") or {}).get("params", {}).get("heads", 0))


def ar_counters(new_tokens: int) -> Counters:
    """Plain greedy decoding of the same output: a prefill, then one single-token forward per further token."""
    return Counters(new_tokens=new_tokens, serial_calls=new_tokens, steps=new_tokens - 1, verified=new_tokens - 1)


def task_rows(folder: load.ResultFolder, methods: tuple[Method, ...]) -> list[dict]:
    """Per method: summed counters and absolute costs for one `results/replay/<task>` folder."""
    recorded = folder.resolved.get("model_shape")
    shape = shape_from_config(recorded) if recorded else model_shape(folder.model)
    bpp, rescorer_bpp = DTYPE_BYTES[folder.dtype], DTYPE_BYTES[folder.rescorer_dtype or "float32"]
    shortlist = heads_shortlist(folder, shape.vocab)
    records = [r for r in folder.examples("replay.jsonl") if r.get("new_tokens")]   # method keys: current labels
    if not records:
        return []
    keys = {k for k, v in records[0].items() if isinstance(v, dict)}
    present = [m for m in methods if m.label == "ar" or (m.label in keys and contract.Input.REFERENCE not in contract.inputs(m))]
    rows = []
    for m in present:
        c, missing = Counters(), False
        for r in records:
            if m.label == "ar":          # plain AR's counts follow from the output; ar:rows=N verifies more
                c = c.add(ar_counters(r["new_tokens"]))
            else:
                missing |= r[m.label].get("verified") is None
                c = c.add(Counters.from_dict(r[m.label]))
        h = 0 if m.name in ("ar", "null") else int(_heads_used(folder, m.label, m.get("heads", folder.heads)))
        missing &= getattr(refine.RESCORERS.get(m.name), "p", 1) > 1   # one chain: drafted+steps is exact
        notes = [n for n in (_rescorer(m.name, shortlist)[2], MISSING_VERIFIED if missing else "") if n]
        rows.append({"task": folder.task, "method": m.label, "n_examples": len(records), "counters": c,
                     "note": "; ".join(notes), **totals(c, m.name, shape, bpp, h, shortlist, rescorer_bpp)})
    return rows


def per_token(rows: list[dict], task: str) -> dict:
    """One output row: ratios of sums over `rows` (one task, or every task for 'all')."""
    c = Counters()
    for r in rows:
        c = c.add(r["counters"])
    n = c.new_tokens

    def s(key: str) -> float:
        return sum(r[key] for r in rows)
    out = {"task": task, "method": rows[0]["method"], "n_examples": sum(r["n_examples"] for r in rows),
           "new_tokens": n, "block_efficiency": n / c.serial_calls,
           "verified_per_call": c.verified / c.steps if c.steps else float("nan"),
           "param_GB_per_token": s("param_bytes") / n / 1e9}
    for ctx in CONTEXTS:
        out[f"kv_MB_per_token@{ctx}"] = s(f"kv_bytes@{ctx}") / n / 1e6
    out["GFLOPs_per_token"] = s("flops") / n / 1e9
    out[f"attn_GFLOPs_per_token@{ATTN_CONTEXT}"] = s("attn_flops") / n / 1e9
    out["note"] = "; ".join(dict.fromkeys(r["note"] for r in rows if r["note"]))
    return out


def hardware_table(results: Path, methods: tuple[str, ...] = DEFAULT_METHODS,
                   task_order: list[str] | None = None) -> pd.DataFrame:
    """Rows for 'all' (every task pooled) then each task, methods in `methods` order (spellings: old ones too;
    those that name no method are left out)."""
    wanted = load.methods(methods)
    rows = [r for f in load.folders(results, "replay", "replay.jsonl") if f.has_config for r in task_rows(f, wanted)]
    if not rows:
        return pd.DataFrame()
    order = task_order or []
    tasks = sorted({r["task"] for r in rows}, key=lambda t: (order.index(t) if t in order else len(order), t))
    out = []
    for task in ["all", *tasks]:
        for m in wanted:
            sel = [r for r in rows if r["method"] == m.label and task in ("all", r["task"])]
            if sel:
                out.append(per_token(sel, task))
    return pd.DataFrame(out)
