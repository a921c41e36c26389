"""Artefact files checked against what their configs say, before anything loads.

Why: a truncated weights file, an empty model folder or a heads config that disagrees with its weights used to
surface as a state_dict or safetensors traceback naming neither the file nor the field, after seconds of loading.
Here each is one line naming the file and how to rebuild it; a missing drafting shortlist is a recorded warning.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable

from .. import models, paths
from ..nets import heads as heads_lib
from ..config import ConfigError, RunConfig
from ..methods import Method, MethodError, contract
from . import heads as heads_cache

Log = Callable[[str], None]


def _check_safetensors(path: Path, rebuild: str) -> None:
    """A truncated safetensors file is detected from its header alone (no tensor is read)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n)) if 0 < n < size else None
    except (OSError, ValueError, struct.error):
        header = None
    if not isinstance(header, dict):
        raise models.ModelError(f"{path} is not a readable safetensors file (truncated or corrupt); {rebuild}")
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise models.ModelError(f"{path} is truncated ({size} bytes, its header needs {8 + n + end}); {rebuild}")


def _check_folder(folder: Path, what: str, rebuild: str) -> None:
    if not (folder / "config.json").is_file():
        raise models.ModelError(f"{what} {folder} has no config.json (empty or not a Hugging Face model folder); "
                                f"{rebuild}")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not list(folder.glob("*.bin")):
        raise models.ModelError(f"{what} {folder} has config.json but no weights (*.safetensors or *.bin); "
                                f"{rebuild}")
    for w in weights:
        _check_safetensors(w, rebuild)


def check_model_files(name: str, dtype: str) -> None:
    """A registered model's dense cache, or a local model folder, is complete (the Hub is not contacted)."""
    if name in models.MODELS:
        cached = paths.dense_model_dir(name, dtype)
        if (cached / "config.json").exists():
            _check_folder(cached, "model cache", f"delete {cached} and rerun to rebuild it from the GGUF package")
        return
    folder = Path(name).expanduser()
    if folder.exists() and not folder.is_dir():
        raise models.ModelError(f"--model {name} is a file; pass a model folder (config.json + weights + "
                                f"tokenizer) or a registered name: {', '.join(models.MODELS)}")
    if folder.is_dir():
        _check_folder(folder, "model folder", "pass a folder written by save_pretrained or a registered name")
    elif name.startswith((".", "/", "~")):
        raise models.ModelError(f"no model folder at {name}; pass an existing folder or a registered name: "
                                f"{', '.join(models.MODELS)}")
    elif "/" not in name:
        raise models.ModelError(f"unknown model '{name}'; valid: {', '.join(models.MODELS)}, a local HF "
                                f"directory or a Hub id like org/name")


def _model_vocab(name: str, dtype: str) -> int | None:
    folder = paths.dense_model_dir(name, dtype) if name in models.MODELS else Path(name).expanduser()
    try:
        return int(json.loads((folder / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_heads(cfg: RunConfig, methods: list[Method] | None, log: Log = print) -> dict | None:
    """Heads files against their config, --heads against their count, --k against the drafting vocabulary, for the
    methods that read the run's heads with a head count of their own (cascade reads them too, with its split,
    checked when it builds). Missing heads are left to the auto-train rule (methods.heads.resolve_heads)."""
    chosen = [m for m in methods if contract.Kind.HEADS in contract.kinds(m) and _has(m, "heads")] \
        if methods is not None else None
    if chosen is not None and not chosen:
        return None
    with_k = [m for m in chosen if _has(m, "k")] if chosen is not None else []
    ks = [(m.label, m.get("k", cfg.k)) for m in with_k] or ([("--k", cfg.k)] if chosen is None else [])
    n_heads = max([m.concrete("heads", cfg.heads) for m in chosen] if chosen else [cfg.heads])
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
            raise ConfigError(f"--heads {n_heads} but {path} has only {info['num_heads']} heads; pass --heads "
                              f"{info['num_heads']} or less")
        if info["shortlist_missing"]:
            log(f"warning: {path}/config.json names a {info['shortlist_named']}-token drafting shortlist but "
                f"shortlist.pt is missing: drafting over the full vocabulary (slower; recorded in config.json); "
                f"rebuild with `bpdbench train-heads`")
        width = info["shortlist_size"] or info["vocab"]
        where = f"the drafting shortlist of {path}" if info["shortlist_size"] else where
    else:
        width = None
    width = width or _model_vocab(cfg.model, cfg.dtype)
    for label, k in ks:
        if width and k > width:
            raise ConfigError(f"{label}: k={k} exceeds {where} ({width} tokens); pass --k {width} or less")
    return info


def _has(method: Method, param: str) -> bool:
    return param in {p.name for p in method.spec.params}


def check_drafters(cfg: RunConfig, methods: list[Method] | None) -> None:
    """Every method's own preflight (its contract: draft networks check folder, type and shape parameters),
    before the model loads."""
    for m in methods or []:
        try:
            contract.preflight(m, cfg)
        except MethodError as e:
            raise ConfigError(str(e)) from None
