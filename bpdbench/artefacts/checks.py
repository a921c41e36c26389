"""Artefact files checked against what their configs say, before anything loads.

Why: a truncated weights file, an empty model folder or a heads config that disagrees with its weights used to
surface as a state_dict or safetensors traceback naming neither the file nor the field, after seconds of loading.
Here each is one line naming the file and how to rebuild it. The checks that read a parsed method (its heads, its
own preflight) are methods/preflight.py, above this layer.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from .. import models, paths


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


def model_vocab(name: str, dtype: str) -> int | None:
    folder = paths.dense_model_dir(name, dtype) if name in models.MODELS else Path(name).expanduser()
    try:
        return int(json.loads((folder / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
