"""What cells need built before they start, once per (model, artefact): the model's dense cache per dtype, heads per
profile, n-gram and neural LMs per target model, and the draft networks and tables a method reads, the last built
by building that method once, as its first use would. What a method reads is its contract's typed artefact keys
(methods/contract.py: `artefacts`), one kind resolved one way here.

Why tasks of their own: a cell builds a missing artefact on first use (methods/artefacts.py, resolve_heads), and two
cells doing that at once would both train it and race on its files. As Ray tasks that run before the cells needing
them, each is built once, by one worker, with the same functions a first use calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..config import RunConfig
from ..methods import Method, contract
from ..methods.contract import Kind

RANK = {"model": 0, "heads": 1, "rescorer": 2, "network": 3, "method": 4}   # build order (the driver submits in it)
TRAIN_KEYS = ("networks", "profile", "model", "reports")
Log = Callable[[str], None]


@dataclass(frozen=True)
class Artefact:
    kind: str                   # model | heads | rescorer | method | network
    model: str
    detail: str                 # model: dtype; heads: profile; rescorer: its tag (ngram4, neural-m); method: the need;
                                # network: its cache name and profile (koala-adv-quick)
    needs: tuple[str, ...] = ()
    build_with: tuple | None = field(default=None, compare=False)   # method: (RunConfig, method label) to build;
                                                                    # network: (name, profile, reports folder)

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


def trainings(blocks: list, model: str, where: str, results: str) -> list[Artefact]:
    """A grid's [[train]] blocks: the draft networks its results read, trained before any cell, one after another
    (each takes both cores), and each report copied into the results (`reports`, default drafters/training), which
    `bpdbench tables` renders as drafters_training. Why in the grid: the trainings were a shell loop, the one recipe
    of a committed number that was not a grid; and the trainer no longer writes into results/ itself."""
    from ..config import ConfigError
    from ..train.network import PROFILES, check, split_saved
    out: list[Artefact] = []
    for i, block in enumerate(blocks, 1):
        at = f"{where}: [[train]] {i}"
        if not isinstance(block, dict):
            raise ConfigError(f"{where}: write [[train]] blocks (an array of tables), not [train]")
        unknown = sorted(set(block) - set(TRAIN_KEYS))
        if unknown:
            raise ConfigError(f"{at}: unknown key '{unknown[0]}'; valid: {', '.join(TRAIN_KEYS)}")
        names, profile = block.get("networks"), block.get("profile", "quick")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"{at}: networks must be a list of draft networks, e.g. [\"hydra\", \"koala-adv\"]")
        if profile not in PROFILES:
            raise ConfigError(f"{at}: profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        reports = block.get("reports", "drafters/training")
        if not isinstance(reports, str) or Path(reports).is_absolute() or ".." in Path(reports).parts:
            raise ConfigError(f"{at}: reports must be a folder inside the results, e.g. \"drafters/training\"")
        for name in names:
            base, adv = split_saved(name)
            try:
                saved = check(base, profile, adv)
            except ValueError as e:
                raise ConfigError(f"{at}: {e}") from None
            who = str(block.get("model", model))
            needs = (out[-1].id,) if out and out[-1].model == who else ()
            out.append(Artefact("network", who, f"{saved}-{profile}", needs,
                                (saved, profile, str(Path(results) / reports))))
    return out


def with_trainings(cells: list, artefacts: list[Artefact], networks: list[Artefact]) -> tuple[list, list[Artefact]]:
    """The grid's trainings before everything else: every cell waits for them (its results read them), and a method's
    first-use build of the same model waits too (it would otherwise train the same folder at the same time)."""
    if not networks:
        return cells, artefacts
    last = {a.model: a.id for a in networks}
    ids = tuple(a.id for a in networks)
    converted = {m: tuple(a.id for a in artefacts if a.kind == "model" and a.model == m) for m in last}
    networks = [replace(a, needs=a.needs + converted[a.model]) if not a.needs else a for a in networks]
    later = [replace(a, needs=a.needs + (last[a.model],)) if a.kind == "method" and a.model in last else a
             for a in artefacts]
    return [replace(c, needs=c.needs + ids) for c in cells], sorted(later + networks, key=lambda a: RANK[a.kind])


def collect(cells: list) -> list[Artefact]:
    """Every artefact of the plan once, models first, then heads, rescorers, and the methods' own needs, these one
    after another per model (one method's first use may build several of them, e.g. hierarchy's two tables)."""
    seen: dict[str, Artefact] = {}
    for c in cells:
        for a in artefacts_for(c, list(c.methods)):       # parsed once, when the grid was read
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
    if a.kind == "network":
        return _build_network(a, log)
    from .. import refine
    from ..methods.artefacts import ensure, ready
    spec = refine.RESCORERS[a.detail]
    if all(ok for _, ok in ready(spec, a.model)):
        return "present"
    ensure(spec, RunConfig(model=a.model, auto_train=auto_train), models.load_tokenizer(a.model), log)
    return "built"


def _build_network(a: Artefact, log: Log) -> str:
    """Train the network unless a sound one is cached, then copy its report into the results (the report of the
    network the grid's results read, whoever built it)."""
    from .. import paths
    from ..artefacts import builder
    from ..store import seal, write_atomic
    saved, profile, reports = a.build_with
    folder = paths.network_dir(a.model, saved, profile)
    done = "present"
    if not (folder / "report.json").is_file() or seal.problem(folder):
        builder("drafter")(saved, profile, a.model, log=log)
        done = "built"
    report = Path(reports) / f"{a.model.replace('/', '_')}-{saved}-{profile}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(report, (folder / "report.json").read_text())
    return done


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
