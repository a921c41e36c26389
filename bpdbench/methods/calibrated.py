"""The quantized copy's calibrated rounding (methods/qdraft.py `scales=awq`, `rounding=gptq`): chosen on the task's
train split, cached, and recorded with the ids it saw.

Why a module: both choices read the same thing, every linear layer's inputs over a few train-split prompts, and
both take a minute or more on the 0.5B model, so they are made once per model, dtype, task and rounding and kept in
`$BPDBENCH_CACHE/selfdraft/scales/`. The record goes into the result (`resolved.<label>.scales`), whose `seen` lets
`bpdbench audit` count the calibration prompts against the evaluated ones (never the tune split, which measures the
draft's agreement, nor eval).
"""
from __future__ import annotations

import hashlib
import io
from typing import Any, Callable

import torch

import tasks as task_registry
from .. import paths
from ..nets import awq, gptq
from ..nets.quant import dequantize_int4, int4_group, quantize_int4, quantize_int8
from ..store import write_atomic
from .base import MethodError
from .env import Env
from .selfdraft import split_prompts

SCALES = ("minmax", "awq")
ROUNDINGS = ("nearest", "gptq")
PROMPTS = 8              # train-split prompts whose activations choose them
GPTQ_ROWS = 4096         # input rows per layer kept for GPTQ's H (8 prompts of 192 tokens give 1536)
VERSION = 2              # of the choice and its file; raise it when either changes (2: levels packed in bytes)


def recipe() -> str:
    """A digest of everything a cached choice depends on besides its file name's model, dtype, task and shape: a
    changed constant (prompts, rows, alphas, damping) chooses again instead of reading a stale choice."""
    parts = [VERSION, PROMPTS, GPTQ_ROWS, awq.ROWS, list(awq.ALPHAS), gptq.DAMP, gptq.BLOCK]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:8]


def calibrated(env: Env, bits: int, group: int, scales: str, rounding: str, is_linear: Callable[[Any], bool]
               ) -> tuple[dict[str, torch.Tensor] | None, dict[str, tuple] | None, dict]:
    """(input scales by layer or None, int4 rounding by layer or None, the record) for this copy."""
    if scales == "minmax" and rounding == "nearest":
        return None, None, {"scales": scales, "rounding": rounding}
    key = ("calibrated", bits, group, scales, rounding)
    if key in env.cache:
        return env.cache[key]
    path = paths.rounding_file(
            f"{env.cfg.model.replace('/', '_')}-{env.cfg.dtype}-{env.cfg.task}-int{bits}-g{group}-{scales}-"
            f"{rounding}-{recipe()}.pt")
    try:
        kept = torch.load(path, weights_only=True)
        found = kept["scales"], _unpacked(kept["parts"]), kept["record"]
    except (OSError, RuntimeError, KeyError, EOFError, ValueError):
        found = _choose(env, bits, group, scales, rounding, is_linear)
        buf = io.BytesIO()
        torch.save({"scales": found[0], "parts": _packed(found[1]), "record": found[2]}, buf)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, buf.getvalue())
        except OSError as e:
            env.log(f"note: could not cache the calibrated rounding at {path} ({e}); it is chosen again next time")
    env.cache[key] = found
    return found


def _packed(parts: dict[str, tuple] | None) -> dict[str, tuple] | None:
    """Two 4-bit levels per byte: the 0.5B model's rounding takes 370 MB on disk (with its scales and zeros), where
    int32 levels took 2.1 GB."""
    if parts is None:
        return None
    return {name: ((q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8), scale, zero)
            for name, (q, scale, zero) in parts.items()}


def _unpacked(parts: dict[str, tuple] | None) -> dict[str, tuple] | None:
    if parts is None:
        return None
    out = {}
    for name, (packed, scale, zero) in parts.items():
        q = torch.empty(packed.shape[0], 2 * packed.shape[1], dtype=torch.int32)
        q[:, 0::2], q[:, 1::2] = packed & 15, packed >> 4
        out[name] = (q, scale, zero)
    return out


def _choose(env: Env, bits: int, group: int, scales: str, rounding: str, is_linear: Callable[[Any], bool]
            ) -> tuple[dict | None, dict | None, dict]:
    label = f"qdraft:scales={scales},rounding={rounding}"
    prompts, ids, why = split_prompts(env, "train", PROMPTS)
    if not prompts:
        raise MethodError(f"{label}: calibrated on the task's train split, and {why}")
    env.log(f"{label}: calibrating the int{bits} copy on {len(prompts)} {env.cfg.task} train-split prompts")
    rows = awq.layer_inputs(env.model, prompts, is_linear, rows=GPTQ_ROWS if rounding == "gptq" else awq.ROWS)
    if bits == 8:
        nearest = (lambda w, g: quantize_int8(w), lambda q, s, g: q.float() * s[:, None])
    else:
        nearest = (quantize_int4, dequantize_int4)
    found_scales: dict[str, torch.Tensor] = {}
    found_parts: dict[str, tuple] = {}
    per_layer: dict[str, dict] = {}
    for name, m in env.model.named_modules():
        if name not in rows:
            continue
        g = int4_group(m.in_features, group)
        w, x = m.weight.detach().float(), rows[name]
        if scales == "awq":
            sub = x if x.shape[0] <= awq.ROWS else \
                x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))[:awq.ROWS]]
            found_scales[name], per_layer[name] = awq.search(w, sub, g, *nearest)
        if rounding == "gptq":
            s = found_scales.get(name)
            ws, xs = (w, x) if s is None else (w * s, x / s)
            found_parts[name] = gptq.round_int4(ws, gptq.hessian(xs), g)
            per_layer.setdefault(name, {})["gptq_error"] = _error(ws, xs, found_parts[name], g)
            per_layer[name]["nearest_error"] = _error(ws, xs, quantize_int4(ws, g), g)
    record = {"scales": scales, "rounding": rounding, "recipe": recipe(), "split": "train", "layers": len(rows),
              **{f"mean_{k}": round(sum(r[k] for r in per_layer.values()) / len(per_layer), 6)
                 for k in ("alpha", "error_minmax", "error", "gptq_error", "nearest_error")
                 if per_layer and all(k in r for r in per_layer.values())},
              "seen": task_registry.seen({env.cfg.task: ids}, "train")}
    return found_scales or None, found_parts or None, record


def _error(w: torch.Tensor, x: torch.Tensor, parts: tuple, group: int) -> float:
    """The layer's relative output error on its calibration rows with this int4 rounding."""
    ref = x @ w.T
    return float((x @ dequantize_int4(*parts, group).T - ref).pow(2).mean() / ref.pow(2).mean().clamp(min=1e-20))
