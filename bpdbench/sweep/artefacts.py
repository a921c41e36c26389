"""What cells need built before they start, once per (model, artefact): the model's dense cache per dtype, heads per
profile, n-gram and neural LMs per target model, and the trained drafters and tables a method reads, the last built
by building that method once, as its first use would. What a method reads is its contract's typed artefact keys
(methods/contract.py: `artefacts`), one kind resolved one way here.

Why tasks of their own: a cell builds a missing artefact on first use (methods/artefacts.py, resolve_heads), and two
cells doing that at once would both train it and race on its files. As Ray tasks that run before the cells needing
them, each is built once, by one worker, with the same functions a first use calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ..config import RunConfig
from ..methods import Method, contract
from ..methods.contract import Kind

RANK = {"model": 0, "heads": 1, "rescorer": 2, "method": 3}
Log = Callable[[str], None]


@dataclass(frozen=True)
class Artefact:
    kind: str                   # model | heads | rescorer | method
    model: str
    detail: str                 # model: dtype; heads: profile; rescorer: its tag (ngram4, neural-m); method: the need
    needs: tuple[str, ...] = ()
    build_with: tuple | None = field(default=None, compare=False)   # method: (RunConfig, method label) to build

    @property
    def id(self) -> str:
        prefix = "" if self.kind in ("rescorer", "method") else self.kind + "-"
        return f"{prefix}{self.detail}:{self.model}"


def artefacts_for(cell, methods: list[Method]) -> list[Artefact]:
    """The artefacts one cell needs, each with the artefacts it is itself built from."""
    from .. import models
    from ..train.heads import PROFILES
    from ..train.pacing import resolve_dtype
    cfg: RunConfig = cell.config
    out: dict[str, Artefact] = {}

    def model(name: str, dtype: str) -> list[str]:
        if name not in models.MODELS:       # a local folder or Hub id: nothing to convert
            return []
        a = Artefact("model", name, dtype)
        out.setdefault(a.id, a)
        return [a.id]

    def heads(profile: str) -> list[str]:
        if profile == "init" or cfg.heads_path:
            return []
        gen_dtype = resolve_dtype(PROFILES[profile].gen_dtype, log=lambda m: None)[0]   # auto: this machine's
        a = Artefact("heads", cfg.model, profile, tuple(model(cfg.model, gen_dtype)))
        out.setdefault(a.id, a)
        return [a.id]

    def rescorer(tag: str) -> None:
        needs = model(cfg.model, cfg.dtype) if tag.startswith("ngram") else \
            heads("quick") + model(cfg.model, "bfloat16")     # train_neural: the quick heads' shortlist, bf16 tok
        a = Artefact("rescorer", cfg.model, tag, tuple(needs))
        out.setdefault(a.id, a)

    model(cfg.model, cfg.dtype)
    keys = {m.label: contract.artefacts(m, cfg) for m in methods}
    for k in (k for ks in keys.values() for k in ks if k.kind is Kind.HEADS):   # heads first: what the rest waits on
        heads(k.name)
    for m in methods:
        own_heads = [h for k in keys[m.label] if k.kind is Kind.HEADS for h in heads(k.name)]
        for k in keys[m.label]:
            if k.kind is Kind.RESCORER:
                rescorer(k.name)
            elif k.kind is Kind.MODEL:
                model(k.name, cfg.dtype)
            elif k.kind in (Kind.DRAFTER, Kind.BUILT):       # built by building the method once
                a = Artefact("method", cfg.model, k.name, tuple(model(cfg.model, cfg.dtype) + own_heads),
                             (cfg, m.label))
                out.setdefault(a.id, a)
    return sorted(out.values(), key=lambda a: RANK[a.kind])


def collect(cells: list, methods_of) -> list[Artefact]:
    """Every artefact of the plan once, models first, then heads, rescorers, and the methods' own needs, these one
    after another per model (one method's first use may build several of them, e.g. hierarchy's two tables)."""
    seen: dict[str, Artefact] = {}
    for c in cells:
        for a in artefacts_for(c, methods_of(c.kind, c.config, c.options)):
            seen.setdefault(a.id, a)
    last: dict[str, str] = {}
    for key, a in list(seen.items()):
        if a.kind == "method":
            if a.model in last:
                seen[key] = replace(a, needs=a.needs + (last[a.model],))
            last[a.model] = a.id
    return sorted(seen.values(), key=lambda a: RANK[a.kind])


def build(a: Artefact, auto_train: bool, log: Log) -> str:
    """Build one artefact unless it is already there; returns what was done. The same functions a first use calls."""
    from .. import models, paths, train  # noqa: F401  (train: registers the artefact builders)
    if a.kind == "model":
        if (paths.dense_model_dir(a.model, a.detail) / "config.json").exists():
            return "present"
        log(f"converting {a.model} to a {a.detail} safetensors cache")
        models.load(a.model, a.detail)
        return "built"
    if a.kind == "heads":
        if (paths.heads_dir(a.model, a.detail) / "config.json").exists():
            return "present"
        from ..artefacts import builder
        from ..methods.heads_store import heads_need
        heads_need(a.model, a.detail).build(auto_train, lambda: builder("heads")(a.model, a.detail, log=log), log,
                                            paths.heads_dir(a.model, a.detail))
        return "built"
    if a.kind == "method":
        return _build_method(a, log)
    from .. import refine
    from ..methods.artefacts import ensure, ready
    spec = refine.RESCORERS[a.detail]
    if all(ok for _, ok in ready(spec, a.model)):
        return "present"
    ensure(spec, RunConfig(model=a.model, auto_train=auto_train), models.load_tokenizer(a.model), log)
    return "built"


def _build_method(a: Artefact, log: Log) -> str:
    """Build the method once on one example's session: its first use trains or builds what it needs."""
    from ..experiments.plan import prepare
    from ..experiments.session import open_session
    from ..methods import parse
    cfg, label = a.build_with
    method = parse(label)
    if all(ok for what, ok in method.spec.needs(cfg.model, cfg) if what == a.detail):
        return "present"
    log(f"{a.detail} for {a.model}: building it through {label}'s first use")
    plan = prepare(cfg.replace(limit=1, resume=False, out=None), "replay", [method], log=log)
    s = open_session(plan, log)
    s.drafter(method)
    return "built"
