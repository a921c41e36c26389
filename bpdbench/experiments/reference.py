"""The greedy reference every method is certified against, cached by content hash."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from ..engine import Limits, generate


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class GreedyReference:
    """Plain greedy outputs keyed by a content hash (model, dtype, device, versions, prompt, limits).

    Caching lets an `ar` run serve later runs of any method, and a miss is computed in the same run (which also
    gives the AR time for a like-for-like speed ratio). The directory is explicit configuration."""

    def __init__(self, model, model_id: str, dtype: str, device: str, directory: Path):
        import transformers
        self.model, self.dir = model, Path(directory)
        self.key_base = json.dumps([model_id, dtype, device, torch.__version__, transformers.__version__])

    def _path(self, prompt_ids: list[int], limits: Limits) -> Path:
        key = json.dumps([self.key_base, prompt_ids, limits.max_new_tokens, sorted(limits.eos_ids)])
        return self.dir / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def get(self, prompt_ids: list[int], limits: Limits) -> tuple[list[int], float | None]:
        """(tokens, seconds if computed now else None)."""
        path = self._path(prompt_ids, limits)
        if path.exists():
            try:
                return json.loads(path.read_text())["tokens"], None
            except (ValueError, KeyError):
                path.unlink()          # a torn or foreign file: recompute rather than certify against it
        from .timing import timed
        seconds, gen = timed(lambda: generate(self.model, None, prompt_ids, limits), self.model.device)
        self.put(prompt_ids, limits, gen.tokens, seconds)
        return gen.tokens, seconds

    def put(self, prompt_ids: list[int], limits: Limits, tokens: list[int], seconds: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self._path(prompt_ids, limits)
        tmp = path.with_suffix(f".{time.time_ns()}.tmp")
        tmp.write_text(json.dumps({"tokens": tokens, "seconds": seconds}))
        tmp.rename(path)
