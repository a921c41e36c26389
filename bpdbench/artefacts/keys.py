"""The typed keys of what a method reads, and the shape of the build environment a table is built in.

Why here, below methods/: a method declares its artefacts on its registry entry (`MethodSpec.artefacts`, a tuple
of `Reads`), and the artefact layer resolves them (graph.py). With the key types in methods/, the artefact layer had
to import the layer above it to read a declaration; now methods/contract.py imports them from here, and
`tests/unit/test_layers.py` ranks artefacts/ below methods/ with no exception. A parsed method is read by duck
typing only: its `spec.artefacts` (and `spec.needs` for what its first use builds).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Protocol

from ..config import RunConfig

# A parsed method (methods/base.py: Method), read here through its `spec` only.
Method = Any
Log = Callable[[str], None]


class Kind(Enum):
    """Kinds of artefact, each resolved one way by the artefact graph (graph.py)."""
    MODEL = "model"           # a registered model's dense cache at the run's dtype (sps's draft model)
    HEADS = "heads"           # the blockwise heads of a profile (bpdbench train-heads)
    RESCORER = "rescorer"     # a refine stage's artefact, by tag (ngram4, neural-m)
    NETWORK = "network"       # a trained draft network, built by the method's first use (bpdbench train-network)
    BUILT = "built"           # anything else the method's first use builds (lookup tables, suffix indexes)


class Requirement(NamedTuple):
    """One thing a method needs, and whether it is there (a method's `needs`, what `bpdbench methods` shows). An
    artefact has its kind (artefacts/cache.py) and its path, so the graph builds it as a node of that kind, says
    where it goes and checks it without building the method; a prerequisite of the machine (a library, a kernel) has
    no kind: nothing here builds it."""
    what: str                        # in words, e.g. "corpus suffix index"
    ok: bool
    kind: str | None = None          # its kind of artefact; None: a prerequisite
    path: Path | None = None         # where it is, or will be built
    minutes: float | None = None     # expected minutes to build it on 2 CPU cores (None: its first use says)


@dataclass(frozen=True)
class ArtefactKey:
    """One artefact: its kind and its name (a heads profile, a rescorer tag, a model, or for NETWORK and BUILT the
    need as `bpdbench methods` prints it, which is what the sweep checks readiness by). `data`: the distillation
    budget a NETWORK is trained on, when its first use trains it (a node of its own in the graph)."""
    kind: Kind
    name: str
    data: str | None = None


@dataclass(frozen=True)
class Reads:
    """A method reads artefacts of `kind`; `names(method, cfg)` names them for one spelling and run."""
    kind: Kind
    names: Callable[[Method, RunConfig], Iterable[str]]
    data: Callable[[Method, RunConfig], str | None] | None = None     # NETWORK: its distillation budget


def inner(method: Method) -> tuple[Method, ...]:
    """The methods it drives inside it (sam's fallback, the hybrid's sources: MethodSpec.inner), parsed with it."""
    return method.spec.inner(method) if method.spec.inner is not None else ()


def artefacts(method: Method, cfg: RunConfig) -> tuple[ArtefactKey, ...]:
    """The artefacts a method reads in this run, in declaration order, then those of the methods inside it (the
    graph builds a fallback's draft network too)."""
    own = tuple(ArtefactKey(r.kind, str(name), r.data(method, cfg) if r.data else None)
                for r in method.spec.artefacts for name in r.names(method, cfg))
    nested = tuple(k for m in inner(method) for k in artefacts(m, cfg))
    return tuple(dict.fromkeys(own + nested))


def requirements(method: Method, cfg: RunConfig) -> list[Requirement]:
    """What a method's `needs` lists for the run's model, then what the methods inside it need (a fallback's tables
    are built by the outer method's first use, which builds its fallback)."""
    own = list(method.spec.needs(cfg.model, cfg)) if method.spec.needs else []
    return own + [r for m in inner(method) for r in requirements(m, cfg)]


def kinds(method: Method) -> frozenset[Kind]:
    """The kinds of artefact a method reads, whatever its values (the tables pick draft networks by it)."""
    return frozenset(r.kind for r in method.spec.artefacts).union(*(kinds(m) for m in inner(method)))


class BuildEnv(Protocol):
    """What a table build reads of a method's build environment (methods/env.py: Env has these and more)."""
    model: Any
    tok: Any
    cfg: RunConfig
    log: Log
