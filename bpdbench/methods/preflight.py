"""A run's methods checked before the model loads: the heads files their spellings read, and each method's own
preflight from its contract (a draft network's folder, type, shape).

Why: a heads config that disagrees with its weights, a --heads above the heads trained or a --k past the drafting
vocabulary used to surface as a state_dict or indexing traceback after seconds of loading. Here each is one line
naming the file or flag and the fix; a missing drafting shortlist is a recorded warning. The file-level checks
(truncated weights, empty model folders) are the artefact layer's (artefacts/checks.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .. import paths
from ..artefacts import checks, heads as heads_cache
from ..config import ConfigError, RunConfig
from ..nets import heads as heads_lib
from . import contract
from .base import Method, MethodError

Log = Callable[[str], None]


def check_heads(cfg: RunConfig, methods: list[Method] | None, log: Log = print) -> dict | None:
    """Heads files against their config, each method's heads= against their count, its k= against the drafting
    vocabulary, for the methods that read the run's heads with a head count of their own (cascade reads them too,
    with its split, checked when it builds). The methods are bound (methods/spelling.py: --heads and --k are their
    own values). Missing heads are left to the auto-train rule (methods.heads.resolve_heads)."""
    chosen = [m for m in methods or [] if contract.Kind.HEADS in contract.kinds(m) and m.takes("heads")]
    if not chosen:
        return None
    ks = [(m.label, m.option("k")) for m in chosen if m.takes("k")]
    n_heads = max(m.concrete("heads", 1) for m in chosen)        # auto: sized within what is there
    info, where = None, "the model's vocabulary"
    if cfg.heads_profile != "init" or cfg.heads_path:
        path = Path(cfg.heads_path) if cfg.heads_path else paths.heads_dir(cfg.model, cfg.heads_profile)
        if not (path / "config.json").exists():
            if cfg.heads_path:
                raise FileNotFoundError(f"no heads at {path} (expected config.json + {heads_lib.WEIGHTS}); "
                                        f"train them with `bpdbench train-heads --out {path}`")
            return None
        info = heads_lib.check(path)
        heads_cache.check_seal(path, None if cfg.heads_path else cfg.heads_profile)   # before the model loads
        if n_heads > info["num_heads"]:
            raise ConfigError(f"heads={n_heads} (--heads {n_heads}, or a method's heads=) but {path} has only "
                              f"{info['num_heads']} heads; pass --heads {info['num_heads']} or less")
        if info["shortlist_missing"]:
            log(f"warning: {path}/config.json names a {info['shortlist_named']}-token drafting shortlist but "
                f"shortlist.pt is missing: drafting over the full vocabulary (slower; recorded in config.json); "
                f"rebuild with `bpdbench train-heads`")
        width = info["shortlist_size"] or info["vocab"]
        where = f"the drafting shortlist of {path}" if info["shortlist_size"] else where
    else:
        width = None
    width = width or checks.model_vocab(cfg.model, cfg.dtype)
    for label, k in ks:
        if width and k > width:
            raise ConfigError(f"{label}: k={k} exceeds {where} ({width} tokens); pass --k {width} or less")
    return info


def check_methods(cfg: RunConfig, methods: list[Method] | None) -> None:
    """Every method's own preflight (its contract: draft networks check folder, type and shape parameters),
    before the model loads."""
    for m in methods or []:
        try:
            contract.preflight(m, cfg)
        except MethodError as e:
            raise ConfigError(str(e)) from None
