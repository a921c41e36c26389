"""`layerskip`: the target with some of its layers skipped as its own draft (Draft & Verify, Zhang et al. 2024;
SWIFT, Xia et al. 2025), no training, no second copy of the weights.

The draft is a view of the target (`skipping`) whose decoder runs only the kept layers, sharing their weights; it
keeps its own KV cache (a kept layer writes its keys at its own layer index, the skipped ones stay empty), rolled
back after every step and reused across steps, and drafts a chain as methods/sps.py does. With `cache=base` it
drafts on the target's own cache instead, as Draft & Verify and SWIFT do: each kept layer reads the target's keys and
values of its own index, so there is nothing to prefill (methods/sps.py `BaseCacheDrafter`). Layer 0 is always kept
(the positions of the cache are read from its keys). With `bits=4|8` the view is over the
quantized copy of methods/qdraft.py (both savings at once).

Which layers: SWIFT searches the skipped set on the task's own data; here a greedy search on the **tune** split
(methods/selfdraft.py's prompts, never evaluated ones): each middle layer's effect on the top-1 agreement with the
target when it alone is skipped, then skip sets growing from the least harmful, each measured for its agreement and
its cost per draft token on this machine, and the set whose predicted speed (geometric acceptance at that agreement,
best chain length, this machine's calibrated verify cost when one is cached) is highest. `skip=N` fixes the count.
The search (every count's agreement, cost and prediction, the chosen layers) is recorded in the result
(`resolved.<label>.search`) and cached per machine like the self-draft profile.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from ..hardware import calibration, shapes
from ..nets.quant import BITS
from .base import Method, MethodError, MethodSpec, Param
from .env import Env
from .search import Chain
from .selfdraft import FORWARD, agreement, cached, greedy_rows, lean_runner, profile, step_ms, tune_prompts
from .sps import CACHE, SHARPEN, STOP, BaseCacheDrafter, DraftModelDrafter, cache_inputs, check_stop

LENGTH_AUTO = 8           # length=auto: one replay at 8 draft tokens; the draft pays per drafted token

MAX_LENGTH = 8
VERSION = 1


def skipping(model: Any, skip: set[int]) -> Any:
    """A view of a transformers decoder-only model running only the layers not in `skip` (weights shared)."""
    inner = copy.copy(model.model)
    inner.__dict__ = dict(model.model.__dict__)
    inner._modules = dict(model.model._modules)
    inner._modules["layers"] = torch.nn.ModuleList(l for i, l in enumerate(model.model.layers) if i not in skip)
    view = copy.copy(model)
    view.__dict__ = dict(model.__dict__)
    view._modules = dict(model._modules)
    view._modules["model"] = inner
    return view


def _predicted(agree: float, cost_steps: float, cal: Any) -> tuple[float, int]:
    """(predicted speedup, best chain length) of a draft accepting each token with probability `agree`."""
    accept = [agree ** (i + 1) for i in range(MAX_LENGTH)]
    best = shapes.best_chain(accept, cal, "length", draft=lambda n: n * cost_steps)
    return best.speedup, int(best.params.get("length", 0))


def search(env: Env, base: Any, key: str, skip_count: int | None, view: Callable[[set[int]], Any] | None = None
           ) -> dict:
    """The skipped layers, chosen on the tune split (cached per machine, model, dtype, task and `key`); `view`
    makes the draft that skips a set (default `skipping`), so the search prices what will draft."""
    prompts, why = tune_prompts(env)
    if not prompts:
        raise MethodError(f"layerskip: the skipped layers are searched on the tune split, and {why}; run on a task "
                          f"with one (bpdbench tasks)")
    return cached(env, f"skip-{key}-{skip_count}-v{VERSION}", "layer search",
                  lambda: _search(env, base, prompts, skip_count, view or (lambda s: skipping(base, s))))


def _search(env: Env, base: Any, prompts: list[list[int]], skip_count: int | None,
            view_of: Callable[[set[int]], Any]) -> dict:
    n = len(base.model.layers)
    middle = list(range(1, n))
    ref = greedy_rows(env.model, prompts)
    alone = {i: agreement(ref, view_of({i}), prompts) for i in middle}
    order = sorted(middle, key=lambda i: -alone[i])
    cal = calibration.cached(env.cfg.model, env.cfg.dtype, env.cfg.device, env.cfg.threads) or \
        shapes.TableCost({2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4})
    target_ms = step_ms(env.model)
    counts = [skip_count] if skip_count is not None else list(range(1 + (n > 8), len(middle) + 1, 1 + (n > 8)))
    curve = []
    for k in counts:
        view = view_of(set(order[:k]))
        a, ms = agreement(ref, view, prompts), step_ms(view)
        speed, length = _predicted(a, ms / target_ms, cal)
        curve.append({"skip": k, "agreement": round(a, 4), "cost_steps": round(ms / target_ms, 3),
                      "predicted_speedup": round(speed, 3), "length": length})
    best = max(curve, key=lambda c: c["predicted_speedup"])
    out = {"skip": sorted(order[:best["skip"]]), "curve": curve, "alone": {str(i): round(alone[i], 4) for i in middle},
           "split": "tune", "positions": sum(len(p) for p in prompts),
           "verify_cost": "calibration" if not isinstance(cal, shapes.TableCost) else "assumed (no calibration)"}
    return out


def build(env: Env, method: Method) -> DraftModelDrafter:
    bits, length = method.get("bits", 0), method.get("length", 4)
    if bits:
        from .qdraft import GROUP, quantized
        base = quantized(env, bits, GROUP)
    else:
        base = env.model
    if not hasattr(base, "model") or not hasattr(base.model, "layers"):
        raise MethodError(f"{method.label}: the target is not a decoder with `model.layers`; layerskip needs one")
    n = len(base.model.layers)
    skip_count = method.get("skip")
    if n < 2 or (skip_count is not None and skip_count > n - 1):
        raise MethodError(f"{method.label}: skip={skip_count} but the target has {n} layers and keeps the first; "
                          f"pass skip <= {n - 1}")
    whole = lean_runner(env, base, method)
    lean = whole is not None
    view_of = (lambda s: whole.keeping([i for i in range(n) if i not in s])) if lean else \
        (lambda s: skipping(base, s))
    found = search(env, base, (f"int{bits}" if bits else "dense") + "-lean" * lean, skip_count, view_of)
    view = view_of(set(found["skip"]))
    prof = profile(env, view, f"skip{'-'.join(map(str, found['skip']))}-{bits}" + "-lean" * lean)
    stop = method.get("stop", 0.0)
    env.resolved[method.label] = {"bits": bits, "length": length, "skipped": found["skip"], "search": found,
                                  "forward": "lean" if lean else "transformers",
                                  **({"stop": stop} if stop else {}), "profile": prof}
    env.log(f"{method.label}: skips {len(found['skip'])} of {n} layers, agreement {prof['agreement']} on the tune "
            f"split, {prof['cost_steps']} steps per draft token")
    if method.get("cache", "own") == "base":
        env.resolved[method.label]["cache"] = "base"
        return BaseCacheDrafter(method.label, view, length, sharpen=method.get("sharpen", 1.0), stop=stop)
    return DraftModelDrafter(method.label, view, length, sharpen=method.get("sharpen", 1.0), stop=stop)


SPECS = [MethodSpec("layerskip", "self-speculation: the target with some layers skipped (chosen on the tune split "
                    "by a search the result records) drafts `length` tokens with its own KV cache, or on the target's "
                    "(cache=base; Draft & Verify, SWIFT)", build,
                    (Param("length", int, "draft length (auto: the length fastest on this machine)", low=1,
                           auto=True),
                     Param("skip", int, "how many layers to skip (default: the count the search predicts fastest)",
                           low=1),
                     Param("bits", int, "skip layers of the int4 or int8 copy (qdraft's) instead of the target's "
                           "own weights", choices=BITS),
                     SHARPEN, CACHE, FORWARD, STOP),
                    lambda model, cfg: [], artefacts=(), inputs=cache_inputs,
                    check=lambda m: check_stop(m, "length"),
                    shapes=Chain("length", longest=LENGTH_AUTO, drafts_per_token=True))]
