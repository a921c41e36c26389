"""The greedy reference every method is certified against, cached by content hash.

A cached file is trusted only when it parses and its checksum matches; anything else is recomputed with a warning
naming the file, so a damaged cache is never mistaken for a bfloat16 near-tie (the certificate also re-derives the
reference up to the divergence and calls `recompute` when the file disagrees with greedy decoding).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable

import torch

from ..engine import Limits, generate


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _checksum(tokens: list[int]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


class GreedyReference:
    """Plain greedy outputs keyed by a content hash (model, dtype, device, versions, prompt, limits).

    Caching lets an `ar` run serve later runs of any method, and a miss is computed in the same run (which also
    gives the AR time for a like-for-like speed ratio). The directory is explicit configuration."""

    def __init__(self, model, model_id: str, dtype: str, device: str, directory: Path,
                 log: Callable[[str], None] = print):
        import transformers
        self.model, self.dir, self.log = model, Path(directory), log
        from ..hardware.kernels import backend_of
        key = [model_id, dtype, device, torch.__version__, transformers.__version__]
        if backend_of(model) != "torch":          # older references (torch's kernels) keep their keys
            key.append(backend_of(model))
        self.key_base = json.dumps(key)

    def path(self, prompt_ids: list[int], limits: Limits) -> Path:
        key = json.dumps([self.key_base, prompt_ids, limits.max_new_tokens, sorted(limits.eos_ids)])
        return self.dir / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def _read(self, path: Path, limits: Limits) -> list[int] | None:
        """The cached tokens, or None (with a warning) when the file is damaged."""
        try:
            data = json.loads(path.read_text())
            tokens = data["tokens"]
            ok = (isinstance(tokens, list) and all(isinstance(t, int) and t >= 0 for t in tokens)
                  and 0 < len(tokens) <= limits.max_new_tokens
                  and data.get("sha256", _checksum(tokens)) == _checksum(tokens))
            why = "" if ok else "tokens do not match its checksum or limits"
        except (OSError, ValueError, KeyError, TypeError) as e:
            ok, why = False, f"{type(e).__name__}"
        if ok:
            return tokens
        self.log(f"warning: greedy reference {path} is corrupt ({why}); recomputing it")
        return None

    def get(self, prompt_ids: list[int], limits: Limits) -> tuple[list[int], float | None]:
        """(tokens, seconds if computed now else None)."""
        path = self.path(prompt_ids, limits)
        if path.exists():
            tokens = self._read(path, limits)
            if tokens is not None:
                return tokens, None
        return self.recompute(prompt_ids, limits)

    def recompute(self, prompt_ids: list[int], limits: Limits) -> tuple[list[int], float]:
        """Decode greedily now and replace the cached file."""
        from .timing import timed
        seconds, gen = timed(lambda: generate(self.model, None, prompt_ids, limits), self.model.device)
        self.put(prompt_ids, limits, gen.tokens, seconds)
        return gen.tokens, seconds

    def put(self, prompt_ids: list[int], limits: Limits, tokens: list[int], seconds: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path(prompt_ids, limits)
        tmp = path.with_suffix(f".{time.time_ns()}.tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps({"tokens": tokens, "seconds": seconds, "sha256": _checksum(tokens)}))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
