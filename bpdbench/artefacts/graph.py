"""The artefact graph: what cells need built before they start, once per (model, artefact): the model's dense cache
per dtype, the distillation data heads and networks are trained on (only where one of them is missing), heads per
profile, n-gram and neural LMs per target model, the draft networks a grid trains or a method reads (one node
each, whoever asks), and the tables, histories and suffix indexes a method reads, built by building that method once,
as its first use would. Every node's kind is a kind of artefacts/cache.py, and each node says where it goes. What a
method reads is its contract's typed artefact keys (keys.py: `artefacts`, declared on its registry entry), one kind
resolved one way here; a parsed method is read through its spec only, so this layer imports nothing above it.

Why tasks of their own: a cell builds a missing artefact on first use (rescorers.py, heads.py: resolve_heads), and
two cells doing that at once would both train it and race on its files. As Ray tasks that run before the cells
needing them, each is built once, by one worker, with the same functions a first use calls: the builders the command
runtime registers (policy.py; `experiments.session.register_builders`), so this module never imports a trainer or
a session.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..config import RunConfig
from .keys import Kind, Method, artefacts as reads_of, requirements
from .heads import heads_data
from .policy import builder, network_need

Log = Callable[[str], None]
HeadsDtype = Callable[[str], str]     # a heads profile -> the dtype its training generates in, on this machine


@dataclass(frozen=True)
class Artefact:
    kind: str                   # a kind of artefacts/cache.py: model | distill | heads | rescorer | network |
                                # calibration, or one a method's first use builds (FIRST_USE: table, history, ...)
    model: str
    detail: str                 # model: dtype; heads: profile; rescorer: its tag (ngram4, neural-m); network: its
                                # cache name and profile (koala-adv-quick); calibration: dtype-device-threads; distill:
                                # the data budget (heads-quick, or quick for networks); a first-use kind: the need
    needs: tuple[str, ...] = ()
    build_with: tuple | None = field(default=None, compare=False)   # a first-use kind: (RunConfig, parsed Method,
                                                                    # its path, its minutes); network: (name, profile,
                                                                    # reports folder or None)

    @property
    def id(self) -> str:
        prefix = "" if self.kind == "rescorer" or self.kind in FIRST_USE else self.kind + "-"
        return f"{prefix}{self.detail}:{self.model}"

    @property
    def label(self) -> str:
        """The words `bpdbench methods` uses for it, the model being said once above."""
        if self.kind == "network":
            return f"{self.build_with[0]} drafter ({self.build_with[1]})"
        return {"model": f"{self.model} ({self.detail})", "heads": f"heads ({self.detail})",
                "distill": f"distillation data ({self.detail})",
                "calibration": f"cost curve ({self.detail})"}.get(self.kind, self.detail)


# The kinds a method's first use builds (its `needs` says which, with their paths): the graph builds one by building
# the method once, on one example, as a run's first use would (the registered "first use" builder).
FIRST_USE = ("table", "history", "suffix-index")


def artefacts_for(cell, methods: list[Method], heads_dtype: HeadsDtype) -> list[Artefact]:
    """The artefacts one cell needs, each with the artefacts it is itself built from. `heads_dtype` is the training
    profile's fact (the sweep passes it: decoding code never reads a trainer's profiles)."""
    out = nodes(cell.config, methods, heads_dtype)
    if cell.timed:                  # speed: its cost curve is measured before the cell, not on the cell's clock
        cfg = cell.config
        model = tuple(a.id for a in out if a.kind == "model" and a.model == cfg.model and a.detail == cfg.dtype)
        out.append(Artefact("calibration", cfg.model, f"{cfg.dtype}-{cfg.device}-{cell.threads}t", model,
                            (cfg.dtype, cfg.device, cell.threads)))
    return sorted(out, key=lambda a: RANK[a.kind])


def nodes(cfg: RunConfig, methods: list[Method], heads_dtype: HeadsDtype) -> list[Artefact]:
    """The artefacts a run of `methods` with `cfg` needs (a sweep cell's, or `bpdbench methods`' per method)."""
    from .. import models
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
        generates = tuple(model(cfg.model, heads_dtype(profile)))
        data = Artefact("distill", cfg.model, heads_data(profile), generates)
        out.setdefault(data.id, data)
        a = Artefact("heads", cfg.model, profile, generates + (data.id,))
        out.setdefault(a.id, a)
        return [a.id]

    def data(budget: str | None) -> list[str]:
        """A draft network's distillation data, as the grid's [[train]] networks have it (sweep/trainings.py)."""
        if budget is None:
            return []
        a = Artefact("distill", cfg.model, budget, tuple(model(cfg.model, cfg.dtype)))
        out.setdefault(a.id, a)
        return [a.id]

    def rescorer(tag: str) -> None:
        needs = model(cfg.model, cfg.dtype) if tag.startswith("ngram") else \
            heads("quick") + model(cfg.model, "bfloat16")     # train_neural: the quick heads' shortlist, bf16 tok
        a = Artefact("rescorer", cfg.model, tag, tuple(needs))
        out.setdefault(a.id, a)

    def network(name: str, needs: list[str]) -> None:
        """A draft network a method reads: the node a grid's [[train]] block makes for it (one id), trained before
        the cells that read it; its report copied only by a [[train]] block."""
        saved, profile = name.rsplit("-", 1)
        a = Artefact("network", cfg.model, name, tuple(needs), (saved, profile, None))
        out.setdefault(a.id, a)

    def first_use(m: Method, need: str, needs: list[str]) -> None:
        req = next((r for r in requirements(m, cfg) if r.what == need), None)
        if req is None or req.kind not in FIRST_USE:
            raise ValueError(f"{m.label} reads '{need}', which its needs do not list as an artefact its first use "
                             f"builds ({', '.join(FIRST_USE)}); give the requirement its kind (artefacts/keys.py)")
        a = Artefact(req.kind, cfg.model, need, tuple(needs), (cfg, m, req.path, req.minutes))
        out.setdefault(a.id, a)

    model(cfg.model, cfg.dtype)
    keys = {m.label: reads_of(m, cfg) for m in methods}
    for k in (k for ks in keys.values() for k in ks if k.kind is Kind.HEADS):   # heads first: what the rest waits on
        heads(k.name)
    for m in methods:
        own_heads = [h for k in keys[m.label] if k.kind is Kind.HEADS for h in heads(k.name)]
        for k in keys[m.label]:
            if k.kind is Kind.RESCORER:
                rescorer(k.name)
            elif k.kind is Kind.MODEL:
                model(k.name, cfg.dtype)
            elif k.kind is Kind.NETWORK:
                network(k.name, model(cfg.model, cfg.dtype) + own_heads + data(k.data))
            elif k.kind is Kind.BUILT:
                first_use(m, k.name, model(cfg.model, cfg.dtype) + own_heads)
    return sorted(out.values(), key=lambda a: RANK[a.kind])


def with_trainings(cells: list, artefacts: list[Artefact], networks: list[Artefact]) -> tuple[list, list[Artefact]]:
    """The grid's trainings before everything else: every cell waits for them (its results read them), and a method's
    first-use build of the same model waits too (it would otherwise train the same folder at the same time)."""
    if not networks:
        return cells, artefacts
    trained = {a.id for a in networks}
    artefacts = [a for a in artefacts if a.id not in trained]     # a method's network the grid trains: its node
    last = {a.model: a.id for a in networks if a.kind == "network"}
    ids = tuple(a.id for a in networks)
    converted = {m: tuple(a.id for a in artefacts if a.kind == "model" and a.model == m) for m in last}
    networks = [replace(a, needs=a.needs + converted[a.model]) if not a.needs else a for a in networks]
    later = [replace(a, needs=a.needs + (last[a.model],)) if a.kind in BUILT_BY_USE + ("calibration",)
             and a.model in last else a for a in artefacts]
    return [replace(c, needs=c.needs + ids) for c in cells], sorted(later + networks, key=lambda a: RANK[a.kind])


def collect(cells: list, heads_dtype: HeadsDtype) -> list[Artefact]:
    """Every artefact of the plan once, models first, then heads, rescorers, and what the methods' first uses build
    (their networks and tables), these one after another per model (one method's first use may build several of
    them, e.g. hierarchy's two tables)."""
    seen: dict[str, Artefact] = {}
    for c in cells:
        for a in artefacts_for(c, list(c.methods), heads_dtype):       # parsed once, when the grid was read
            seen.setdefault(a.id, a)
    last: dict[str, str] = {}
    for key, a in list(seen.items()):
        if a.kind in BUILT_BY_USE:
            if a.model in last:
                seen[key] = replace(a, needs=a.needs + (last[a.model],))
            last[a.model] = a.id
    builds = tuple(k for k, a in seen.items() if a.kind != "calibration")
    for key, a in list(seen.items()):       # a cost curve is timed: after every build, on a machine they left quiet
        if a.kind == "calibration":
            seen[key] = replace(a, needs=tuple(dict.fromkeys(a.needs + builds)))
    return sorted(seen.values(), key=lambda a: RANK[a.kind])


def without_unneeded_data(cells: list, artefacts: list[Artefact]) -> tuple[list, list[Artefact]]:
    """Distillation data is only ever an input: where every heads or network node built from it is there already,
    it is left out of the plan (and out of what cells and the cost curve wait for), not generated for nothing."""
    users: dict[str, list[Artefact]] = {}
    for a in artefacts:
        if a.kind != "calibration":
            for n in a.needs:
                users.setdefault(n, []).append(a)
    drop = {a.id for a in artefacts if a.kind == "distill" and all(KINDS[u.kind].present(u)
                                                                    for u in users.get(a.id, []))}
    if not drop:
        return cells, artefacts

    def strip(needs: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in needs if n not in drop)
    return ([replace(c, needs=strip(c.needs)) for c in cells],
            [replace(a, needs=strip(a.needs)) for a in artefacts if a.id not in drop])


@dataclass(frozen=True)
class KindSpec:
    """One kind of node, declared once: where it lives, whether it is there, how it is built, what that costs and
    the command that builds it alone. `build`, the build order and the sweep's dry run read this table, so a kind is
    never resolved two ways."""
    rank: int                                       # build order: the driver submits in it
    path: Callable[[Artefact], Path | None]         # its file or folder in the cache (None: several, the need's own)
    present: Callable[[Artefact], bool]
    make: Callable[[Artefact, bool, Log], None]     # (artefact, auto_train, log): the function a first use calls
    minutes: Callable[[Artefact], float | None]     # expected minutes on 2 CPU cores (None: the first use says)
    command: Callable[[Artefact], str]              # what builds it alone
    finish: Callable[[Artefact], None] = lambda a: None     # after it is there, built or not
    gpus: Callable[[Artefact], float] = lambda a: 0         # GPUs its task asks for (Ray hides the rest from it)


def _model_path(a: Artefact) -> Path:
    from .. import paths
    return paths.dense_model_dir(a.model, a.detail)


def _make_model(a: Artefact, auto_train: bool, log: Log) -> None:
    from .. import models
    log(f"converting {a.model} to a {a.detail} safetensors cache")
    models.load(a.model, a.detail)


DISTILL_FILE = "data.pt"       # what train/distill.py writes last into a dataset's folder (its FILE)


def _distill_path(a: Artefact) -> Path:
    from .. import paths
    return paths.distill_dir(a.model, a.detail)


def _sealed(folder: Path, last_written: str) -> bool:
    """A folder an atomic build finished: its last file is there and its seal finds nothing wrong."""
    from ..store import seal
    return (folder / last_written).is_file() and not seal.problem(folder)


PREFILL_FILE = "meta.json"     # teacher-forced prefill data (train/prefill.py): shards, rank and this, sealed whole


def _distill_present(a: Artefact) -> bool:
    return _sealed(_distill_path(a), DISTILL_FILE) or _sealed(_distill_path(a), PREFILL_FILE)


def _make_distill(a: Artefact, auto_train: bool, log: Log) -> None:
    builder("distill")(a.model, a.detail, log=log)


def _distill_command(a: Artefact) -> str:     # no minutes of its own: its reader's count them
    if a.detail.startswith("heads-"):
        return f"bpdbench train-heads --profile {a.detail[len('heads-'):]}, its first step, in its minutes"
    return f"bpdbench distill-data --profile {a.detail}; in the minutes of the first network that reads it"


def _heads_path(a: Artefact) -> Path:
    from .. import paths
    return paths.heads_dir(a.model, a.detail)


def _make_heads(a: Artefact, auto_train: bool, log: Log) -> None:
    _heads_need(a).build(auto_train, lambda: builder("heads")(a.model, a.detail, log=log), log, _heads_path(a))


def _rescorer(a: Artefact):
    from .. import refine
    return refine.RESCORERS[a.detail]


def _make_rescorer(a: Artefact, auto_train: bool, log: Log) -> None:
    from .. import models
    from .rescorers import ensure
    ensure(_rescorer(a), RunConfig(model=a.model, auto_train=auto_train), models.load_tokenizer(a.model), log)


def _network_path(a: Artefact) -> Path:
    from .. import paths
    saved, profile, _ = a.build_with
    return paths.network_dir(a.model, saved, profile)


def _network_present(a: Artefact) -> bool:
    return _sealed(_network_path(a), "report.json")


def _make_network(a: Artefact, auto_train: bool, log: Log) -> None:
    saved, profile, _ = a.build_with
    builder("network")(saved, profile, a.model, log=log)


def _copy_report(a: Artefact) -> None:
    """The report of the network the grid's results read, whoever built it, copied into the results."""
    from ..store import write_atomic
    saved, profile, reports = a.build_with
    if reports is None:             # a network a method reads and no [[train]] block names: nothing to copy
        return
    report = Path(reports) / f"{a.model.replace('/', '_')}-{saved}-{profile}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    import json
    from ..paths import portable_tree         # the results record no machine's paths (paths.portable)
    write_atomic(report, json.dumps(portable_tree(json.loads((_network_path(a) / "report.json").read_text())),
                                    indent=2))


def _first_use_present(a: Artefact) -> bool:
    cfg, method = a.build_with[:2]
    return all(r.ok for r in requirements(method, cfg) if r.what == a.detail)


def _make_first_use(a: Artefact, auto_train: bool, log: Log) -> None:
    """Build the method once on one example's session (the registered "first use" builder): its first use builds what
    it needs."""
    cfg, method = a.build_with[:2]
    builder("first use")(cfg, method, a.detail, log)


def _heads_need(a: Artefact):
    from .heads import heads_need
    return heads_need(a.model, a.detail)


def _rescorer_need(a: Artefact):
    from .rescorers import need
    return need(_rescorer(a), a.model)


def _calibration_present(a: Artefact) -> bool:
    from ..hardware import calibration
    dtype, device, threads = a.build_with
    cal = calibration.cached(a.model, dtype, device, threads)
    return cal is not None and not cal.busy         # a curve measured beside other work is measured again


def _make_calibration(a: Artefact, auto_train: bool, log: Log) -> None:
    """Measured alone: the driver gives this task the cores of the grid's widest cell, as it does a timed cell."""
    from .. import models
    from ..hardware import calibration
    dtype, device, threads = a.build_with
    calibration.ensure(a.model, dtype, device, threads, log=log,
                       loader=lambda dt, dev: models.load(a.model, dt, dev)[0])


def _calibration_path(a: Artefact) -> Path:
    from ..hardware import calibration
    dtype, device, threads = a.build_with
    return calibration.cache_path(a.model, dtype, device, threads)


KINDS: dict[str, KindSpec] = {
    "model": KindSpec(0, _model_path, lambda a: (_model_path(a) / "config.json").exists(), _make_model,
                      lambda a: 1, lambda a: f"any command on {a.model} (converted from its GGUF package on first load)"),
    "distill": KindSpec(1, _distill_path, _distill_present, _make_distill, lambda a: None, _distill_command),
    "heads": KindSpec(2, _heads_path, lambda a: (_heads_path(a) / "config.json").exists(), _make_heads,
                      lambda a: _heads_need(a).minutes, lambda a: _heads_need(a).command),
    "rescorer": KindSpec(3, lambda a: next((r.path for r in _ready(a)), None), lambda a: all(r.ok for r in _ready(a)),
                         _make_rescorer,
                         lambda a: _rescorer_need(a).minutes, lambda a: _rescorer_need(a).command),
    "network": KindSpec(4, _network_path, _network_present, _make_network,
                        lambda a: network_need(a.model, *a.build_with[:2]).minutes,
                        lambda a: network_need(a.model, *a.build_with[:2]).command, _copy_report),
    **{kind: KindSpec(5, lambda a: a.build_with[2], _first_use_present, _make_first_use, lambda a: a.build_with[3],
                      lambda a: f"any command with --methods {a.build_with[1].label} (built on its first use)")
       for kind in FIRST_USE},
    "calibration": KindSpec(6, _calibration_path, _calibration_present, _make_calibration, lambda a: 1.5,
                            lambda a: f"bpdbench calibrate --model {a.model} --dtype {a.build_with[0]} --device "
                                      f"{a.build_with[1]} --threads {a.build_with[2]}",
                            gpus=lambda a: 1 if str(a.build_with[1]).startswith("cuda") else 0),
}
RANK = {kind: spec.rank for kind, spec in KINDS.items()}
BUILT_BY_USE = FIRST_USE + ("network",)     # built one after another per model: each takes the cores


def _ready(a: Artefact) -> list:
    from .rescorers import ready
    return ready(_rescorer(a), a.model)


def describe(a: Artefact, present: bool | None = None) -> str:
    """One line for the dry run: there, or what building it costs and the command that builds it alone. `present`:
    the caller's own check of it, so a sealed folder is not hashed again."""
    spec = KINDS[a.kind]
    if spec.present(a) if present is None else present:
        return "present"
    minutes, where = spec.minutes(a), spec.path(a)
    return (f"to build{f', about {minutes:g} min' if minutes is not None else ''} ({spec.command(a)})"
            + (f" into {where}" if where is not None else ""))


def build(a: Artefact, auto_train: bool, log: Log) -> str:
    """Build one artefact unless it is already there; returns what was done. The same functions a first use calls,
    registered by the command runtime before any build."""
    spec = KINDS[a.kind]
    done = "present"
    if not spec.present(a):
        spec.make(a, auto_train, log)
        done = "built"
    spec.finish(a)
    return done
