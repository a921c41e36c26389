"""What a method is: a registry entry (name, typed parameters, what it needs) that builds a drafter.

One grammar for every command: `name[:key=value,...]`, e.g. `bpd`, `bpd:heads=4,threshold=0.4`, `oracle:k=16`,
`pld:tokens=10`. Parameters a spelling does not give take the run's options (`--heads`, `--k`,
`--draft-threshold`, `--alpha`); the canonical label names only what was given, so `bpd:heads=8` and `bpd` with
`--heads 8` are the same method and one label means one thing everywhere.

Shape parameters declared with `auto=True` also take the literal `auto` (`bpd:heads=auto`, `pld:tokens=auto`): the
session resolves them per machine before building (experiments/autoshape.py) into a method with concrete values
that keeps the `auto` label, so results of one spelling stay comparable across machines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

from .contract import BUILT_ON_FIRST_USE, Input, Reads, Requirement


AUTO = "auto"


class MethodError(ValueError):
    """A method spelling that cannot be used: one line naming what is wrong and what is valid."""


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    help: str
    low: float | None = None      # inclusive lower bound for numbers
    high: float | None = None     # exclusive upper bound for numbers
    choices: tuple[str, ...] = ()
    auto: bool = False            # also takes `auto`: the shape that is fastest on this machine (autoshape.py)
    words: tuple[str, ...] = ()   # words a number parameter also takes (tree=dynamic)
    flag: str | None = None       # the run-wide option (a RunConfig field: --heads, --k, ...) that gives it where
    #                               the spelling does not (methods/spelling.py: bind)

    def parse(self, method: str, raw: str) -> Any:
        if self.auto and raw == AUTO:
            return AUTO
        if raw in self.words:
            return raw
        try:
            value = self.type(raw)
        except MethodError:               # a nested method spelling (sam's fallback) says itself what is wrong
            raise
        except ValueError:
            also = "".join(f" or {w}" for w in (AUTO,) * self.auto + self.words)
            raise MethodError(f"{method}: {self.name}={raw!r} is not a {self.type.__name__}{also} "
                              f"({self.help})") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise MethodError(f"{method}: {self.name} must be a finite number, got {raw}")
        if self.low is not None and value < self.low:
            raise MethodError(f"{method}: {self.name} must be >= {self.low:g}, got {raw}")
        if self.high is not None and value >= self.high:
            raise MethodError(f"{method}: {self.name} must be < {self.high:g}, got {raw}")
        if self.choices and value not in self.choices:
            raise MethodError(f"{method}: {self.name} must be one of {', '.join(map(str, self.choices))}, got {raw}")
        return value


HEADS = Param("heads", int, "use the first N heads (default: --heads)", low=1, flag="heads")
THRESHOLD = Param("threshold", float, "verify draft tokens only while the head's top-1 probability is >= this "
                  "(default: --draft-threshold)", low=0.0, high=1.0, flag="draft_threshold")
K = Param("k", int, "lattice width (top-k per head; default: --k)", low=1, flag="k")
ALPHA = Param("alpha", float, "weight of the language model against the heads (default: --alpha, else tuned)",
              low=0.0, flag="alpha")


@dataclass(frozen=True)
class MethodSpec:
    """A registered method. `build(env, params)` returns a Drafter; an `external` method instead returns a whole
    decoder (transformers' or llama.cpp's own generate loops), which can be timed but not replayed or counted step
    by step.

    `inputs`, `artefacts`, `preflight` and `shapes` are the method's contract (methods/contract.py), the only place
    its capabilities are said: `inputs`, what its drafter takes from the loop besides reset and observe (a set, or a
    function of the spelling for a wrapper, whose inner method's inputs it adds); `artefacts`, what it reads, as
    typed keys (by default: what `needs` lists, built by building the method once); `preflight(method, cfg)`, its
    checks before the model loads; `shapes`, how `auto` sizes it (methods/search.py), None when no parameter takes
    `auto`.

    `baseline`: the label whose tokens certify the method's in `speed`: `ar` (this engine's greedy) for every method
    of this engine; another engine's own greedy for that engine's speculative modes (llama.cpp's prompt lookup
    against `llamacpp`, methods/llamacpp.py), since two engines' kernels round differently and their greedy outputs
    need not agree."""
    name: str
    description: str
    build: Callable[..., Any]
    params: tuple[Param, ...] = ()
    needs: Callable[..., list[Requirement]] | None = None   # what it needs, and whether it is there, given
                                                             # (model name, cfg)
    external: bool = False
    fixed: dict = field(default_factory=dict)                   # values implied by the name (aliases)
    check: Callable[["Method"], None] | None = None              # parameters checked together (MethodError)
    inputs: frozenset[Input] | Callable[["Method"], frozenset[Input]] = frozenset()
    artefacts: tuple[Reads, ...] = (BUILT_ON_FIRST_USE,)
    preflight: Callable[["Method", Any], None] | None = None     # (method, RunConfig): MethodError before loading
    shapes: Any = None                                           # a methods/search.py Search (which imports this)
    baseline: str = "ar"                                         # the label whose tokens certify it (speed)
    # the methods it drives inside it (sam's fallback, the hybrid's sources), parsed with its own spelling: their
    # inputs and artefacts are part of its contract (contract.inner, artefacts/keys.py)
    inner: Callable[["Method"], tuple["Method", ...]] | None = None

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        valid = ", ".join(p.name for p in self.params) or "none"
        raise MethodError(f"{self.name}: unknown parameter '{name}'; valid: {valid}")


@dataclass(frozen=True)
class Method:
    spec: MethodSpec
    params: dict
    spelled: str = ""             # a resolved `auto` method keeps the label it was asked for (autoshape.py)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def auto(self) -> list[str]:
        """The parameters given as `auto` (shape parameters to resolve for this machine)."""
        return [p.name for p in self.spec.params if p.auto and self.params.get(p.name) == AUTO]

    def resolved(self, values: dict) -> "Method":
        """The same method with concrete values for its `auto` parameters, under its original label."""
        return Method(self.spec, {**self.params, **values}, self.label)

    def concrete(self, name: str, default: Any = None) -> Any:
        """A parameter's value, `default` where it is not given or still `auto` (checks before resolution)."""
        v = self.params.get(name, default)
        return default if v == AUTO else v

    @property
    def label(self) -> str:
        """The canonical spelling: parameters in declaration order, only those given."""
        if self.spelled:
            return self.spelled
        given = [f"{p.name}={_fmt(self.params[p.name])}" for p in self.spec.params if p.name in self.params]
        return self.spec.name + (":" + ",".join(given) if given else "")

    def get(self, name: str, default: Any = None) -> Any:
        return self.params.get(name, default)

    def takes(self, name: str) -> bool:
        """Whether its method has parameter `name` (bpd takes no k: it drafts the top-1 path)."""
        return any(p.name == name for p in self.spec.params)

    def option(self, name: str) -> Any:
        """A parameter a run option stands for (`Param.flag`: heads, k, threshold): its value, spelled or bound
        from the run's option where that differs from its default (methods/spelling.py: bind), else the option's
        default."""
        if name in self.params:
            return self.params[name]
        return option_default(self.spec.param(name).flag)


@lru_cache(maxsize=None)
def option_default(flag: str) -> Any:
    """A run option's default (RunConfig's), what a parameter that stands for it means where nothing sets it."""
    from ..config import RunConfig
    return getattr(RunConfig(), flag)


def _fmt(v: Any) -> str:
    if isinstance(v, Method):
        return nested_spelling(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def nested_spelling(method: Method) -> str:
    """How a method given as another's parameter is spelled inside that one's label: `hydra;tree=4` (';' between
    its parameters, since ',' separates the outer method's)."""
    return method.label.replace(":", ";", 1).replace(",", ";")


def inner_text(raw: str) -> str:
    """`hydra;tree=4;k=2` (or `hydra:tree=4;k=2`) -> `hydra:tree=4,k=2`: a nested spelling as a method's own, read
    once, when the outer spelling is parsed."""
    text = raw if ":" in raw else raw.replace(";", ":", 1)
    return text.replace(";", ",")
