"""What methods are built from: the loaded target model, its tokenizer, the run's config, and lazily the heads.

The experiment session creates one Env per command and hands it to every method's builder, so methods never load
models or read global state themselves; what they resolve (heads, alpha, artefacts) is written back into
`resolved` and lands in the result's config.json.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import RunConfig
from ..engine import Limits
from ..artefacts.heads import resolve_heads

Log = Callable[[str], None]


@dataclass
class Env:
    model: Any
    tok: Any
    cfg: RunConfig
    limits: Limits
    log: Log = print
    resolved: dict = field(default_factory=dict)      # per method label: what was resolved (alpha, tree, ...)
    _heads: Any = None
    cache: dict = field(default_factory=dict)         # loaded artefacts shared by the session's methods (drafters)
    builder: Callable[[Any], Any] | None = None       # the session's method -> drafter (resolves `auto` first)

    def __post_init__(self) -> None:
        """Methods build in the dtype the model runs in: an unresolved `auto` (a config that skipped validate) is
        read off the loaded model, never guessed again."""
        if self.cfg.dtype == "auto":
            self.cfg = self.cfg.replace(dtype=str(getattr(self.model, "dtype", "float32")).replace("torch.", ""))

    def heads(self, count: int | None = None):
        """(Heads, metadata) for the run's heads option: loaded, or trained on first use (as `make demo` does).
        `count`: the heads a method uses (untrained `init` heads are made that many, at least)."""
        if self._heads is None or (self._heads[1].get("profile") == "init" and count
                                   and count > self._heads[0].num_heads):
            self._heads = resolve_heads(self.cfg, self.model, self.tok, self.log, count)
        return self._heads

    def build(self, method) -> Any:
        """Another method's drafter from inside a method's build (sam's fallback): through the session when there
        is one, so an inner `auto` is sized for this machine exactly as at top level (the session binds the run's
        options); without one, a method that did not come through a plan gets them bound here (spelling.bind)."""
        if self.builder is not None:
            return self.builder(method)
        from .spelling import bind
        method = bind(method, self.cfg)
        if method.auto:
            from .base import MethodError
            raise MethodError(f"{method.label}: auto parameters need an experiment session; pass concrete values")
        return method.spec.build(self, method)

    @property
    def heads_meta(self) -> dict | None:
        return self._heads[1] if self._heads is not None else None
